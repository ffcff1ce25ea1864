// runtime/cli/fit_shape.h — what `tierlm fit` and `tierlm bench profile` read of a model before anything loads:
// config.json, every safetensors shard's header (dtypes, bytes; any dtype, so an FP8 checkpoint of an
// architecture tierlm cannot run is still measured) and a packed expert file's format. A hub id ORG/NAME[@REV]
// is read remotely (config.json and HTTP Range reads of each shard's header), never downloaded. And the rates
// of the machine fit answers for.
// Never: read tensor data.
#pragma once

#include <string>

#include "calibrate/fit.h"

namespace tierlm::cli {

calibrate::FitModelShape read_fit_shape(const std::string& model);

// The rates fit plans with: a device profile file when given, else this machine's stored calibration (the wisdom
// file entry with this machine's fingerprint), else quick probes: their storage sweep reads the model's own largest
// file where `model` is a local folder (on its filesystem, as the tier will), else a scratch file in the current
// directory. `source` says which, for the user.
calibrate::DeviceProfile fit_device(const std::string& device_file, std::string& source, const std::string& model = "");

}  // namespace tierlm::cli
