// GPU planning on synthetic device profiles: an 80 GB GPU takes every layer (and, for the MoE, every expert) within
// its VRAM budget; a 6 GB GPU takes what fits; no GPU or --gpu-layers 0 keeps everything on the CPU with a reason.
#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>
#include <string>

#include <boost/json.hpp>

#include "calibrate/apply_plan.h"
#include "calibrate/model_profile.h"
#include "calibrate/planner.h"
#include "runtime/gpu/gpu_layers.h"
#include "runtime/model/config.h"
#include "tests/calibrate/planner_profiles.h"

namespace tierlm::calibrate {
namespace {

using test_profiles::device;
using test_profiles::llama_8b;

// Qwen3-30B-A3B with skewed expert frequencies (each layer sums to top_k), so the VRAM set has something to choose.
ModelProfile qwen3_moe_30b() {
  ModelProfile p = test_profiles::qwen3_moe_30b();
  for (auto& layer : p.expert_frequency) {
    double sum = 0;
    for (size_t e = 0; e < layer.size(); ++e) sum += layer[e] = 1.0 / double(e + 1);
    for (auto& f : layer) f *= double(p.top_k) / sum;
  }
  return p;
}

uint64_t vram(const Plan& p) {
  uint64_t t = 0;
  for (auto& [_, b] : p.prediction.vram) t += b;
  return t;
}

void expect_vram_within_budget(const DeviceProfile& d, const Plan& p) {
  EXPECT_LE(vram(p), p.gpu_budget_bytes);
  EXPECT_LE(p.gpu_budget_bytes + kGpuReserveBytes, d.gpu.memory);
  EXPECT_LE(p.prediction.total_memory(), p.budget_bytes);
}

TEST(GpuPlanner, EightyGigabyteGpuRunsEveryLayerOfADenseModel) {
  const DeviceProfile d = device("gpu-server-80gb");
  const ModelProfile m = llama_8b();
  const Plan p = make_plan(d, m, {});
  EXPECT_EQ(p.gpu_layers, m.layers);
  EXPECT_EQ(p.gpu_kv_codec, "f16");
  expect_vram_within_budget(d, p);
  EXPECT_GT(p.prediction.vram.at("weights"), 0u);
  EXPECT_NE(p.gpu_reason.find("32 of 32 layers"), std::string::npos) << p.gpu_reason;
  // The same machine without the GPU is predicted slower.
  PlanRequest cpu_only;
  cpu_only.gpu_layers = 0;
  const Plan c = make_plan(d, m, cpu_only);
  EXPECT_EQ(c.gpu_layers, 0);
  EXPECT_TRUE(c.prediction.vram.empty());
  EXPECT_GT(p.prediction.decode_tokens_per_second, 2 * c.prediction.decode_tokens_per_second);
}

TEST(GpuPlanner, EightyGigabyteGpuHoldsEveryExpertOfTheMoe) {
  const DeviceProfile d = device("gpu-server-80gb");
  const ModelProfile m = qwen3_moe_30b();
  const Plan p = make_plan(d, m, {});
  EXPECT_EQ(p.gpu_layers, m.layers);
  EXPECT_EQ(p.gpu_resident_count(), m.moe_layers * m.experts);  // 18 GiB of q4 experts fit in 80 GB
  EXPECT_DOUBLE_EQ(p.prediction.gpu_expert_hit_rate, 1.0);
  EXPECT_EQ(p.gpu_expert_slots, 4 * m.top_k);
  expect_vram_within_budget(d, p);
  // The runtime side gets the same set.
  const gpu::GpuOptions o = gpu_options(p);
  EXPECT_EQ(o.layers, m.layers);
  EXPECT_EQ(int64_t(o.resident_experts.size()), p.gpu_resident_count());
  EXPECT_EQ(o.expert_slots, p.gpu_expert_slots);
  EXPECT_EQ(o.vram_budget, p.gpu_budget_bytes);
}

TEST(GpuPlanner, SmallGpuTakesWhatFitsAndTheHottestExperts) {
  const DeviceProfile d = device("desktop-16gb-gpu-6gb");
  {
    const ModelProfile m = llama_8b();
    PlanRequest r;
    r.context = 8192;
    const Plan p = make_plan(d, m, r);
    EXPECT_GT(p.gpu_layers, 0);
    EXPECT_LE(p.gpu_layers, m.layers);
    expect_vram_within_budget(d, p);
  }
  const ModelProfile m = qwen3_moe_30b();
  const Plan p = make_plan(d, m, {});
  EXPECT_GT(p.gpu_layers, 0);
  expect_vram_within_budget(d, p);
  EXPECT_GT(p.gpu_resident_count(), 0);
  EXPECT_LT(p.gpu_resident_count(), int64_t(p.gpu_layers) * m.experts);  // 5 GiB cannot hold them all
  EXPECT_LT(p.prediction.gpu_expert_hit_rate, 1.0);
  // Frequencies fall with the expert id in every layer: each GPU layer's VRAM set is a prefix 0..n-1.
  ASSERT_EQ(int64_t(p.gpu_resident_experts.size()), p.gpu_layers);
  for (auto& layer : p.gpu_resident_experts)
    for (size_t i = 0; i < layer.size(); ++i) EXPECT_EQ(layer[i], int32_t(i));
}

// calibrate --gpu-memory: the plan's VRAM stays under the cap (the GPU's free memory would allow 79 GB), with the
// hottest experts in VRAM; the experts outside it run on the CPU in decode steps where the CPU's per-expert cost
// (this profile's q4 matvec rate) beats a copy through staging and PCIe. With a CPU whose matvec is far slower than
// a copy, copies win and the plan says so.
TEST(GpuPlanner, GpuMemoryCapAndHybridExpertPlacement) {
  DeviceProfile d = device("gpu-server-80gb");
  const ModelProfile m = qwen3_moe_30b();
  PlanRequest r;
  r.batch = 1;
  r.gpu_budget_bytes = 8ull << 30;
  const Plan p = make_plan(d, m, r);
  EXPECT_EQ(p.gpu_budget_bytes, 8ull << 30);
  EXPECT_LE(vram(p), p.gpu_budget_bytes);
  EXPECT_EQ(p.gpu_layers, m.layers) << p.gpu_reason;  // the layers' dense parts are small: all of them fit
  EXPECT_GT(p.gpu_resident_count(), 0);
  EXPECT_LT(p.gpu_resident_count(), m.moe_layers * m.experts);
  EXPECT_GE(p.gpu_cpu_expert_rows, 1) << p.gpu_reason;
  EXPECT_NE(p.gpu_reason.find("on the CPU in steps of up to"), std::string::npos) << p.gpu_reason;
  EXPECT_EQ(gpu_options(p).cpu_expert_rows, p.gpu_cpu_expert_rows);
  // A CPU far slower than a copy (at the staging copy's rate): the experts outside VRAM are copied.
  const Plan replanned_copy = [&] {
    PlanRequest q = r;
    DeviceProfile fast = d;
    fast.gpu.h2d_gbs = 1e4;  // (the staging copy still caps it)
    for (auto& c : fast.compute) c.matvec_q4_gbs = c.matvec_q8_gbs = 0.05;  // a CPU far slower than a copy
    return make_plan(fast, m, q);
  }();
  EXPECT_EQ(replanned_copy.gpu_cpu_expert_rows, 0) << replanned_copy.gpu_reason;
  EXPECT_NE(replanned_copy.gpu_reason.find("copied into VRAM slots"), std::string::npos) << replanned_copy.gpu_reason;
  // JSON keeps the field and the cap.
  const Plan back = plan_from_json(to_json(p));
  EXPECT_EQ(back.gpu_cpu_expert_rows, p.gpu_cpu_expert_rows);
  EXPECT_EQ(back.gpu_budget_bytes, p.gpu_budget_bytes);
}

TEST(GpuPlanner, NoGpuOrZeroLayersKeepsTheCpuPlanWithAReason) {
  const Plan p = make_plan(device("laptop-8gb"), qwen3_moe_30b(), {});
  EXPECT_EQ(p.gpu_layers, 0);
  EXPECT_FALSE(p.gpu_reason.empty());
  EXPECT_TRUE(p.prediction.vram.empty());
  EXPECT_EQ(gpu_options(p).layers, 0);
  PlanRequest none;
  none.gpu_layers = 0;
  const Plan z = make_plan(device("gpu-server-80gb"), qwen3_moe_30b(), none);
  EXPECT_EQ(z.gpu_layers, 0);
  EXPECT_TRUE(z.gpu_resident_experts.empty());
}

// Sliding-window layers hold a ring of device pages (GpuLayers' pools: the window plus one step of rows), not the
// context: at 32K a Mistral-7B-shaped model (window 4096 on every layer) plans ring / 512 of the device KV that the
// same model with full attention plans, and a 6 GB GPU takes more of its layers.
TEST(GpuPlanner, SlidingWindowLayersCountTheirRingInVram) {
  ModelProfile full = llama_8b();
  ModelProfile windowed = full;
  windowed.layer_windows.assign(size_t(full.layers), 4096);
  PlanRequest r;
  r.context = 32768;
  const DeviceProfile big = device("gpu-server-80gb");
  const Plan pf = make_plan(big, full, r), pw = make_plan(big, windowed, r);
  ASSERT_EQ(pf.gpu_layers, full.layers);
  ASSERT_EQ(pw.gpu_layers, full.layers);
  ASSERT_EQ(pf.gpu_kv_codec, "f16");
  ASSERT_EQ(pw.gpu_kv_codec, "f16");
  const uint64_t page = 64 * uint64_t(full.kv_heads * full.head_dim) * 2 * 2;  // K and V, f16
  const int64_t rows = pw.prefill_chunk + pw.batch, ring = (4096 - 1 + rows + 63) / 64 + 1;
  EXPECT_EQ(pf.prediction.vram.at("kv"), uint64_t(pf.batch * full.layers) * 512 * page);
  EXPECT_EQ(pw.prediction.vram.at("kv"), uint64_t(pw.batch * full.layers * ring) * page);
  EXPECT_LT(pw.prediction.vram.at("kv") * 6, pf.prediction.vram.at("kv"));
  const DeviceProfile small = device("desktop-16gb-gpu-6gb");
  const Plan sf = make_plan(small, full, r), sw = make_plan(small, windowed, r);
  EXPECT_GT(sw.gpu_layers, sf.gpu_layers) << sf.gpu_reason << " / " << sw.gpu_reason;
  expect_vram_within_budget(small, sw);
}

// Gated DeltaNet layers on the GPU hold no KV pages but a slot of f32 conv + recurrent state per sequence
// (GpuLayers' recurrent states: max_sequences slots a layer, max_sequences = the plan's batch). The qwen3_5 fixture's
// layer plan (three DeltaNet layers, then a full-attention layer) at Qwen3.5-4B-like widths (the fixture's own
// widths are too small for any GPU split to beat the CPU): the device KV planned is the attention layer's pages plus
// the DeltaNet slots (~1 MiB each, which the pages-only count missed while counting DeltaNet layers as attention).
TEST(GpuPlanner, GatedDeltaNetLayersCountTheirStateSlotsInVram) {
  model::ModelConfig c =
      model::load_config(std::filesystem::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models/qwen3_5");
  c.hidden_size = 2560, c.intermediate_size = 9216, c.vocab_size = 151936;
  c.num_heads = 16, c.num_kv_heads = 4, c.head_dim = 256;
  c.deltanet.key_heads = 16, c.deltanet.value_heads = 32, c.deltanet.key_head_dim = 128;
  c.deltanet.value_head_dim = 128;
  const ModelProfile m = model_profile_from_config(c, kernels::WeightFormat::q8_0, kernels::WeightFormat::q8_0);
  int64_t deltanet = 0, attention = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) (c.layer(l).mixer == model::Mixer::gated_deltanet ? deltanet : attention)++;
  ASSERT_EQ(deltanet, 3);
  ASSERT_EQ(attention, 1);
  const DeviceProfile d = device("gpu-server-80gb");
  for (int64_t context : {256, 4096}) {
    PlanRequest r;
    r.context = context;
    r.batch = 3;
    const Plan p = make_plan(d, m, r);
    ASSERT_EQ(p.gpu_layers, c.num_layers) << p.gpu_reason;
    ASSERT_EQ(p.gpu_kv_codec, "f16");
    const int64_t pages = gpu::GpuLayers::kv_layer_pages(0, p.context, p.prefill_chunk + p.batch);
    // K and V, f16
    const uint64_t page_bytes = uint64_t(gpu::GpuLayers::kv_page_positions() * c.num_kv_heads * c.head_dim) * 2 * 2;
    EXPECT_EQ(p.prediction.vram.at("kv"),
              uint64_t(p.batch) * (uint64_t(attention * pages) * page_bytes + uint64_t(deltanet) * c.deltanet.state_bytes()))
        << context;
    EXPECT_EQ(gpu_options(p).max_sequences, p.batch);  // the slots GpuLayers allocates are the ones counted
  }
}

TEST(GpuPlanner, GpuDecisionsRoundTripThroughJson) {
  const Plan p = make_plan(device("desktop-16gb-gpu-6gb"), qwen3_moe_30b(), {});
  const Plan q = plan_from_json(boost::json::parse(boost::json::serialize(to_json(p))));
  EXPECT_EQ(q.gpu_layers, p.gpu_layers);
  EXPECT_EQ(q.gpu_resident_experts, p.gpu_resident_experts);
  EXPECT_EQ(q.gpu_expert_slots, p.gpu_expert_slots);
  EXPECT_EQ(q.gpu_kv_codec, p.gpu_kv_codec);
  EXPECT_EQ(q.gpu_budget_bytes, p.gpu_budget_bytes);
  EXPECT_EQ(q.prediction.vram, p.prediction.vram);
}


// A KV codec the user names (--kv-codec) holds on the GPU layers as well as the CPU's: f32 is the exact
// configuration (what gpu_reference_test holds to transformers' 1e-3), f16 / q8 themselves; a turbo codec, which
// has no device form, is refused naming it, never replaced silently by the plan's device KV.
TEST(GpuPlanner, ANamedKvCodecHoldsOnTheGpuLayersOrIsRefused) {
  const Plan p = make_plan(device("desktop-16gb-gpu-6gb"), qwen3_moe_30b(), {});
  gpu::GpuOptions o = gpu_options(p);
  ASSERT_EQ(o.kv_codec, gpu::GpuKvCodec::f16);
  EXPECT_FALSE(o.widen_dense_weights);
  apply_kv_codec_to_gpu("f32", o);
  EXPECT_EQ(o.kv_codec, gpu::GpuKvCodec::f32);
  EXPECT_TRUE(o.widen_dense_weights);
  gpu::GpuOptions q = gpu_options(p);
  apply_kv_codec_to_gpu("q8", q);
  EXPECT_EQ(q.kv_codec, gpu::GpuKvCodec::q8);
  EXPECT_EQ(q.resident_experts, gpu_options(p).resident_experts);  // the plan's VRAM experts stay
  for (const char* turbo : {"turbo3", "turbo4"}) {
    gpu::GpuOptions t = gpu_options(p);
    try {
      apply_kv_codec_to_gpu(turbo, t);
      ADD_FAILURE() << turbo << " accepted on the GPU layers";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(turbo), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("--gpu-layers 0"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(apply_kv_codec_to_gpu("f8", o), std::invalid_argument);
}
}  // namespace
}  // namespace tierlm::calibrate
