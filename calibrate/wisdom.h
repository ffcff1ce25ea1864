// calibrate/wisdom.h — the wisdom file: what `tierlm calibrate` measured and decided, kept between runs so `run` and
// `serve` size themselves without measuring again. One JSON file (Boost.JSON, versioned schema) holding entries
// keyed by device fingerprint and model fingerprint, each with the device profile, the model profile and the plan
// (whose rationale names the measurements behind each decision). Default location: $XDG_CACHE_HOME/tierlm/
// wisdom.json, else ~/.cache/tierlm/wisdom.json.
// Durability: every write goes to a unique temporary file in the same directory, is fsynced, renamed over the file and
// the directory fsynced, so a reader (or a kill -9 at any moment) sees the old file or the new one, never a mix.
// Writers hold an flock on the sidecar FILE.lock across read-modify-write (update_wisdom), so concurrent calibrations
// all land their entries. A corrupt file is a CorruptWisdomError naming it and the commands that fix it; writers move
// it aside (FILE.corrupt-TIME) rather than overwrite it.
// Never: silently use wisdom measured on other hardware or for another version of the model; lookups say why not.
// Never: delete or overwrite a wisdom file it could not read.
#pragma once

#include <filesystem>
#include <functional>
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

// The file exists but is not wisdom this tierlm can use: empty, truncated, not JSON, binary, wrong types, another
// schema. what(): the file, what is wrong, and the commands that fix it.
class CorruptWisdomError : public WisdomError {
 public:
  CorruptWisdomError(const std::filesystem::path& path, const std::string& problem,
                     const std::filesystem::path& model_dir);
  const std::filesystem::path& path() const { return path_; }
  const std::string& problem() const { return problem_; }

 private:
  std::filesystem::path path_;
  std::string problem_;
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
// The command that rebuilds the entry for model_dir ("DIR" when empty) in the wisdom file at path.
std::string recalibrate_command(const std::filesystem::path& path, const std::filesystem::path& model_dir = {});

// A missing file is empty wisdom; a file that cannot be read is a WisdomError; a corrupt one a CorruptWisdomError
// (model_dir, when known, goes into the command it suggests). Takes no lock: files are only ever replaced whole.
Wisdom load_wisdom(const std::filesystem::path& path, const std::filesystem::path& model_dir = {});
// Replaces the whole file (atomically, under the lock), creating the directory.
void save_wisdom(const std::filesystem::path& path, const Wisdom& wisdom);
// Read-modify-write under the lock: loads the file, applies change, writes it back atomically, returns what was
// written. A corrupt file is moved aside to PATH.corrupt-TIME (with a warning in the log) and change starts from
// empty wisdom. Stale temporary files of writers killed mid-write are removed.
Wisdom update_wisdom(const std::filesystem::path& path, const std::function<void(Wisdom&)>& change);
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
