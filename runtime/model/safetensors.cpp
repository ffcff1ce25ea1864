// runtime/model/safetensors.cpp — header parsing (every number checked before use) and the per-shard mappings.
#include "runtime/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <boost/json.hpp>
#include <cerrno>
#include <cstring>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>

namespace tierlm::model {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

// The reference implementation refuses headers above 100 MiB; real ones are at most a few MB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeEntry {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},   {DType::I8, "I8", 1},     {DType::I16, "I16", 2},
    {DType::U16, "U16", 2},   {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2}, {DType::I32, "I32", 4},
    {DType::U32, "U32", 4},   {DType::F32, "F32", 4}, {DType::F64, "F64", 8},   {DType::I64, "I64", 8},
    {DType::U64, "U64", 8},   {DType::F8_E4M3, "F8_E4M3", 1},
};

const DTypeEntry* find_dtype(std::string_view name) {
  for (const auto& e : kDTypes)
    if (name == e.name) return &e;
  return nullptr;
}

std::string printable(std::string_view s) {
  // Names come from untrusted files: keep messages printable and bounded.
  std::string out = "'";
  size_t n = 0;
  for (char c : s) {
    if (++n > 200) {
      out += "...";
      break;
    }
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "'";
}

[[noreturn]] void fail_file(const std::string& file, const std::string& what) {
  throw ModelError("safetensors file '" + file + "': " + what);
}

[[noreturn]] void fail_tensor(const std::string& file, std::string_view tensor, const std::string& what) {
  throw ModelError("safetensors file '" + file + "', tensor " + printable(tensor) + ": " + what);
}

// A JSON number that is a non-negative integer (Boost.JSON stores those as int64 or, above INT64_MAX, uint64).
bool as_unsigned(const json::value& v, uint64_t& out) {
  if (v.is_uint64()) {
    out = v.get_uint64();
    return true;
  }
  if (v.is_int64() && v.get_int64() >= 0) {
    out = static_cast<uint64_t>(v.get_int64());
    return true;
  }
  return false;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

struct ParsedShard {
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};

TensorInfo parse_tensor_entry(const std::string& file, const std::string& name, const json::value& entry,
                              uint64_t data_start, uint64_t data_size) {
  const json::object* obj = entry.if_object();
  if (!obj) fail_tensor(file, name, "header entry is not a JSON object");

  TensorInfo t;
  t.name = name;
  t.file = file;

  const json::value* dtype = obj->if_contains("dtype");
  if (!dtype || !dtype->is_string()) fail_tensor(file, name, "missing or non-string \"dtype\"");
  const DTypeEntry* dt = find_dtype(std::string_view(dtype->get_string()));
  if (!dt) fail_tensor(file, name, "unknown dtype " + printable(std::string_view(dtype->get_string())));
  t.dtype = dt->dtype;

  const json::value* shape = obj->if_contains("shape");
  if (!shape || !shape->is_array()) fail_tensor(file, name, "missing or non-array \"shape\"");
  int64_t elements = 1;
  for (const json::value& d : shape->get_array()) {
    int64_t dim = 0;
    if (d.is_int64()) {
      dim = d.get_int64();
      if (dim < 0) fail_tensor(file, name, "negative dimension " + std::to_string(dim) + " in shape");
    } else if (d.is_uint64()) {
      fail_tensor(file, name, "dimension " + std::to_string(d.get_uint64()) + " in shape is too large");
    } else {
      fail_tensor(file, name, "shape holds a value that is not an integer");
    }
    if (__builtin_mul_overflow(elements, dim, &elements))
      fail_tensor(file, name, "element count of the shape overflows 64 bits");
    t.shape.push_back(dim);
  }

  const json::value* offsets = obj->if_contains("data_offsets");
  if (!offsets) fail_tensor(file, name, "missing \"data_offsets\"");
  const json::array* pair = offsets->if_array();
  uint64_t begin = 0, end = 0;
  if (!pair || pair->size() != 2 || !as_unsigned((*pair)[0], begin) || !as_unsigned((*pair)[1], end))
    fail_tensor(file, name, "\"data_offsets\" must be two unsigned integers [begin, end]");
  if (begin > end)
    fail_tensor(file, name, "data_offsets begin " + std::to_string(begin) + " > end " + std::to_string(end));
  if (end > data_size)
    fail_tensor(file, name,
                "data_offsets end " + std::to_string(end) + " is beyond the data region of " +
                    std::to_string(data_size) + " bytes (truncated file?)");

  uint64_t expected = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(elements), static_cast<uint64_t>(dt->size), &expected))
    fail_tensor(file, name, "byte size of the shape overflows 64 bits");
  if (end - begin != expected)
    fail_tensor(file, name,
                "data_offsets span " + std::to_string(end - begin) + " bytes but " + std::to_string(elements) +
                    " elements of " + dt->name + " need " + std::to_string(expected));

  t.offset = data_start + begin;
  t.length = end - begin;
  return t;
}

