#include "runtime/hub/file_selection.h"

#include <fnmatch.h>

namespace tierlm::hub {

namespace {

bool matches_any(const std::string& path, const std::vector<std::string>& globs) {
  for (const auto& glob : globs)
    if (fnmatch(glob.c_str(), path.c_str(), 0) == 0) return true;
  return false;
}

}  // namespace

const std::vector<std::string>& model_file_globs() {
  static const std::vector<std::string> globs = {
      "config.json",         "generation_config.json", "tokenizer.json",          "tokenizer_config.json",
      "special_tokens_map.json", "chat_template.jinja", "chat_template.json",     "*.safetensors",
      "*.safetensors.index.json", "experts.tierlm"};
  return globs;
}

bool safe_repo_path(const std::string& repo_path) {
  if (repo_path.empty() || repo_path.front() == '/' || repo_path.find('\\') != std::string::npos) return false;
  size_t start = 0;
  while (start <= repo_path.size()) {
    const size_t end = std::min(repo_path.find('/', start), repo_path.size());
    const std::string part = repo_path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

std::vector<std::string> select_files(const std::vector<std::string>& repo_files, const FileFilter& filter) {
  std::vector<std::string> selected;
  for (const auto& path : repo_files) {
    if (!safe_repo_path(path)) continue;
    const bool wanted = filter.only_include ? matches_any(path, filter.include)
                                            : matches_any(path, model_file_globs()) || matches_any(path, filter.include);
    if (wanted && !matches_any(path, filter.exclude)) selected.push_back(path);
  }
  return selected;
}

}  // namespace tierlm::hub
