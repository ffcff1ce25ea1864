#include "runtime/model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/runtime/model/safetensors_writer.h"

using namespace tierlm::model;
using namespace tierlm::test;

namespace {

std::vector<uint8_t> iota_bytes(size_t n, uint8_t start = 1) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(start + i);
  return out;
}

std::string bytes_string(std::span<const std::byte> s) {
  return std::string(reinterpret_cast<const char*>(s.data()), s.size());
}

std::string vec_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// Runs `open`, expects a ModelError whose message holds every one of `needles`.
template <typename Open>
void expect_model_error(Open open, const std::vector<std::string>& needles) {
  try {
    open();
    ADD_FAILURE() << "expected ModelError";
  } catch (const ModelError& e) {
    std::string message = e.what();
    for (const auto& needle : needles)
      EXPECT_NE(message.find(needle), std::string::npos) << "message lacks '" << needle << "': " << message;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ModelError, got another exception: " << e.what();
  }
}

// Writes DIR/model.safetensors from a raw header and data; expects a ModelError naming the file and `needles`.
void expect_header_error(const std::string& header, const std::string& data, std::vector<std::string> needles) {
  TempDir dir;
  write_bytes(dir / "model.safetensors", raw_file(header, data));
  needles.push_back((dir / "model.safetensors").string());
  expect_model_error([&] { TensorIndex::open(dir.path); }, needles);
}

}  // namespace

TEST(Safetensors, DTypeNamesAndSizes) {
  EXPECT_STREQ(dtype_name(DType::BF16), "BF16");
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::BOOL), 1u);
}

