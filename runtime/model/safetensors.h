// runtime/model/safetensors.h — reading a Hugging Face model folder's safetensors: a single model.safetensors or a
// sharded set named by model.safetensors.index.json. Headers are parsed with full bounds checks; tensor data is
// memory-mapped (read-only, page cache) and copied/converted into ledger buffers by the loader.
// Never: trust a length or offset from a file without checking it against the file size; crash on bad files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace tierlm::model {

// Load/parse errors: the message names the file and, where known, the tensor.
class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType : uint8_t { BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, F8_E4M3 };
const char* dtype_name(DType d);
size_t dtype_size(DType d);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::string file;       // path of the shard holding it
  uint64_t offset = 0;    // absolute byte offset of the data in that file
  uint64_t length = 0;    // bytes
  int64_t elements() const;
};

class TensorIndex {
 public:
  // Opens DIR/model.safetensors.index.json if present, else DIR/model.safetensors (or the single *.safetensors).
  static TensorIndex open(const std::filesystem::path& model_dir);
  // Opens one safetensors file.
  static TensorIndex open_file(const std::filesystem::path& file);

  bool contains(const std::string& name) const;
  const TensorInfo* find(const std::string& name) const;
  const TensorInfo& at(const std::string& name) const;  // throws ModelError naming the tensor and folder
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  // The tensor's bytes (memory-mapped; valid while this index lives).
  std::span<const std::byte> data(const TensorInfo& t) const;
  // Metadata from the "__metadata__" entry of the header(s).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The model folder (or the single file) this index was opened from.
  const std::string& origin() const { return origin_; }

  // Page-cache hints for the loader. will_need starts asynchronous read-ahead of a tensor's pages before it is
  // copied; done_with drops them from this process's mapping afterwards (the file's page cache stays), so a load
  // does not hold every weight twice in resident memory. Both are advisory and never fail.
  void will_need(const TensorInfo& t) const;
  void done_with(const TensorInfo& t) const;

 private:
  struct Mapping;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, std::shared_ptr<Mapping>> mappings_;
  std::string origin_;
};

}  // namespace tierlm::model
