// calibrate/fit.h — "will this model run here, with what plan, and how fast?" from the model's shape alone:
// config.json, the dtypes and bytes its safetensors headers declare, and the format of a packed expert file
// (experts.tierlm) when there is one. The profile is model_profile_from_config and the plan and speeds are
// make_plan's: the same cost model calibrate uses, never a second one. `tierlm fit` prints the answer, the fit
// accuracy bench holds it against measured runs and `tierlm bench profile` puts it beside its measurements.
// Never: read tensor data or load weights; guess for an architecture tierlm cannot run (it says so by name).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <boost/json/object.hpp>

#include "calibrate/device_profile.h"
#include "calibrate/model_profile.h"
#include "calibrate/planner.h"
#include "runtime/kernels/weights.h"

namespace tierlm::calibrate {

// What fit reads of a model, locally or from the hub.
struct FitModelShape {
  std::string config_json;
  std::string matrix_dtype;             // the first 2-D tensor's safetensors dtype ("" : config.json's torch_dtype)
  uint64_t stored_bytes = 0;            // tensor bytes the headers (and a packed expert file) declare
  uint64_t bytes_fetched = 0;           // hub ids: bytes received to learn all this
  std::optional<kernels::WeightFormat> packed_expert_format;  // experts.tierlm's slot format
};

struct FitRequest {
  uint64_t budget_bytes = 0;    // 0: the planner's default share of usable memory
  uint64_t gpu_budget_bytes = 0;  // VRAM cap (calibrate --gpu-memory); 0: the device's free VRAM minus 1 GiB
  int64_t context = 4096;       // clamped to the model's max_position_embeddings
  int64_t prompt_tokens = 512;  // for the time to first token
  std::optional<std::string> kv_codec;
  bool largest_context = true;  // search the largest context that fits (a few dozen plans)
  // The model's prefill timed on this machine (ModelProfile::prefill), kept by the caller across answers: where it
  // holds no shape at the plan's threads, fit_model probes them (probe_prefill: random weights, kPrefillProbeSeconds)
  // and adds them. nullptr: no probe (a device profile of another machine), the prefill prediction takes the
  // device's square-weight GEMM probe.
  PrefillRates* prefill = nullptr;
};

struct FitAnswer {
  std::string model_type;
  bool supported = false;
  std::string reason;           // unsupported architecture, or why the plan does not fit
  kernels::WeightFormat weight_format = kernels::WeightFormat::f32, expert_format = kernels::WeightFormat::f32;
  ModelProfile profile;
  int64_t context = 0, prompt_tokens = 0, largest_context = 0;
  std::optional<Plan> plan;
  double time_to_first_token_seconds = 0;
  // MoE: the share of experts not resident (streamed through the cache from disk); 0 for dense models.
  double streamed_expert_fraction = 0;
};

// The run formats of a shape loaded as stored: MLX quantization from config.json, else the first matrix's dtype;
// experts in the packed file's format when there is one.
kernels::WeightFormat stored_weight_format(const model::ModelConfig& config, const FitModelShape& shape);

FitAnswer fit_model(const FitModelShape& shape, const DeviceProfile& device, const FitRequest& request);

boost::json::object to_json(const FitAnswer& answer);

}  // namespace tierlm::calibrate
