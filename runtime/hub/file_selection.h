// runtime/hub/file_selection.h — which of a repo's files a model needs: config, tokenizer files, chat template,
// generation config, safetensors shards and their index, plus what --include adds and minus what --exclude removes
// (shell globs matched against the whole repo path). Also refuses repo paths that would escape the cache folder.
#pragma once

#include <string>
#include <vector>

namespace tierlm::hub {

struct FileFilter {
  std::vector<std::string> include;  // extra globs (or, with only_include, the only ones)
  std::vector<std::string> exclude;
  bool only_include = false;  // --include replaces the default set instead of adding to it
};

// The globs of the files tierlm loads from a model folder.
const std::vector<std::string>& model_file_globs();

// True when `repo_path` is a safe relative path (no "..", no absolute path, no empty component).
bool safe_repo_path(const std::string& repo_path);

// The repo's files to fetch, in the repo's order.
std::vector<std::string> select_files(const std::vector<std::string>& repo_files, const FileFilter& filter);

}  // namespace tierlm::hub
