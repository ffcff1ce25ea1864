// runtime/hub/pull.h — a hub id to a local model folder: the snapshot folder of the Hugging Face cache, with the
// files the model needs fetched first when they are missing. What Python or JS clients already fetched is used as
// it is; with HF_HUB_OFFLINE the network is never touched. This is the only entry point the CLI needs.
#pragma once

#include <string>
#include <vector>

#include "runtime/hub/file_selection.h"
#include "runtime/hub/hub_http.h"
#include "runtime/hub/hub_id.h"

namespace tierlm::hub {

struct PullOptions {
  FileFilter filter;
  int parallel = 8;  // files fetched at once
};

struct PulledModel {
  std::string snapshot_dir;
  std::string commit;
  size_t files = 0;            // files in the selection
  uint64_t bytes_fetched = 0;  // over the network in this call
  bool from_cache_only = false;
};

struct RepoListing {
  std::string commit;
  std::vector<std::string> files;
};
// The model-info API: the commit a revision points to and the repo's files.
RepoListing list_repo_files(const HubSettings& settings, const HubId& id);

// Throws HubError (repo, file, what to do) when the model cannot be made complete.
PulledModel pull(const HubId& id, const PullOptions& options);

// --model's argument as a folder: a local path as given, a hub id as its (fetched) snapshot folder.
std::string resolve_model_argument(const std::string& argument);

}  // namespace tierlm::hub
