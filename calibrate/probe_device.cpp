// calibrate/probe_device.cpp — the whole calibration of a machine: every probe in turn, timed and stamped.
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "calibrate/probe_limits.h"
#include "calibrate/probes.h"

namespace tierlm::calibrate {

DeviceProfile probe_device(const ProbeOptions& given) {
  ProbeOptions options = given;
  if (options.quick) options.seconds_per_probe = std::min(options.seconds_per_probe, 2.5);
  const auto start = std::chrono::steady_clock::now();
  DeviceProfile p = probe_device_identity(options.storage_dir);
  p.quick = options.quick;
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  p.measured_at = stamp;
  if (options.memory_budget == 0) {
    std::string why;
    options.memory_budget = probe_memory_budget(p.memory, &why);
    spdlog::info("[calibrate] probes hold at most {:.0f} MiB at once: {}", double(options.memory_budget) / (1 << 20), why);
    if (options.memory_budget < kMinProbeMemoryBytes)
      throw std::runtime_error(fmt::format("calibrate: only {:.0f} MiB may be used by the probes ({}); they need at "
                                           "least {:.0f} MiB: free memory or raise the cgroup limit",
                                           double(options.memory_budget) / (1 << 20), why,
                                           double(kMinProbeMemoryBytes) / (1 << 20)));
  }
  p.storage = probe_storage(options);
  p.bandwidth = probe_bandwidth(p.topology, options);
  p.compute = probe_compute(p.topology, options);
  p.gpu = probe_gpu(options);
  p.probe_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return p;
}

}  // namespace tierlm::calibrate
