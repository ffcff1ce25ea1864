// tests/runtime/model/safetensors_writer.h — a tiny safetensors writer and temp folder for the model tests.
// Written from the format description (8-byte LE header length, JSON header, data), not from any library.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace tierlm::test {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tierlm_st_XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

struct TestTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  out += '"';
  return out;
}

// Header length field + header text + data, as one byte string.
inline std::string raw_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// A well-formed file: tensors laid out back to back in the given order. `header_pad` spaces end the header
// (the format allows trailing whitespace; it moves the data to a chosen alignment).
inline std::string build_file(const std::vector<TestTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {}, size_t header_pad = 0) {
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first_meta = true;
    for (const auto& [k, v] : metadata) {
      // Appends piece by piece: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string chains.
      if (!first_meta) header += ',';
      header += json_string(k);
      header += ':';
      header += json_string(v);
      first_meta = false;
    }
    header += "}";
    first = false;
  }
  std::string data;
  for (const auto& t : tensors) {
    if (!first) header += ',';
    header += json_string(t.name);
    header += ":{\"dtype\":";
    header += json_string(t.dtype);
    header += ",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) header += ',';
      header += std::to_string(t.shape[i]);
    }
    uint64_t begin = data.size();
    data.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
    header += "],\"data_offsets\":[";
    header += std::to_string(begin);
    header += ',';
    header += std::to_string(data.size());
    header += "]}";
    first = false;
  }
  header += '}';
  header.append(header_pad, ' ');
  return raw_file(header, data);
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

}  // namespace tierlm::test