// Parses and checks the header of one mapped file. `bytes`/`size` is the whole file.
ParsedShard parse_header(const std::byte* bytes, uint64_t size, const std::string& file) {
  if (size < 8) fail_file(file, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);  // little-endian host (static_assert above)
  if (header_len > kMaxHeaderBytes)
    fail_file(file, "header length " + std::to_string(header_len) + " is absurd (limit " +
                        std::to_string(kMaxHeaderBytes) + " bytes); not a safetensors file?");
  if (header_len > size - 8)
    fail_file(file, "header length " + std::to_string(header_len) + " is larger than the file (" +
                        std::to_string(size) + " bytes); truncated file?");

  std::string_view text(reinterpret_cast<const char*>(bytes) + 8, header_len);
  std::error_code ec;
  json::value root = json::parse(text, ec);
  if (ec) fail_file(file, "header is not valid JSON: " + ec.message());
  const json::object* obj = root.if_object();
  if (!obj) fail_file(file, "header is not a JSON object");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;

  ParsedShard shard;
  shard.tensors.reserve(obj->size());
  for (const auto& kv : *obj) {
    std::string name(kv.key());
    if (name == "__metadata__") {
      const json::object* meta = kv.value().if_object();
      if (!meta) fail_file(file, "\"__metadata__\" is not a JSON object");
      for (const auto& m : *meta) {
        if (!m.value().is_string())
          fail_file(file, "\"__metadata__\" value of key " + printable(std::string_view(m.key())) + " is not a string");
        shard.metadata.emplace(std::string(m.key()), std::string(m.value().get_string()));
      }
      continue;
    }
    shard.tensors.push_back(parse_tensor_entry(file, name, kv.value(), data_start, data_size));
  }

  // Overlapping ranges would alias two tensors' bytes (the classic polyglot trick); empty tensors overlap nothing.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : shard.tensors)
    if (t.length > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    if (cur.offset < prev.offset + prev.length)
      fail_tensor(file, cur.name, "data overlaps tensor " + printable(prev.name));
  }
  return shard;
}

}  // namespace

const char* dtype_name(DType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e.name;
  return "?";
}

size_t dtype_size(DType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e.size;
  return 0;
}

int64_t TensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // checked for overflow when parsed
  return n;
}

// One read-only mapping of a whole shard. Kept alive by shared_ptr as long as any index refers to it.
struct TensorIndex::Mapping {
  std::string path;
  const std::byte* base = nullptr;
  uint64_t size = 0;

  explicit Mapping(const fs::path& file) : path(file.string()) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail_file(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      fail_file(path, std::string("cannot stat: ") + std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      fail_file(path, "not a regular file");
    }
    size = static_cast<uint64_t>(st.st_size);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        int err = errno;
        ::close(fd);
        fail_file(path, std::string("cannot mmap: ") + std::strerror(err));
      }
      base = static_cast<const std::byte*>(p);
    }
    ::close(fd);  // the mapping keeps the file referenced
  }
  ~Mapping() {
    if (base) ::munmap(const_cast<std::byte*>(base), size);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  // Page-aligned madvise over [offset, offset+length), clipped to the mapping.
  void advise(uint64_t offset, uint64_t length, int advice) const {
    if (!base || length == 0 || offset >= size) return;
    length = std::min(length, size - offset);
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    uint64_t first = offset / page * page;
    uint64_t last = offset + length;
    ::madvise(const_cast<std::byte*>(base) + first, last - first, advice);
  }
};

