// runtime/cli/fit_shape.cpp — read_fit_shape (runtime/cli/fit_shape.h).
#include "runtime/cli/fit_shape.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "calibrate/probes.h"
#include "calibrate/wisdom.h"

#include "runtime/hub/remote_headers.h"
#include "tiering/expert_store.h"

namespace tierlm::cli {

namespace {

namespace bj = boost::json;

void add_header(calibrate::FitModelShape& shape, const std::string& header_json) {
  const bj::object header = bj::parse(header_json).as_object();
  for (const auto& [name, value] : header) {
    if (name == "__metadata__" || !value.is_object()) continue;
    const auto& tensor = value.as_object();
    const auto& offsets = tensor.at("data_offsets").as_array();
    shape.stored_bytes += uint64_t(offsets.at(1).to_number<int64_t>() - offsets.at(0).to_number<int64_t>());
    if (tensor.at("shape").as_array().size() == 2 && shape.matrix_dtype.empty())
      shape.matrix_dtype = std::string(tensor.at("dtype").as_string());
  }
}

// The JSON header of a safetensors file: a little-endian u64 length, then that many bytes.
std::string read_safetensors_header(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  unsigned char length_bytes[8] = {};
  if (!in.read(reinterpret_cast<char*>(length_bytes), 8))
    throw std::runtime_error(file.string() + ": not a safetensors file");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | length_bytes[i];
  if (length == 0 || length > (uint64_t(100) << 20))
    throw std::runtime_error(file.string() + ": safetensors header length " + std::to_string(length) + " out of range");
  std::string header(size_t(length), '\0');
  if (!in.read(header.data(), std::streamsize(length))) throw std::runtime_error(file.string() + ": truncated header");
  return header;
}

}  // namespace

calibrate::FitModelShape read_fit_shape(const std::string& model) {
  calibrate::FitModelShape shape;
  if (const auto id = hub::parse_hub_id(model)) {
    const hub::RemoteModel remote = hub::fetch_remote_model(*id);
    shape.config_json = remote.config_json;
    for (const auto& [file, header] : remote.shard_headers) add_header(shape, header);
    shape.bytes_fetched = remote.bytes_fetched;
    return shape;
  }
  std::ifstream in(std::filesystem::path(model) / "config.json");
  if (!in) throw std::runtime_error(model + ": no config.json (give a model folder or a hub id ORG/NAME)");
  shape.config_json.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  // Each shard's header alone, as for a hub id (any dtype: an architecture tierlm cannot run may store FP8).
  std::vector<std::filesystem::path> shards;
  for (const auto& entry : std::filesystem::directory_iterator(model))
    if (entry.path().extension() == ".safetensors") shards.push_back(entry.path());
  std::sort(shards.begin(), shards.end());
  for (const auto& file : shards) add_header(shape, read_safetensors_header(file));
  // A packed expert file (tierlm pack, or a synthetic model) holds the experts in its own format: the run uses it.
  const auto packed = std::filesystem::path(model) / "experts.tierlm";
  std::error_code ec;
  if (std::filesystem::exists(packed, ec)) {
    const tiering::PackedHeader h = tiering::read_packed_header(packed);
    shape.packed_expert_format = h.layout.format;
    shape.stored_bytes += uint64_t(h.layers * h.experts) * h.layout.bytes;
  }
  return shape;
}

calibrate::DeviceProfile fit_device(const std::string& device_file, std::string& source, const std::string& model) {
  if (!device_file.empty()) {
    source = "device profile " + device_file;
    return calibrate::load_device_profile(device_file);
  }
  const auto identity = calibrate::probe_device_identity(".");
  const auto path = calibrate::default_wisdom_path();
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    const calibrate::Wisdom wisdom = calibrate::load_wisdom(path);
    for (const auto& entry : wisdom.entries)
      if (entry.device.fingerprint() == identity.fingerprint()) {
        source = "this machine's calibration (" + path.string() + ", " + entry.created_at + ")";
        return entry.device;
      }
  }
  source = "quick probes of this machine (no calibration stored: `tierlm calibrate` measures it fully)";
  spdlog::info("fit: no calibration of this machine in {}; running quick probes", path.string());
  calibrate::ProbeOptions probe;
  probe.quick = true;
  if (const std::string own = calibrate::largest_model_file(model); !own.empty()) {
    probe.storage_dir = model;
    probe.storage_file = own;
  }
  return calibrate::probe_device(probe);
}

}  // namespace tierlm::cli
