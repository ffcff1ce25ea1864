// calibrate/probe_device.cpp — the whole calibration of a machine: every probe in turn, timed and stamped.
#include <unistd.h>

#include <chrono>
#include <ctime>

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
  p.storage = probe_storage(options);
  p.bandwidth = probe_bandwidth(p.topology, options);
  p.compute = probe_compute(p.topology, options);
  p.gpu = probe_gpu(options);
  p.probe_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return p;
}

}  // namespace tierlm::calibrate
