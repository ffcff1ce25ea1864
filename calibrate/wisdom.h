// calibrate/wisdom.h — the wisdom file: what `tierlm calibrate` measured and decided, kept between runs so `run` and
// `serve` size themselves without measuring again. One JSON file (Boost.JSON, versioned schema) holding entries
// keyed by device fingerprint and model fingerprint, each with the device profile, the model profile and the plan
// (whose rationale names the measurements behind each decision). Default location: $XDG_CACHE_HOME/tierlm/
// wisdom.json, else ~/.cache/tierlm/wisdom.json.
// Never: silently use wisdom measured on other hardware or for another version of the model; lookups say why not.
#pragma once

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "calibrate/device_profile.h"
#include "calibrate/model_profile.h"
#include "calibrate/planner.h"

namespace tierlm::calibrate {

class WisdomError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct WisdomEntry {
  DeviceProfile device;
  ModelProfile model;
  Plan plan;
  std::string created_at;
};

struct Wisdom {
  static constexpr int kSchemaVersion = 1;
  std::vector<WisdomEntry> entries;
  // Adds the entry, replacing one for the same device fingerprint and model path.
  void upsert(WisdomEntry entry);
};

std::filesystem::path default_wisdom_path();
// A missing file is empty wisdom; unreadable JSON or another schema version is a WisdomError naming the file.
Wisdom load_wisdom(const std::filesystem::path& path);
// Writes atomically (temporary file + rename), creating the directory.
void save_wisdom(const std::filesystem::path& path, const Wisdom& wisdom);
boost::json::value to_json(const Wisdom& wisdom);

struct WisdomLookup {
  enum class Status { found, missing, model_changed, hardware_changed };
  Status status = Status::missing;
  const WisdomEntry* entry = nullptr;  // found: the entry; model_changed/hardware_changed: the one that no longer fits
  std::string message;                 // for people: what is wrong and what to run
};

// The entry for this machine and model. device: at least probe_device_identity(); model_dir/model_fingerprint: the
// model as it is now.
WisdomLookup find_wisdom(const Wisdom& wisdom, const DeviceProfile& device, const std::filesystem::path& model_dir,
                         const std::string& model_fingerprint, const std::filesystem::path& wisdom_path);

}  // namespace tierlm::calibrate
