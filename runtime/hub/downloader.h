// runtime/hub/downloader.h — fetches blobs into a repo's cache folder, several at once (curl multi). Each file lands
// in blobs/ETAG.incomplete, resumes from what an earlier run left there (HTTP Range), is checked against its ETag
// (sha256 for LFS files, git blob sha1 otherwise) and only then renamed to blobs/ETAG and linked from the snapshot.
// A file that fails never reaches the snapshot; a file that succeeds stays, whatever happens to the others. Holds
// the hub's per-blob lock (.locks/models--ORG--NAME/ETAG.lock) while it writes a blob, as the other clients do.
#pragma once

#include <string>
#include <vector>

#include "runtime/hub/hub_cache.h"
#include "runtime/hub/hub_http.h"

namespace tierlm::hub {

struct BlobTask {
  std::string filename;  // repo path, linked as snapshots/COMMIT/filename
  FileMetadata meta;
};

struct DownloadReport {
  uint64_t bytes_fetched = 0;  // over the network in this run
  std::vector<std::string> errors;  // one message per failed file (empty: all done)
};

// Downloads every task's blob (skipping blobs already present) and links it into snapshots/commit.
DownloadReport download_blobs(const HubSettings& settings, const RepoCache& cache, const std::string& repo,
                              const std::string& commit, const std::vector<BlobTask>& tasks, int parallel);

}  // namespace tierlm::hub