TensorIndex TensorIndex::open_file(const fs::path& file) {
  TensorIndex index;
  auto mapping = std::make_shared<Mapping>(file);
  ParsedShard shard = parse_header(mapping->base, mapping->size, mapping->path);
  index.origin_ = mapping->path;
  for (auto& t : shard.tensors) {
    std::string name = t.name;
    // Boost.JSON keeps the last of repeated keys, so this is a guard rather than an expected case.
    if (!index.tensors_.emplace(name, std::move(t)).second) fail_tensor(mapping->path, name, "appears twice");
  }
  index.metadata_ = std::move(shard.metadata);
  index.mappings_.emplace(mapping->path, std::move(mapping));
  return index;
}

TensorIndex TensorIndex::open(const fs::path& model_dir) {
  std::error_code ec;
  if (fs::is_regular_file(model_dir, ec)) return open_file(model_dir);
  if (!fs::is_directory(model_dir, ec))
    throw ModelError("model folder '" + model_dir.string() + "' does not exist or is not a folder");

  const fs::path index_path = model_dir / "model.safetensors.index.json";
  if (!fs::exists(index_path, ec)) {
    fs::path single = model_dir / "model.safetensors";
    if (!fs::exists(single, ec)) {
      std::vector<fs::path> found;
      for (const auto& entry : fs::directory_iterator(model_dir, ec))
        if (entry.path().extension() == ".safetensors" && entry.is_regular_file(ec)) found.push_back(entry.path());
      if (found.empty())
        throw ModelError("model folder '" + model_dir.string() +
                         "' has no model.safetensors.index.json, model.safetensors or other *.safetensors file");
      if (found.size() > 1) {
        std::sort(found.begin(), found.end());
        std::string names;
        for (size_t i = 0; i < found.size() && i < 8; ++i) names += (i ? ", " : "") + found[i].filename().string();
        if (found.size() > 8) names += ", ...";
        throw ModelError("model folder '" + model_dir.string() + "' holds " + std::to_string(found.size()) +
                         " *.safetensors files (" + names +
                         ") but no model.safetensors.index.json saying which tensor is where");
      }
      single = found.front();
    }
    TensorIndex index = open_file(single);
    index.origin_ = model_dir.string();
    return index;
  }

  // Sharded: the index names each tensor's shard; every shard's own header is still the authority on bytes.
  const std::string index_file = index_path.string();
  auto index_mapping = std::make_shared<Mapping>(index_path);
  std::string_view text(reinterpret_cast<const char*>(index_mapping->base), index_mapping->size);
  json::value root = json::parse(text, ec);
  if (ec) throw ModelError("index file '" + index_file + "' is not valid JSON: " + ec.message());
  const json::object* root_obj = root.if_object();
  const json::value* weight_map_value = root_obj ? root_obj->if_contains("weight_map") : nullptr;
  const json::object* weight_map = weight_map_value ? weight_map_value->if_object() : nullptr;
  if (!weight_map) throw ModelError("index file '" + index_file + "' has no \"weight_map\" object");
  if (weight_map->empty()) throw ModelError("index file '" + index_file + "' has an empty \"weight_map\"");

  std::map<std::string, std::vector<std::string>> wanted_by_shard;  // shard file name -> tensors the index puts there
  for (const auto& kv : *weight_map) {
    if (!kv.value().is_string())
      throw ModelError("index file '" + index_file + "': shard of tensor " + printable(std::string_view(kv.key())) +
                       " is not a string");
    std::string shard(kv.value().get_string());
    fs::path rel(shard);
    bool escapes = shard.empty() || rel.is_absolute() ||
                   std::any_of(rel.begin(), rel.end(), [](const fs::path& part) { return part == ".."; });
    if (escapes)
      throw ModelError("index file '" + index_file + "': tensor " + printable(std::string_view(kv.key())) +
                       " names shard " + printable(shard) + ", which is not a file inside the model folder");
    wanted_by_shard[shard].emplace_back(kv.key());
  }

  TensorIndex index;
  index.origin_ = model_dir.string();
  for (const auto& [shard_name, wanted] : wanted_by_shard) {
    const fs::path shard_path = model_dir / shard_name;
    if (!fs::exists(shard_path, ec))
      throw ModelError("index file '" + index_file + "' names shard " + printable(shard_name) + " (for tensor " +
                       printable(wanted.front()) + "), which does not exist in '" + model_dir.string() + "'");
    auto mapping = std::make_shared<Mapping>(shard_path);
    ParsedShard shard = parse_header(mapping->base, mapping->size, mapping->path);
    std::set<std::string_view> present;
    for (const auto& t : shard.tensors) present.insert(t.name);
    for (const auto& name : wanted)
      if (!present.count(name))
        fail_tensor(mapping->path, name, "listed in '" + index_file + "' for this shard but missing from it");
    for (auto& t : shard.tensors) {
      auto [it, inserted] = index.tensors_.try_emplace(t.name, t);
      if (!inserted)
        fail_tensor(mapping->path, t.name, "also present in shard '" + it->second.file + "'");
    }
    for (auto& [key, value] : shard.metadata) index.metadata_.emplace(key, value);  // first shard wins on conflict
    index.mappings_.emplace(mapping->path, std::move(mapping));
  }
  return index;
}

