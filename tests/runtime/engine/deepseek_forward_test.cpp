// Oracle: transformers 5.17 fixtures (tests/fixtures/models/deepseek_v3, deepseek_v2, made on the device) — MLA with
// q LoRA (v3) or q_proj (v2), interleaved rope, the first layer dense, sigmoid group-limited routing with
// e_score_correction_bias and routed_scaling_factor (v3) or greedy softmax routing (v2), ungated shared experts; and
// the v3 model as an FP8 block-quantized checkpoint (deepseek_v3-fp8).
// Logits of every prompt position and of each of 32 greedy steps within 1e-3 relative, the greedy tokens identical,
// with every expert streamed through the tier (and from a packed file). Then the latent cache's own properties:
// chunked prefill (1, 5, 24) equals whole, a batch through the scheduler equals each sequence alone, the cache
// holds kv_lora_rank + rope floats per position and layer in the ledger, and what that saves against uncompressed
// KV for the fixture and the published DeepSeek-V3 / V2-Lite configs at 32K context.
#include <algorithm>
#include <cmath>
#include <fstream>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/runtime/engine/reference_fixture.h"
#include "tests/runtime/engine/scheduler_fixture.h"
#include "tests/runtime/model/safetensors_writer.h"

#include "calibrate/model_profile.h"
#include "calibrate/planner.h"
#include "runtime/engine/forward.h"
#include "runtime/gpu/gpu_layers.h"
#include "runtime/model/model.h"
#include "runtime/model/moe_model.h"

using namespace tierlm;

