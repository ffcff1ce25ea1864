// Hub ids as users write them (ORG/NAME[@REV], a local path always wins) and the file selection of a model repo.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "runtime/hub/file_selection.h"
#include "runtime/hub/hub_id.h"

using namespace tierlm::hub;

TEST(HubId, ParsesOrgNameAndRevision) {
  auto id = parse_hub_id("Qwen/Qwen3-0.6B");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->repo, "Qwen/Qwen3-0.6B");
  EXPECT_EQ(id->revision, "main");
  EXPECT_FALSE(id->revision_given);
  id = parse_hub_id("mlx-community/Qwen2.5-3B-Instruct-4bit@refs/pr/3");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->repo, "mlx-community/Qwen2.5-3B-Instruct-4bit");
  EXPECT_EQ(id->revision, "refs/pr/3");
  EXPECT_EQ(id->display(), "mlx-community/Qwen2.5-3B-Instruct-4bit@refs/pr/3");
  id = parse_hub_id("org/name@0123456789abcdef0123456789abcdef01234567");
  ASSERT_TRUE(id);
  EXPECT_TRUE(is_commit_hash(id->revision));
}

TEST(HubId, PathsAreNotIds) {
  for (const char* path : {"/models/x", "./org/name", "../org/name", "~/org/name", "model", "a/b/c", "", "org/",
                           "/org/name@main", "user@host/x", "org/na me", "org/-bad", "org/bad..name"})
    EXPECT_FALSE(parse_hub_id(path)) << path;
  EXPECT_THROW(parse_hub_id("org/name@"), std::invalid_argument);
  EXPECT_THROW(parse_hub_id("org/name@a..b"), std::invalid_argument);
}

TEST(HubId, AnExistingLocalPathWins) {
  const auto dir = std::filesystem::temp_directory_path() / "tierlm-hub-id-test";
  std::filesystem::create_directories(dir / "org" / "name");
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  EXPECT_FALSE(parse_hub_id("org/name"));   // the folder ./org/name exists
  EXPECT_TRUE(parse_hub_id("org/other"));  // no such folder: an id
  std::filesystem::current_path(cwd);
  std::filesystem::remove_all(dir);
}

TEST(FileSelection, TheModelsFilesOnly) {
  const std::vector<std::string> repo = {".gitattributes", "README.md", "config.json", "generation_config.json",
                                         "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                         "model.safetensors.index.json", "pytorch_model.bin", "tokenizer.json",
                                         "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                                         "original/consolidated.00.pth", "onnx/model.onnx", "../escape.safetensors",
                                         "/abs.safetensors", "a//b.safetensors"};
  const std::vector<std::string> expected = {"config.json", "generation_config.json",
                                             "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                             "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                                             "special_tokens_map.json", "chat_template.jinja"};
  EXPECT_EQ(select_files(repo, {}), expected);
  FileFilter filter;
  filter.include = {"*.md"};
  filter.exclude = {"model-00002-*"};
  auto chosen = select_files(repo, filter);
  EXPECT_NE(std::find(chosen.begin(), chosen.end(), "README.md"), chosen.end());
  EXPECT_EQ(std::find(chosen.begin(), chosen.end(), "model-00002-of-00002.safetensors"), chosen.end());
  filter = {};
  filter.include = {"original/*"};
  filter.only_include = true;
  EXPECT_EQ(select_files(repo, filter), std::vector<std::string>{"original/consolidated.00.pth"});
}

TEST(FileSelection, UnsafeRepoPaths) {
  for (const char* bad : {"../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", "", "a\\b"}) EXPECT_FALSE(safe_repo_path(bad)) << bad;
  for (const char* good : {"config.json", "sub/dir/file.safetensors", "a..b"}) EXPECT_TRUE(safe_repo_path(good)) << good;
}
