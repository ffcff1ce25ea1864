// runtime/hub/hub_cache.h — the Hugging Face cache layout on disk, shared with Python's huggingface_hub and JS's
// @huggingface/hub: HF_HUB_CACHE (or HF_HOME/hub, or $XDG_CACHE_HOME/huggingface/hub, or ~/.cache/huggingface/hub)
// / models--ORG--NAME / {blobs/ETAG, refs/REVISION (a commit hash), snapshots/COMMIT/FILE -> ../../blobs/ETAG}.
// Owns paths, refs, and the relative snapshot symlinks; it never downloads and never writes a blob itself (the
// downloader renames a checked file into place).
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace tierlm::hub {

// The hub cache root from the environment, as the Python and JS clients compute it.
std::filesystem::path cache_root_from_env();

class RepoCache {
 public:
  RepoCache(std::filesystem::path root, const std::string& repo);

  const std::filesystem::path& root() const { return root_; }
  const std::filesystem::path& folder() const { return folder_; }
  std::filesystem::path blob_path(const std::string& etag) const { return folder_ / "blobs" / etag; }
  std::filesystem::path incomplete_path(const std::string& etag) const {
    return folder_ / "blobs" / (etag + ".incomplete");
  }
  std::filesystem::path lock_path(const std::string& etag) const;
  std::filesystem::path snapshot_dir(const std::string& commit) const { return folder_ / "snapshots" / commit; }

  // The commit a revision points to: the revision itself when it is a commit hash with a snapshot folder, else the
  // content of refs/REVISION. Nothing when the cache does not know it.
  std::optional<std::string> commit_for(const std::string& revision) const;
  // refs/REVISION = commit (written atomically, no trailing newline, as the other clients write it).
  void write_ref(const std::string& revision, const std::string& commit) const;
  // snapshots/COMMIT/FILE -> a relative link to blobs/ETAG (replacing an older link of that name atomically).
  void link_snapshot_file(const std::string& commit, const std::string& filename, const std::string& etag) const;
  // True when snapshots/COMMIT/FILE resolves to an existing regular file.
  bool has_snapshot_file(const std::string& commit, const std::string& filename) const;

 private:
  std::filesystem::path root_;
  std::filesystem::path folder_;
  std::string folder_name_;
};

}  // namespace tierlm::hub