namespace {

using fixtures::fixture;
using fixtures::read_json;

// Every expert use is a read: as many cache slots as one token's top-k, no prefetch.
model::LoadOptions streaming(tiering::Ledger& ledger, const std::filesystem::path& dir) {
  model::LoadOptions o;
  o.ledger = &ledger;
  o.experts.cache.slots = model::load_config(dir).num_experts_per_tok;
  o.experts.cache.prefetch_limit = 0;
  o.packed_experts = "";  // never pick up a packed file lying in the fixture folder
  return o;
}

struct Match : fixtures::ReferenceMatch {
  tiering::ExpertTierTelemetry telemetry;
};

// The fixture's prompt in chunks of `chunk` tokens, then its 32 greedy steps, against reference.json.
Match run_reference(const std::filesystem::path& dir, int64_t chunk, const std::filesystem::path& packed = "") {
  tiering::Ledger ledger;
  model::LoadOptions options = streaming(ledger, dir);
  options.packed_experts = packed;
  const model::ModelWeights w = model::load_model(dir, options);
  Match m{fixtures::match_reference(w, ledger, dir, chunk), {}};
  m.telemetry = w.experts->telemetry();
  return m;
}

class DeepseekMatchesTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(DeepseekMatchesTransformers, LogitsAndGreedyTokensWithStreamedExperts) {
  const Match m = run_reference(fixture(GetParam()), 64);
  EXPECT_LT(m.prompt_error, 1e-3) << "prompt logits";
  EXPECT_LT(m.step_error, 1e-3) << "decode-step logits";
  EXPECT_EQ(m.greedy_matches, m.greedy_total) << "greedy tokens";
  EXPECT_EQ(m.telemetry.hits, 0u);
  EXPECT_GT(m.telemetry.misses, 0u);
  std::printf("[%s] prompt rel err %.2e, step rel err %.2e, greedy %d/%d, %llu expert reads\n", GetParam().c_str(),
              m.prompt_error, m.step_error, m.greedy_matches, m.greedy_total,
              (unsigned long long)m.telemetry.misses);
}

TEST_P(DeepseekMatchesTransformers, ChunkedPrefillMatchesToo) {
  for (int64_t chunk : {1, 5}) {
    const Match m = run_reference(fixture(GetParam()), chunk);
    EXPECT_LT(m.prompt_error, 1e-3) << "chunk " << chunk;
    EXPECT_LT(m.step_error, 1e-3) << "chunk " << chunk;
    EXPECT_EQ(m.greedy_matches, m.greedy_total) << "chunk " << chunk;
  }
}

// `tierlm pack` rewrites the DeepSeek expert tensors (mlp.experts.N.{gate,up,down}_proj) expert-major; streaming
// from the packed file gives the same logits, one aligned read per miss.
TEST_P(DeepseekMatchesTransformers, PackedExpertsStreamTheSameLogits) {
  test::TempDir dir;
  const auto packed = model::pack_experts(fixture(GetParam()), kernels::WeightFormat::f32, dir / "experts.tierlm");
  const auto config = model::load_config(fixture(GetParam()));
  EXPECT_EQ(packed.experts, config.sparse_layers() * config.num_experts);
  const Match m = run_reference(fixture(GetParam()), 64, packed.path);
  EXPECT_LT(m.prompt_error, 1e-3);
  EXPECT_LT(m.step_error, 1e-3);
  EXPECT_EQ(m.greedy_matches, m.greedy_total);
  EXPECT_EQ(m.telemetry.bytes_read, m.telemetry.misses * packed.expert_bytes);
}

// deepseek_v3-fp8: float8_e4m3fn weights with 128x128 block scales (experts too), dequantized to f32 at load and at
// each expert miss; its reference is transformers' own dequantized model.
// deepseek_v3-yarn / deepseek_v2-yarn: YaRN rope as the published configs set it (factor 40 over 4096 original
// positions, beta 32/1): V3's mscale = mscale_all_dim = 1 (softmax scale x mscale(40, 1)^2), the v2 one mscale 0.9
// against mscale_all_dim 0.707 so the cos/sin attention factor is not 1 either.
// deepseek_v3-mlx4 / deepseek_v2-mlx4: mlx-lm's layouts (experts stacked as switch_mlp, 4-bit group 32; V3's kv_b
// split into embed_q / unembed_out, V2's kv_b_proj kept), against transformers on the dequantized weights; packed,
// their experts stay MLX.
INSTANTIATE_TEST_SUITE_P(Fixtures, DeepseekMatchesTransformers,
                         ::testing::Values("deepseek_v3", "deepseek_v2", "deepseek_v3-fp8", "deepseek_v3-yarn",
                                           "deepseek_v2-yarn", "deepseek_v3-mlx4", "deepseek_v2-mlx4"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The published checkpoints carry the multi-token-prediction layer as model.layers.<num_hidden_layers>.* (enorm,
// hnorm, eh_proj, shared_head, a whole decoder layer): never read. A second shard holding such tensors, one of them
// mis-shaped, changes nothing.
TEST(Deepseek, MtpLayerTensorsAreNeverRead) {
  test::TempDir dir;
  const auto source = fixture("deepseek_v3");
  for (const char* f : {"config.json", "reference.json", "model.safetensors"})
    std::filesystem::copy_file(source / f, dir / f);
  const std::vector<test::TestTensor> mtp = {
      {"model.layers.4.eh_proj.weight", "F32", {64, 128}, std::vector<uint8_t>(64 * 128 * 4)},
      {"model.layers.4.enorm.weight", "F32", {64}, std::vector<uint8_t>(64 * 4)},
      {"model.layers.4.self_attn.kv_b_proj.weight", "F32", {3, 5}, std::vector<uint8_t>(3 * 5 * 4)},
      {"model.layers.4.mlp.experts.0.gate_proj.weight", "F32", {2, 2}, std::vector<uint8_t>(2 * 2 * 4)}};
  test::write_bytes(dir / "mtp.safetensors", test::build_file(mtp));
  // The index names every tensor's shard (the fixture's own header lists those of model.safetensors).
  std::ifstream in(source / "model.safetensors", std::ios::binary);
  uint64_t header_bytes = 0;
  in.read(reinterpret_cast<char*>(&header_bytes), 8);
  std::string header(header_bytes, '\0');
  in.read(header.data(), std::streamsize(header_bytes));
  boost::json::object weight_map;
  const boost::json::value tensors = boost::json::parse(header);  // named: a range-for would not keep it alive
  for (auto& [name, info] : tensors.as_object())
    if (name != "__metadata__") weight_map[name] = "model.safetensors";
  for (auto& t : mtp) weight_map[t.name] = "mtp.safetensors";
  test::write_bytes(dir / "model.safetensors.index.json",
                    boost::json::serialize(boost::json::object{{"weight_map", weight_map}}));
  const Match m = run_reference(dir.path, 64);
  EXPECT_LT(m.prompt_error, 1e-3);
  EXPECT_LT(m.step_error, 1e-3);
  EXPECT_EQ(m.greedy_matches, m.greedy_total);
}

TEST(Deepseek, LayerPlanAndRouterFromTheConfig) {
  const model::ModelConfig v3 = model::load_config(fixture("deepseek_v3"));
  ASSERT_EQ(v3.num_layers, 4);
  EXPECT_EQ(v3.layer(0).mlp, model::Mlp::dense);  // first_k_dense_replace 1
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(v3.layer(i).mixer, model::Mixer::mla) << "layer " << i;
  for (int64_t i = 1; i < 4; ++i) EXPECT_EQ(v3.layer(i).expert_layer, i - 1);
  EXPECT_EQ(v3.sparse_layers(), 3);
  EXPECT_EQ(v3.mla.q_lora_rank, 48);
  EXPECT_EQ(v3.mla.latent_floats(), 32 + 8);
  EXPECT_DOUBLE_EQ(v3.mla.softmax_scale, 1.0 / std::sqrt(24.0));
  EXPECT_EQ(v3.router.scoring, model::RouterConfig::Scoring::sigmoid);
  EXPECT_EQ(v3.router.groups, model::RouterConfig::Groups::top2_sum);
  EXPECT_EQ(v3.router.n_group, 4);
  EXPECT_EQ(v3.router.topk_group, 2);
  EXPECT_DOUBLE_EQ(v3.router.routed_scaling_factor, 2.5);
  EXPECT_TRUE(v3.norm_topk_prob);
  EXPECT_EQ(v3.shared_expert_intermediate_size, 32);
  const model::ModelConfig v2 = model::load_config(fixture("deepseek_v2"));
  EXPECT_EQ(v2.mla.q_lora_rank, 0);
  EXPECT_EQ(v2.router.scoring, model::RouterConfig::Scoring::softmax);
  EXPECT_EQ(v2.router.groups, model::RouterConfig::Groups::none);
  EXPECT_FALSE(v2.norm_topk_prob);
  EXPECT_EQ(v2.shared_expert_intermediate_size, 64);  // 2 shared experts of 32
}

TEST(Deepseek, UnsupportedOptionsAreRefusedByName) {
  auto config = read_json(fixture("deepseek_v3") / "config.json").as_object();
  auto refused = [&](const char* key, boost::json::value v) {
    auto c = config;
    c[key] = v;
    try {
      model::parse_config(boost::json::serialize(c), "test");
      ADD_FAILURE() << key << " was accepted";
    } catch (const model::ModelError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  refused("rope_interleave", false);
  refused("attention_bias", true);
  refused("moe_layer_freq", 2);
  refused("topk_method", "greedy");
  refused("scoring_func", "softmax");
  refused("n_group", 3);  // does not divide 8 experts
}

// The GPU backend runs MLA layers (tests/runtime/gpu/gpu_reference_test.cpp checks them against transformers); the
// q8 device KV, which it does not implement for the latent cache, is refused at construction by name (checked without
// a GPU: the checks run before the device is touched).
TEST(Deepseek, GpuLayersTakeMlaAndRefuseTheQ8LatentKvByName) {
  const model::ModelConfig c = model::load_config(fixture("deepseek_v3"));
  EXPECT_NO_THROW(gpu::GpuLayers::check_supported(c, c.num_layers));
  tiering::Ledger ledger;
  const model::ModelWeights w = model::load_model(fixture("deepseek_v3"), streaming(ledger, fixture("deepseek_v3")));
  gpu::GpuOptions o;
  o.layers = 2;
  o.kv_codec = gpu::GpuKvCodec::q8;
  try {
    gpu::GpuLayers g(w, o, 16, 64);
    ADD_FAILURE() << "the GPU backend accepted the q8 device KV on MLA layers";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("q8 device KV is not supported on MLA layers"), std::string::npos)
        << e.what();
  } catch (const std::runtime_error& e) {  // a build without the CUDA backend refuses every GPU layer
    if (std::string(e.what()).find("no CUDA backend") == std::string::npos) ADD_FAILURE() << e.what();
  }
}

// Chunks of 1, 5 and 24 give the whole prompt's logits: the latent rows written by earlier chunks are what later
// ones attend over.
TEST(Deepseek, ChunkedPrefillEqualsWhole) {
  tiering::Ledger ledger;
  const model::ModelWeights w = model::load_model(fixture("deepseek_v3"), streaming(ledger, fixture("deepseek_v3")));
  const std::vector<int32_t> prompt = fixtures::reference_prompt(fixture("deepseek_v3"));
  const std::vector<float> whole = fixtures::chunked_logits(w, ledger, prompt, int64_t(prompt.size()));
  for (int64_t chunk : {1, 5, 24}) {
    const std::vector<float> chunked = fixtures::chunked_logits(w, ledger, prompt, chunk);
    EXPECT_LT(fixtures::max_difference(chunked, whole), 1e-4) << "chunk " << chunk;
  }
}

// Two sequences batched by the scheduler (prefill chunks and decode steps shared) generate what each does alone.
TEST(Deepseek, SchedulerBatchOfTwoEqualsEachAlone) {
  using namespace fixtures::scheduler;
  tiering::Ledger ledger;
  model::LoadOptions o;
  o.ledger = &ledger;
  o.packed_experts = "";
  const model::ModelWeights w = model::load_model(fixture("deepseek_v3"), o);
  const auto a = random_tokens(19, 7), b = random_tokens(8, 8);
  engine::Scheduler batched(w, ledger, slots(2));
  auto ra = start(batched, a, 12), rb = start(batched, b, 12);
  ra->done.get_future().wait();
  rb->done.get_future().wait();
  EXPECT_GT(batched.stats().batched_rows_total, batched.stats().steps_total) << "the sequences shared steps";
  engine::Scheduler alone(w, ledger, slots(1));
  expect_same(*generate(alone, a, 12), *ra, "a");
  expect_same(*generate(alone, b, 12), *rb, "b");
}

// The latent cache: kv_lora_rank + rope floats per position and layer, charged to "kv" for the capacity.
TEST(Deepseek, LatentCacheIsInTheLedger) {
  tiering::Ledger ledger;
  const model::ModelConfig c = model::load_config(fixture("deepseek_v3"));
  for (int64_t capacity : {32, 4096}) {
    engine::KVCache cache(c, capacity, ledger);
    EXPECT_EQ(cache.bytes(), uint64_t(4 * capacity * (32 + 8)) * sizeof(float));
    EXPECT_EQ(ledger.used(tiering::accounts::kv), engine::KVCache::bytes_for(c, capacity));
    EXPECT_EQ(cache.bytes(), engine::KVCache::bytes_for(c, capacity));
  }
  EXPECT_EQ(ledger.used(tiering::accounts::kv), 0u);
  engine::KVCacheOptions q8;
  q8.codec = kv::Codec::q8;
  try {
    engine::KVCache cache(c, 32, ledger, q8);
    ADD_FAILURE() << "a q8 KV codec was accepted on MLA layers";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("MLA"), std::string::npos) << e.what();
  }
}

// The planner sizes MLA KV as the cache does (ModelProfile.layer_latent_floats -> StateSpec), through the wisdom
// JSON too, and its codec search finds only f32 usable on MLA layers.
TEST(Deepseek, PlannerSizesTheLatentCacheAsTheCacheDoes) {
  const model::ModelConfig c = model::load_config(fixture("deepseek_v3"));
  const calibrate::ModelProfile p =
      calibrate::model_profile_from_config(c, kernels::WeightFormat::f32, kernels::WeightFormat::f32);
  ASSERT_EQ(p.layer_latent_floats, (std::vector<int64_t>{40, 40, 40, 40}));
  const calibrate::ModelProfile back = calibrate::model_profile_from_json(calibrate::to_json(p));
  for (int64_t context : {256, 32768}) {
    EXPECT_EQ(calibrate::kv_sequence_bytes(p, "f32", context, 64), engine::KVCache::bytes_for(c, context));
    EXPECT_EQ(calibrate::kv_sequence_bytes(back, "f32", context, 64), engine::KVCache::bytes_for(c, context));
  }
  EXPECT_DOUBLE_EQ(calibrate::kv_bytes_per_token(p, "f32"), 4.0 * 40 * 4);
  for (const char* codec : {"f16", "q8", "turbo3"})
    EXPECT_THROW(calibrate::kv_sequence_bytes(p, codec, 256, 64), std::invalid_argument) << codec;
}

// MLA KV bytes per token (every layer, f32) against the same model with uncompressed KV (every head's key and
// value, f32), for the fixture and the published DeepSeek-V3 and V2-Lite configs (profiles/fit-configs, YaRN rope
// and V3's FP8 quantization as published) at 32K context.
TEST(Deepseek, LatentKvAgainstUncompressedAt32K) {
  const std::filesystem::path configs = std::filesystem::path(TIERLM_SOURCE_DIR) / "profiles/fit-configs";
  struct Case {
    const char* name;
    model::ModelConfig config;
    double expected_ratio;  // heads * (qk_head_dim + v_head_dim) / (kv_lora_rank + rope)
  };
  const Case cases[] = {
      {"fixture deepseek_v3", model::load_config(fixture("deepseek_v3")), 4.0 * (24 + 16) / (32 + 8)},
      {"DeepSeek-V3", model::load_config(configs / "deepseek-v3"), 128.0 * 320 / 576},
      {"DeepSeek-V2-Lite", model::load_config(configs / "deepseek-v2-lite"), 16.0 * 320 / 576},
  };
  const int64_t context = 32768;
  for (const Case& c : cases) {
    const uint64_t mla = engine::KVCache::bytes_for(c.config, context);
    double per_token = 0, uncompressed_per_token = 0;
    for (int64_t i = 0; i < c.config.num_layers; ++i) {
      per_token += c.config.state_spec(i).bytes_per_token({});
      uncompressed_per_token += double(c.config.mla.uncompressed_floats(c.config.num_heads) * sizeof(float));
    }
    EXPECT_EQ(mla, uint64_t(per_token) * uint64_t(context)) << c.name;
    EXPECT_NEAR(uncompressed_per_token / per_token, c.expected_ratio, 1e-9) << c.name;
    std::printf("[%s] MLA KV %.0f bytes/token (%.2f GiB at 32K) vs uncompressed %.0f bytes/token (%.2f GiB): %.1fx "
                "smaller\n", c.name, per_token, double(mla) / (1 << 30), uncompressed_per_token,
                uncompressed_per_token * context / (1 << 30), uncompressed_per_token / per_token);
  }
}

}  // namespace
