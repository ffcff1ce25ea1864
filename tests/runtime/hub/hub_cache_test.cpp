// The Hugging Face cache layout (paths from the environment, refs, relative snapshot links) and the download checks
// against their oracles: `git hash-object` for a git blob sha1, `sha256sum` for an LFS sha256.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

#include "runtime/hub/blob_check.h"
#include "runtime/hub/hub_cache.h"

using namespace tierlm::hub;
namespace fs = std::filesystem;

namespace {

std::string command_output(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), &pclose);
  std::string out;
  char buffer[256];
  while (pipe && std::fgets(buffer, sizeof buffer, pipe.get())) out += buffer;
  return out;
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("tierlm-hub-cache-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

struct EnvGuard {
  std::string name;
  std::optional<std::string> old;
  EnvGuard(const char* n, const char* value) : name(n) {
    if (const char* v = std::getenv(n)) old = v;
    if (value) setenv(n, value, 1); else unsetenv(n);
  }
  ~EnvGuard() {
    if (old) setenv(name.c_str(), old->c_str(), 1); else unsetenv(name.c_str());
  }
};

}  // namespace

TEST(HubCache, RootFromEnvironmentAsTheOtherClients) {
  EnvGuard a("HF_HUB_CACHE", nullptr), b("HUGGINGFACE_HUB_CACHE", nullptr), c("HF_HOME", nullptr),
      d("XDG_CACHE_HOME", nullptr), e("HOME", "/home/u");
  EXPECT_EQ(cache_root_from_env(), fs::path("/home/u/.cache/huggingface/hub"));
  setenv("XDG_CACHE_HOME", "/x", 1);
  EXPECT_EQ(cache_root_from_env(), fs::path("/x/huggingface/hub"));
  setenv("HF_HOME", "/h", 1);
  EXPECT_EQ(cache_root_from_env(), fs::path("/h/hub"));
  setenv("HF_HUB_CACHE", "/c", 1);
  EXPECT_EQ(cache_root_from_env(), fs::path("/c"));
}

TEST(HubCache, RefsAndRelativeSnapshotLinks) {
  TempDir tmp;
  RepoCache cache(tmp.path, "Org/Name");
  EXPECT_EQ(cache.folder(), tmp.path / "models--Org--Name");
  const std::string commit = "0123456789abcdef0123456789abcdef01234567";
  EXPECT_FALSE(cache.commit_for("main"));
  cache.write_ref("main", commit);
  std::ifstream ref(cache.folder() / "refs" / "main");
  std::string text((std::istreambuf_iterator<char>(ref)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, commit);  // no newline, as huggingface_hub writes it
  EXPECT_EQ(cache.commit_for("main"), commit);
  cache.write_ref("refs/pr/1", commit);
  EXPECT_EQ(cache.commit_for("refs/pr/1"), commit);

  fs::create_directories(cache.folder() / "blobs");
  std::ofstream(cache.blob_path("abc")) << "{}";
  cache.link_snapshot_file(commit, "config.json", "abc");
  cache.link_snapshot_file(commit, "sub/dir/x.json", "abc");
  EXPECT_EQ(fs::read_symlink(cache.snapshot_dir(commit) / "config.json"), fs::path("../../blobs/abc"));
  EXPECT_EQ(fs::read_symlink(cache.snapshot_dir(commit) / "sub/dir/x.json"), fs::path("../../../../blobs/abc"));
  EXPECT_TRUE(cache.has_snapshot_file(commit, "sub/dir/x.json"));
  EXPECT_EQ(cache.commit_for(commit), commit);  // a commit with a snapshot needs no ref
  std::ofstream(cache.blob_path("def")) << "[]";
  cache.link_snapshot_file(commit, "config.json", "def");  // relinking replaces the link
  EXPECT_EQ(fs::read_symlink(cache.snapshot_dir(commit) / "config.json"), fs::path("../../blobs/def"));
  EXPECT_FALSE(cache.has_snapshot_file(commit, "missing.json"));
  EXPECT_EQ(cache.lock_path("abc"), tmp.path / ".locks" / "models--Org--Name" / "abc.lock");
}

TEST(BlobCheck, AgainstGitAndSha256sum) {
  TempDir tmp;
  const fs::path file = tmp.path / "data.bin";
  {
    std::ofstream out(file, std::ios::binary);
    for (uint32_t i = 0; i < 3000000; ++i) out.put(char((i * 7919u) >> 3));
  }
  const std::string git = command_output("git hash-object " + file.string());
  const std::string sha = command_output("sha256sum " + file.string());
  if (git.size() < 40 || sha.size() < 64) GTEST_SKIP() << "git or sha256sum missing";
  EXPECT_EQ(file_git_blob_sha1(file), git.substr(0, 40));
  EXPECT_EQ(file_sha256(file), sha.substr(0, 64));
  EXPECT_TRUE(matches_etag(file, sha.substr(0, 64), true));
  EXPECT_TRUE(matches_etag(file, git.substr(0, 40), false));
  EXPECT_FALSE(matches_etag(file, git.substr(0, 40), true));
}