TEST(Safetensors, SingleFile) {
  TempDir dir;
  std::vector<TestTensor> tensors = {
      {"model.embed.weight", "F32", {2, 3}, iota_bytes(24)},
      {"model.norm.weight", "F16", {4}, iota_bytes(8, 100)},
      {"lm_head.weight", "BF16", {2, 2}, iota_bytes(8, 200)},
      {"empty", "I64", {0, 5}, {}},
      {"scalar", "U8", {}, {42}},
  };
  write_bytes(dir / "model.safetensors", build_file(tensors, {{"format", "pt"}}, 3));

  TensorIndex index = TensorIndex::open(dir.path);
  ASSERT_EQ(index.tensors().size(), 5u);
  EXPECT_EQ(index.origin(), dir.path.string());
  EXPECT_EQ(index.metadata().at("format"), "pt");

  const TensorInfo& embed = index.at("model.embed.weight");
  EXPECT_EQ(embed.dtype, DType::F32);
  EXPECT_EQ(embed.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(embed.elements(), 6);
  EXPECT_EQ(embed.length, 24u);
  EXPECT_EQ(embed.file, (dir / "model.safetensors").string());
  for (const auto& t : tensors) {
    SCOPED_TRACE(t.name);
    const TensorInfo* info = index.find(t.name);
    ASSERT_NE(info, nullptr);
    EXPECT_TRUE(index.contains(t.name));
    EXPECT_EQ(info->shape, t.shape);
    EXPECT_EQ(bytes_string(index.data(*info)), vec_string(t.bytes));
  }
  EXPECT_EQ(index.at("empty").elements(), 0);
  EXPECT_EQ(index.at("empty").length, 0u);
  EXPECT_EQ(index.at("scalar").elements(), 1);
  EXPECT_EQ(index.at("lm_head.weight").dtype, DType::BF16);
  EXPECT_FALSE(index.contains("nope"));
  EXPECT_EQ(index.find("nope"), nullptr);

  // Hints are advisory and must not disturb the data.
  index.will_need(embed);
  index.done_with(embed);
  EXPECT_EQ(bytes_string(index.data(embed)), vec_string(tensors[0].bytes));

  // The same file opened directly.
  TensorIndex direct = TensorIndex::open_file(dir / "model.safetensors");
  EXPECT_EQ(direct.tensors().size(), 5u);
  EXPECT_EQ(direct.at("scalar").offset, index.at("scalar").offset);
}

TEST(Safetensors, DataOutlivesTheIndexCopySource) {
  TempDir dir;
  write_bytes(dir / "model.safetensors", build_file({{"w", "U8", {3}, {7, 8, 9}}}));
  std::span<const std::byte> bytes;
  TensorIndex kept;
  {
    TensorIndex index = TensorIndex::open(dir.path);
    kept = index;  // copies share the mapping
  }
  bytes = kept.data(kept.at("w"));
  ASSERT_EQ(bytes.size(), 3u);
  EXPECT_EQ(static_cast<int>(bytes[2]), 9);
}

TEST(Safetensors, SingleFileWithAnotherName) {
  TempDir dir;
  write_bytes(dir / "consolidated.safetensors", build_file({{"w", "F32", {1}, iota_bytes(4)}}));
  write_bytes(dir / "config.json", "{}");
  TensorIndex index = TensorIndex::open(dir.path);
  EXPECT_TRUE(index.contains("w"));
  EXPECT_EQ(index.at("w").file, (dir / "consolidated.safetensors").string());
}

TEST(Safetensors, SeveralFilesWithoutIndexIsAnError) {
  TempDir dir;
  write_bytes(dir / "a.safetensors", build_file({{"w", "F32", {1}, iota_bytes(4)}}));
  write_bytes(dir / "b.safetensors", build_file({{"v", "F32", {1}, iota_bytes(4)}}));
  expect_model_error([&] { TensorIndex::open(dir.path); },
                     {dir.path.string(), "a.safetensors", "b.safetensors", "model.safetensors.index.json"});
}

TEST(Safetensors, FolderWithoutWeightsIsAnError) {
  TempDir dir;
  expect_model_error([&] { TensorIndex::open(dir.path); }, {dir.path.string(), "safetensors"});
  expect_model_error([&] { TensorIndex::open(dir / "missing"); }, {"missing"});
  expect_model_error([&] { TensorIndex::open_file(dir / "missing.safetensors"); }, {"missing.safetensors"});
}

TEST(Safetensors, Sharded) {
  TempDir dir;
  std::vector<TestTensor> first = {{"a", "F32", {2}, iota_bytes(8)}, {"b", "F16", {3}, iota_bytes(6, 50)}};
  std::vector<TestTensor> second = {{"c", "BF16", {1, 2}, iota_bytes(4, 90)}, {"d", "I32", {0}, {}}};
  write_bytes(dir / "model-00001-of-00002.safetensors", build_file(first, {{"format", "pt"}}));
  write_bytes(dir / "model-00002-of-00002.safetensors", build_file(second, {{"format", "pt"}, {"extra", "x"}}));
  write_bytes(dir / "model.safetensors.index.json",
              R"({"metadata": {"total_size": 22}, "weight_map": {
                   "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                   "c": "model-00002-of-00002.safetensors", "d": "model-00002-of-00002.safetensors"}})");
  TensorIndex index = TensorIndex::open(dir.path);
  ASSERT_EQ(index.tensors().size(), 4u);
  EXPECT_EQ(index.at("a").file, (dir / "model-00001-of-00002.safetensors").string());
  EXPECT_EQ(index.at("c").file, (dir / "model-00002-of-00002.safetensors").string());
  for (const auto& t : first) EXPECT_EQ(bytes_string(index.data(index.at(t.name))), vec_string(t.bytes));
  for (const auto& t : second) EXPECT_EQ(bytes_string(index.data(index.at(t.name))), vec_string(t.bytes));
  EXPECT_EQ(index.metadata().at("format"), "pt");
  EXPECT_EQ(index.metadata().at("extra"), "x");
  EXPECT_EQ(index.origin(), dir.path.string());
}

TEST(Safetensors, UnknownTensorNamesTensorAndFolderAndSuggests) {
  TempDir dir;
  write_bytes(dir / "model.safetensors",
              build_file({{"model.layers.0.mlp.up_proj.weight", "F32", {1}, iota_bytes(4)},
                          {"model.layers.1.mlp.up_proj.weight", "F32", {1}, iota_bytes(4)},
                          {"lm_head.weight", "F32", {1}, iota_bytes(4)}}));
  TensorIndex index = TensorIndex::open(dir.path);
  expect_model_error([&] { index.at("model.layers.0.mlp.upproj.weight"); },
                     {"model.layers.0.mlp.upproj.weight", dir.path.string(), "did you mean",
                      "model.layers.0.mlp.up_proj.weight"});
  expect_model_error([&] { index.at("completely.different"); }, {"completely.different", dir.path.string()});
}

// ---- one test per corruption ----

TEST(SafetensorsCorrupt, ShorterThanEightBytes) {
  TempDir dir;
  write_bytes(dir / "model.safetensors", std::string("\x05\x00\x00", 3));
  expect_model_error([&] { TensorIndex::open(dir.path); }, {(dir / "model.safetensors").string(), "8"});
  write_bytes(dir / "model.safetensors", "");
  expect_model_error([&] { TensorIndex::open(dir.path); }, {(dir / "model.safetensors").string()});
}

TEST(SafetensorsCorrupt, HeaderLongerThanFile) {
  TempDir dir;
  std::string file = raw_file("{}", "");
  file[0] = 100;  // claims 100 header bytes, holds 2
  write_bytes(dir / "model.safetensors", file);
  expect_model_error([&] { TensorIndex::open(dir.path); },
                     {(dir / "model.safetensors").string(), "header length 100", "larger than the file"});
}

TEST(SafetensorsCorrupt, AbsurdHeaderLength) {
  TempDir dir;
  std::string file = raw_file("{}", "");
  for (int i = 0; i < 8; ++i) file[i] = '\xff';
  write_bytes(dir / "model.safetensors", file);
  expect_model_error([&] { TensorIndex::open(dir.path); }, {(dir / "model.safetensors").string(), "absurd"});
}

TEST(SafetensorsCorrupt, HeaderNotJson) {
  expect_header_error("{\"w\": {\"dtype\": ", "", {"not valid JSON"});
  expect_header_error("", "", {"not valid JSON"});
  expect_header_error(std::string("{\"w\xff\": 1}"), "", {"not valid JSON"});  // invalid UTF-8
}

TEST(SafetensorsCorrupt, HeaderNotObject) {
  expect_header_error("[1, 2]", "", {"not a JSON object"});
  expect_header_error("\"str\"", "", {"not a JSON object"});
}

TEST(SafetensorsCorrupt, EntryNotObject) {
  expect_header_error(R"({"w": 5})", "", {"'w'", "not a JSON object"});
}

TEST(SafetensorsCorrupt, MetadataNotStrings) {
  expect_header_error(R"({"__metadata__": {"n": 5}})", "", {"__metadata__", "'n'"});
  expect_header_error(R"({"__metadata__": [1]})", "", {"__metadata__"});
}

TEST(SafetensorsCorrupt, UnknownDType) {
  expect_header_error(R"({"w": {"dtype": "F8_E5M2", "shape": [2], "data_offsets": [0, 2]}})", "ab",
                      {"'w'", "unknown dtype", "F8_E5M2"});
  expect_header_error(R"({"w": {"dtype": 3, "shape": [2], "data_offsets": [0, 2]}})", "ab", {"'w'", "dtype"});
  expect_header_error(R"({"w": {"shape": [2], "data_offsets": [0, 2]}})", "ab", {"'w'", "dtype"});
}

TEST(SafetensorsCorrupt, NegativeDimension) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [-2], "data_offsets": [0, 2]}})", "ab",
                      {"'w'", "negative dimension -2"});
}