bool TensorIndex::contains(const std::string& name) const { return tensors_.count(name) != 0; }

const TensorInfo* TensorIndex::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorInfo& TensorIndex::at(const std::string& name) const {
  if (const TensorInfo* t = find(name)) return *t;
  std::string message = "tensor " + printable(name) + " not found in model '" + origin_ + "' (" +
                        std::to_string(tensors_.size()) + " tensors)";
  // Suggestions cost a small edit-distance table per name; skip them for pathological sizes.
  if (name.size() <= 256 && tensors_.size() <= 200000) {
    std::vector<std::pair<size_t, const std::string*>> close;
    const size_t limit = std::max<size_t>(2, name.size() / 4);
    for (const auto& [candidate, info] : tensors_) {
      if (candidate.size() > name.size() + limit || name.size() > candidate.size() + limit) continue;
      size_t d = edit_distance(name, candidate);
      if (d <= limit) close.emplace_back(d, &candidate);
    }
    std::sort(close.begin(), close.end(),
              [](const auto& a, const auto& b) { return a.first != b.first ? a.first < b.first : *a.second < *b.second; });
    if (!close.empty()) {
      message += "; did you mean ";
      for (size_t i = 0; i < close.size() && i < 3; ++i) message += (i ? ", " : "") + printable(*close[i].second);
      message += "?";
    }
  }
  throw ModelError(message);
}

std::span<const std::byte> TensorIndex::data(const TensorInfo& t) const {
  auto it = mappings_.find(t.file);
  if (it == mappings_.end())
    fail_tensor(t.file, t.name, "file is not part of the model '" + origin_ + "'");
  const Mapping& m = *it->second;
  if (t.offset > m.size || t.length > m.size - t.offset)
    fail_tensor(t.file, t.name, "byte range lies outside the file");
  if (t.length == 0) return {};
  return {m.base + t.offset, static_cast<size_t>(t.length)};
}

void TensorIndex::will_need(const TensorInfo& t) const {
  auto it = mappings_.find(t.file);
  if (it != mappings_.end()) it->second->advise(t.offset, t.length, MADV_WILLNEED);
}

void TensorIndex::done_with(const TensorInfo& t) const {
  auto it = mappings_.find(t.file);
  if (it != mappings_.end()) it->second->advise(t.offset, t.length, MADV_DONTNEED);
}

}  // namespace tierlm::model
