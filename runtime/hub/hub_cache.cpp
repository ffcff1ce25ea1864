#include "runtime/hub/hub_cache.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

#include "runtime/hub/hub_id.h"

namespace tierlm::hub {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

// Writes `content` to `path` through a temporary name and a rename, so a reader never sees half a file.
void write_atomically(const fs::path& path, const std::string& content) {
  fs::create_directories(path.parent_path());
  const fs::path temp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << content;
    if (!out.flush()) throw std::runtime_error("cannot write " + temp.string());
  }
  fs::rename(temp, path);
}

}  // namespace

fs::path cache_root_from_env() {
  if (auto v = env("HF_HUB_CACHE"); !v.empty()) return v;
  if (auto v = env("HUGGINGFACE_HUB_CACHE"); !v.empty()) return v;
  if (auto v = env("HF_HOME"); !v.empty()) return fs::path(v) / "hub";
  if (auto v = env("XDG_CACHE_HOME"); !v.empty()) return fs::path(v) / "huggingface" / "hub";
  return fs::path(env("HOME")) / ".cache" / "huggingface" / "hub";
}

RepoCache::RepoCache(fs::path root, const std::string& repo) : root_(std::move(root)) {
  folder_name_ = "models--" + repo;
  for (size_t at = folder_name_.find('/'); at != std::string::npos; at = folder_name_.find('/', at))
    folder_name_.replace(at, 1, "--");
  folder_ = root_ / folder_name_;
}

fs::path RepoCache::lock_path(const std::string& etag) const { return root_ / ".locks" / folder_name_ / (etag + ".lock"); }

std::optional<std::string> RepoCache::commit_for(const std::string& revision) const {
  std::error_code ec;
  if (is_commit_hash(revision) && fs::is_directory(snapshot_dir(revision), ec)) return revision;
  std::ifstream in(folder_ / "refs" / revision, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  std::string commit = text.str();
  while (!commit.empty() && (commit.back() == '\n' || commit.back() == '\r' || commit.back() == ' ')) commit.pop_back();
  if (!is_commit_hash(commit)) return std::nullopt;
  return commit;
}

void RepoCache::write_ref(const std::string& revision, const std::string& commit) const {
  if (revision == commit) return;  // a commit needs no ref
  write_atomically(folder_ / "refs" / revision, commit);
}

void RepoCache::link_snapshot_file(const std::string& commit, const std::string& filename,
                                   const std::string& etag) const {
  const fs::path link = snapshot_dir(commit) / filename;
  fs::create_directories(link.parent_path());
  const fs::path target = blob_path(etag).lexically_relative(link.parent_path());
  const fs::path temp = link.string() + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove(temp, ec);
  fs::create_symlink(target, temp);
  fs::rename(temp, link);
}

bool RepoCache::has_snapshot_file(const std::string& commit, const std::string& filename) const {
  std::error_code ec;
  return fs::is_regular_file(snapshot_dir(commit) / filename, ec);
}

}  // namespace tierlm::hub