TEST(SafetensorsCorrupt, BadShapeValues) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [2.0], "data_offsets": [0, 2]}})", "ab", {"'w'", "shape"});
  expect_header_error(R"({"w": {"dtype": "U8", "shape": "2", "data_offsets": [0, 2]}})", "ab", {"'w'", "shape"});
  expect_header_error(R"({"w": {"dtype": "U8", "data_offsets": [0, 2]}})", "ab", {"'w'", "shape"});
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 2]}})", "ab",
                      {"'w'", "too large"});
}

TEST(SafetensorsCorrupt, ElementCountOverflow) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 2]}})", "ab",
                      {"'w'", "overflow"});
  // Elements fit in 64 bits but bytes do not.
  expect_header_error(R"({"w": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 2]}})", "ab",
                      {"'w'", "overflow"});
}

TEST(SafetensorsCorrupt, DataOffsetsMissing) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [2]}})", "ab", {"'w'", "data_offsets"});
}

TEST(SafetensorsCorrupt, DataOffsetsNotTwoUnsignedIntegers) {
  for (const char* offsets : {"[0]", "[0, 1, 2]", "[-1, 1]", "[0, 2.0]", "[\"0\", \"2\"]", "{}", "5"}) {
    SCOPED_TRACE(offsets);
    expect_header_error(std::string(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": )") + offsets + "}}", "ab",
                        {"'w'", "data_offsets", "two unsigned integers"});
  }
}

