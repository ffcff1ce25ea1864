// calibrate/wisdom.cpp — reading, writing and looking up the wisdom file.
#include "calibrate/wisdom.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <fmt/format.h>

#include "calibrate/json_fields.h"

namespace tierlm::calibrate {

namespace bj = boost::json;
namespace fs = std::filesystem;

namespace {
std::string absolute_path(const fs::path& p) {
  std::error_code ec;
  fs::path a = fs::weakly_canonical(fs::absolute(p), ec);
  return (ec ? fs::absolute(p) : a).lexically_normal().string();
}
}  // namespace

void Wisdom::upsert(WisdomEntry entry) {
  const std::string fp = entry.plan.device_fingerprint;
  for (auto& e : entries)
    if (e.plan.device_fingerprint == fp && e.model.path == entry.model.path) {
      e = std::move(entry);
      return;
    }
  entries.push_back(std::move(entry));
}

fs::path default_wisdom_path() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "tierlm" / "wisdom.json";
  if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "tierlm" / "wisdom.json";
  return fs::path(".tierlm-wisdom.json");
}

bj::value to_json(const Wisdom& w) {
  bj::array entries;
  for (auto& e : w.entries)
    entries.push_back(bj::object{{"created_at", e.created_at},
                                 {"device_fingerprint", e.plan.device_fingerprint},
                                 {"model_fingerprint", e.plan.model_fingerprint},
                                 {"device", to_json(e.device)},
                                 {"model", to_json(e.model)},
                                 {"plan", to_json(e.plan)}});
  return bj::object{{"schema", "tierlm-wisdom"}, {"schema_version", Wisdom::kSchemaVersion}, {"entries", entries}};
}

Wisdom load_wisdom(const fs::path& path) {
  Wisdom w;
  std::ifstream in(path);
  if (!in) return w;
  std::stringstream text;
  text << in.rdbuf();
  boost::system::error_code ec;
  bj::value v = bj::parse(text.str(), ec);
  if (ec) throw WisdomError(fmt::format("wisdom file {} is not valid JSON ({}); delete it or re-run tierlm calibrate",
                                        path.string(), ec.message()));
  try {
    const auto& o = json::object(v, "wisdom");
    if (json::string(o, "schema", "wisdom") != "tierlm-wisdom") throw std::runtime_error("not a tierlm wisdom file");
    const int64_t version = json::integer(o, "schema_version", "wisdom");
    if (version != Wisdom::kSchemaVersion)
      throw std::runtime_error(fmt::format("schema version {} (this tierlm reads {})", version, Wisdom::kSchemaVersion));
    for (auto& e : json::array(o, "entries", "wisdom")) {
      const auto& eo = json::object(e, "wisdom entry");
      WisdomEntry entry;
      entry.created_at = json::string_or(eo, "created_at", "");
      entry.device = device_profile_from_json(json::field(eo, "device", "wisdom entry"));
      entry.model = model_profile_from_json(json::field(eo, "model", "wisdom entry"));
      entry.plan = plan_from_json(json::field(eo, "plan", "wisdom entry"));
      w.entries.push_back(std::move(entry));
    }
  } catch (const std::exception& e) {
    throw WisdomError(fmt::format("wisdom file {}: {}; re-run tierlm calibrate (or pass --wisdom PATH)", path.string(),
                                  e.what()));
  }
  return w;
}

void save_wisdom(const fs::path& path, const Wisdom& w) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    if (!out) throw WisdomError("cannot write wisdom file " + tmp.string());
    out << bj::serialize(to_json(w)) << '\n';
    if (!out) throw WisdomError("cannot write wisdom file " + tmp.string());
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw WisdomError("cannot replace wisdom file " + path.string());
  }
}

WisdomLookup find_wisdom(const Wisdom& w, const DeviceProfile& device, const fs::path& model_dir,
                         const std::string& model_fp, const fs::path& wisdom_path) {
  WisdomLookup r;
  const std::string device_fp = device.fingerprint(), dir = absolute_path(model_dir);
  const std::string rerun = fmt::format("run `tierlm calibrate --model {}{}`", model_dir.string(),
                                        wisdom_path == default_wisdom_path() ? "" : " --wisdom " + wisdom_path.string());
  for (auto& e : w.entries)
    if (e.plan.device_fingerprint == device_fp && e.plan.model_fingerprint == model_fp) {
      r.status = WisdomLookup::Status::found;
      r.entry = &e;
      return r;
    }
  for (auto& e : w.entries)
    if (e.plan.device_fingerprint == device_fp && absolute_path(e.model.path) == dir) {
      r.status = WisdomLookup::Status::model_changed;
      r.entry = &e;
      r.message = fmt::format("wisdom in {} is stale: the model in {} changed since it was calibrated on {} (model "
                              "fingerprint {} then, {} now); {}",
                              wisdom_path.string(), dir, e.created_at, e.plan.model_fingerprint, model_fp, rerun);
      return r;
    }
  for (auto& e : w.entries)
    if (e.plan.model_fingerprint == model_fp || absolute_path(e.model.path) == dir) {
      r.status = WisdomLookup::Status::hardware_changed;
      r.entry = &e;
      r.message = fmt::format("wisdom in {} was measured on other hardware: [{}], this machine is [{}]; {}",
                              wisdom_path.string(), e.device.identity(), device.identity(), rerun);
      return r;
    }
  r.message = fmt::format("no wisdom for {} on this machine in {}; {}", dir, wisdom_path.string(), rerun);
  return r;
}

}  // namespace tierlm::calibrate