TEST(SafetensorsCorrupt, BeginAfterEnd) {
  expect_header_error(R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [2, 1]}})", "ab",
                      {"'w'", "begin 2 > end 1"});
}

TEST(SafetensorsCorrupt, EndBeyondDataRegion) {
  TempDir dir;
  std::string file = build_file({{"a", "F32", {4}, iota_bytes(16)}, {"b", "F32", {4}, iota_bytes(16)}});
  write_bytes(dir / "model.safetensors", file.substr(0, file.size() - 1));  // truncated by one byte
  expect_model_error([&] { TensorIndex::open(dir.path); },
                     {(dir / "model.safetensors").string(), "'b'", "beyond the data region", "truncated"});
}

TEST(SafetensorsCorrupt, ByteLengthMismatch) {
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 15]}})", std::string(16, 'x'),
                      {"'w'", "15 bytes", "4 elements of F32 need 16"});
}

TEST(SafetensorsCorrupt, OverlappingTensors) {
  expect_header_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                      std::string(12, 'x'), {"overlaps", "'a'", "'b'"});
  // Identical ranges alias too.
  expect_header_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                          "b": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})",
                      std::string(4, 'x'), {"overlaps"});
}

TEST(SafetensorsCorrupt, ZeroSizeTensorsOverlapNothing) {
  TempDir dir;
  write_bytes(dir / "model.safetensors",
              raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                           "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                           "f": {"dtype": "F32", "shape": [3, 0], "data_offsets": [8, 8]}})",
                       std::string(8, 'x')));
  TensorIndex index = TensorIndex::open(dir.path);
  EXPECT_EQ(index.data(index.at("e")).size(), 0u);
  EXPECT_EQ(index.data(index.at("f")).size(), 0u);
}

// ---- sharded corruption ----

namespace {

void write_two_shards(const TempDir& dir) {
  write_bytes(dir / "s1.safetensors", build_file({{"a", "F32", {1}, iota_bytes(4)}}));
  write_bytes(dir / "s2.safetensors", build_file({{"b", "F32", {1}, iota_bytes(4)}}));
}

}  // namespace

TEST(SafetensorsCorrupt, IndexNamesMissingShard) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir / "model.safetensors.index.json",
              R"({"weight_map": {"a": "s1.safetensors", "b": "s3.safetensors"}})");
  expect_model_error([&] { TensorIndex::open(dir.path); },
                     {(dir / "model.safetensors.index.json").string(), "s3.safetensors", "does not exist", "'b'"});
}

TEST(SafetensorsCorrupt, IndexTensorMissingFromShard) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir / "model.safetensors.index.json",
              R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s2.safetensors"}})");
  expect_model_error([&] { TensorIndex::open(dir.path); }, {(dir / "s2.safetensors").string(), "'c'", "missing"});
}

TEST(SafetensorsCorrupt, SameTensorInTwoShards) {
  TempDir dir;
  write_bytes(dir / "s1.safetensors", build_file({{"a", "F32", {1}, iota_bytes(4)}}));
  write_bytes(dir / "s2.safetensors",
              build_file({{"a", "F32", {1}, iota_bytes(4)}, {"b", "F32", {1}, iota_bytes(4)}}));
  write_bytes(dir / "model.safetensors.index.json",
              R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_model_error([&] { TensorIndex::open(dir.path); },
                     {"'a'", (dir / "s1.safetensors").string(), (dir / "s2.safetensors").string()});
}

TEST(SafetensorsCorrupt, IndexNotJsonOrWithoutWeightMap) {
  TempDir dir;
  write_two_shards(dir);
  const std::string index_file = (dir / "model.safetensors.index.json").string();
  write_bytes(index_file, "{\"weight_map\": ");
  expect_model_error([&] { TensorIndex::open(dir.path); }, {index_file, "not valid JSON"});
  write_bytes(index_file, R"({"metadata": {}})");
  expect_model_error([&] { TensorIndex::open(dir.path); }, {index_file, "weight_map"});
  write_bytes(index_file, R"({"weight_map": {}})");
  expect_model_error([&] { TensorIndex::open(dir.path); }, {index_file, "empty"});
  write_bytes(index_file, R"({"weight_map": {"a": 1}})");
  expect_model_error([&] { TensorIndex::open(dir.path); }, {index_file, "'a'", "not a string"});
  write_bytes(index_file, "");
  expect_model_error([&] { TensorIndex::open(dir.path); }, {index_file});
}

TEST(SafetensorsCorrupt, IndexShardOutsideFolder) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "../s1.safetensors"}})");
  expect_model_error([&] { TensorIndex::open(dir.path); }, {"'a'", "../s1.safetensors", "not a file inside"});
  write_bytes(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "/etc/passwd"}})");
  expect_model_error([&] { TensorIndex::open(dir.path); }, {"'a'", "/etc/passwd"});
}

TEST(SafetensorsCorrupt, ShardIsAFolder) {
  TempDir dir;
  std::filesystem::create_directory(dir / "s1.safetensors");
  write_bytes(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors"}})");
  expect_model_error([&] { TensorIndex::open(dir.path); }, {(dir / "s1.safetensors").string(), "regular file"});
}

TEST(SafetensorsCorrupt, CorruptShardNamesTheShard) {
  TempDir dir;
  write_bytes(dir / "s1.safetensors", build_file({{"a", "F32", {1}, iota_bytes(4)}}));
  std::string bad = build_file({{"b", "F32", {2}, iota_bytes(8)}});
  write_bytes(dir / "s2.safetensors", bad.substr(0, bad.size() - 4));
  write_bytes(dir / "model.safetensors.index.json",
              R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_model_error([&] { TensorIndex::open(dir.path); }, {(dir / "s2.safetensors").string(), "'b'"});
}

TEST(SafetensorsCorrupt, ForeignTensorInfoIsRefused) {
  TempDir dir;
  write_bytes(dir / "model.safetensors", build_file({{"w", "F32", {1}, iota_bytes(4)}}));
  TensorIndex index = TensorIndex::open(dir.path);
  TensorInfo forged = index.at("w");
  forged.length = 1 << 20;
  expect_model_error([&] { index.data(forged); }, {"'w'", "outside"});
  forged.file = "/elsewhere.safetensors";
  expect_model_error([&] { index.data(forged); }, {"'w'", "/elsewhere.safetensors"});
}
