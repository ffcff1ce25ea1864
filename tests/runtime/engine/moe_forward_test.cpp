// Oracle: transformers 5.17 (tools/make_fixtures.py) for qwen3_moe, mixtral, olmoe, qwen2_moe and gemma4 (plus a
// windowed mixtral and dense/sparse interleaved qwen3_moe and qwen2_moe) — logits of every
// prompt position, 32 greedy tokens and the logits after each step. The expert tier is forced to stream: as many
// cache slots as one token's top-k, no resident experts, no prefetch, so every expert use is a read through the
// ExpertReader (checked with the tier's counters). Then the same with a warm cache, prefetch and a packed file:
// caching must never change a logit.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/runtime/engine/reference_fixture.h"

#include "runtime/engine/forward.h"
#include "runtime/engine/moe.h"
#include "runtime/model/model.h"
#include "runtime/model/moe_model.h"
#include "tests/runtime/model/safetensors_writer.h"

using namespace tierlm;
namespace json = boost::json;

namespace {

using tierlm::fixtures::fixture;

struct Result : fixtures::ReferenceMatch {
  bool greedy_exact = true;
  tiering::ExpertTierTelemetry telemetry;
};

Result run_fixture(const std::string& name, model::LoadOptions options) {
  tiering::Ledger ledger;
  options.ledger = &ledger;
  const model::ModelWeights w = model::load_model(fixture(name), options);
  Result r{fixtures::match_reference(w, ledger, fixture(name), 64), true, {}};
  r.greedy_exact = r.greedy_matches == r.greedy_total;
  r.telemetry = w.experts->telemetry();
  return r;
}

model::LoadOptions streaming_options(const std::string& name) {
  const auto config = model::load_config(fixture(name));
  model::LoadOptions o;
  o.experts.cache.slots = config.num_experts_per_tok;  // the minimum one token needs
  o.experts.cache.prefetch_limit = 0;
  o.packed_experts = "";  // never pick up a packed file lying in the fixture folder
  return o;
}

class MoeMatchesTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeMatchesTransformers, StreamingEveryExpert) {
  const std::string name = GetParam();
  const Result r = run_fixture(name, streaming_options(name));
  EXPECT_LT(r.prompt_error, 1e-3) << "prompt logits";
  EXPECT_LT(r.step_error, 1e-3) << "decode-step logits";
  EXPECT_TRUE(r.greedy_exact) << r.greedy_matches << "/" << r.greedy_total << " greedy tokens";
  const auto& t = r.telemetry;
  // Every use was a read: no hits at all, and the bytes read are exactly the misses' aligned extents.
  EXPECT_EQ(t.hits, 0u);
  EXPECT_GT(t.misses, 0u);
  EXPECT_GT(t.bytes_read, 0u);
  EXPECT_TRUE(t.io_uring);
  EXPECT_TRUE(t.direct_io) << "fixtures sit on a file system that should accept O_DIRECT";
  std::printf("[%s streaming] prompt rel err %.2e, step rel err %.2e, greedy %d/%d, expert reads: %llu misses, "
              "%llu hits, %.1f KiB read, stall %.3f ms\n",
              name.c_str(), r.prompt_error, r.step_error, r.greedy_matches, r.greedy_total,
              (unsigned long long)t.misses, (unsigned long long)t.hits, t.bytes_read / 1024.0,
              t.read_stall_seconds * 1e3);
}

TEST_P(MoeMatchesTransformers, WarmCacheWithPrefetchGivesTheSameLogits) {
  const std::string name = GetParam();
  model::LoadOptions o = streaming_options(name);
  o.experts.cache.slots = 4;  // fewer than the non-resident experts of every fixture: eviction and prefetch happen
  o.experts.cache.policy = tiering::CachePolicy::frequency;
  o.experts.cache.prefetch_limit = 2;
  o.experts.cache.resident = {{0, 0}, {1, 1}};
  const Result r = run_fixture(name, o);
  EXPECT_LT(r.prompt_error, 1e-3);
  EXPECT_LT(r.step_error, 1e-3);
  EXPECT_TRUE(r.greedy_exact);
  EXPECT_GT(r.telemetry.hits, 0u);
  EXPECT_GT(r.telemetry.prefetches, 0u);
  std::printf("[%s warm] hits %llu misses %llu (hit rate %.2f), prefetches %llu, prefetch hits %llu, wasted %llu\n",
              name.c_str(), (unsigned long long)r.telemetry.hits, (unsigned long long)r.telemetry.misses,
              r.telemetry.hit_rate(), (unsigned long long)r.telemetry.prefetches,
              (unsigned long long)r.telemetry.prefetch_hits, (unsigned long long)r.telemetry.prefetch_wasted);
}

TEST_P(MoeMatchesTransformers, PackedExpertsAreOneReadEach) {
  const std::string name = GetParam();
  test::TempDir dir;
  // MLX folders are packed in their own format, so the streamed experts run the MLX kernels.
  const bool mlx = name.find("-mlx") != std::string::npos;
  const auto packed = model::pack_experts(fixture(name), mlx ? std::nullopt : std::optional(kernels::WeightFormat::f32),
                                          dir / "experts.tierlm");
  EXPECT_EQ(packed.file_bytes, tiering::kPackedHeaderBytes + uint64_t(packed.experts) * packed.expert_bytes);
  EXPECT_EQ(packed.expert_bytes % 4096, 0u);
  model::LoadOptions o = streaming_options(name);
  o.packed_experts = packed.path;
  const Result r = run_fixture(name, o);
  EXPECT_LT(r.prompt_error, 1e-3);
  EXPECT_LT(r.step_error, 1e-3);
  EXPECT_TRUE(r.greedy_exact);
  EXPECT_EQ(r.telemetry.hits, 0u);
  EXPECT_EQ(r.telemetry.bytes_read, r.telemetry.misses * packed.expert_bytes);  // one aligned block per miss
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MoeMatchesTransformers,
                         // -swa: sliding_window 8 on every layer; -mixed: dense MLP layers among sparse ones
                         // (qwen3_moe: mlp_only_layers [2]; qwen2_moe: decoder_sparse_step 2, mlp_only_layers [0]);
                         // qwen3_5_moe: Gated DeltaNet layers, names under model.language_model. (and model.).
                         // gemma4: fused experts.gate_up_proj / down_proj beside a dense MLP, per_expert_scale
                         // (gemma4-cg: the same under model.language_model., next to vision tensors).
                         // gpt_oss: experts stored as x @ W ([E, H, 2I], interleaved gate/up) with biases;
                         // gpt_oss-mxfp4: MXFP4 blocks + scales (packed here widened to f32).
                         // -mlx4: mlx-lm 4-bit layouts, their experts streamed from the safetensors / a packed
                         // file in MLX format and multiplied with f32 activations.
                         ::testing::Values("qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "mixtral-swa",
                                           "qwen3_moe-mixed", "qwen2_moe-mixed", "qwen3_5_moe", "qwen3_5_moe-text",
                                           "gemma4-moe", "gemma4-cg", "gpt_oss", "gpt_oss-mxfp4", "qwen3_5_moe-mlx4",
                                           "gemma4-moe-mlx4"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(MoeForward, BatchOfSequencesEqualsEachAlone) {
  tiering::Ledger ledger;
  model::LoadOptions options = streaming_options("qwen2_moe");
  options.ledger = &ledger;
  options.experts.cache.slots = 3;
  auto w = model::load_model(fixture("qwen2_moe"), options);
  kernels::ThreadPool pool(2);
  const int64_t V = w.config.vocab_size;
  engine::Forward f(w, pool, ledger, 32, 64);
  std::vector<int32_t> a = {5, 17, 200, 33, 4}, b = {99, 150, 7};
  engine::KVCache ca(w.config, 64, ledger), cb(w.config, 64, ledger), ca2(w.config, 64, ledger),
      cb2(w.config, 64, ledger);
  std::vector<float> la(static_cast<size_t>(V)), lb(la), ta(la), tb(la);
  f.run(a, 0, ca, la.data());
  f.run(b, 0, cb, lb.data());
  engine::BatchItem items[2] = {{a, 0, &ca2, ta.data()}, {b, 0, &cb2, tb.data()}};
  f.run_batch(items);
  for (int64_t i = 0; i < V; ++i) {
    EXPECT_NEAR(la[size_t(i)], ta[size_t(i)], 1e-4f);
    EXPECT_NEAR(lb[size_t(i)], tb[size_t(i)], 1e-4f);
  }
}

// A chunk long enough that each expert's rows x intermediate reach kParallelGateElements (its gate then runs on the
// pool) and its rows are routed on the pool gives the logits of the same tokens fed in chunks of 8, whose experts'
// gates and routing run on the calling thread.
TEST(MoeForward, GatesAndRoutingSpreadOverThePoolGiveWhatTheSerialOnesGive) {
  tiering::Ledger ledger;
  model::LoadOptions options = streaming_options("qwen2_moe");
  options.ledger = &ledger;
  auto w = model::load_model(fixture("qwen2_moe"), options);
  const int64_t V = w.config.vocab_size, n = 1024;
  // 1024 rows x top-2 over 8 experts: ~256 rows an expert, 256 x 32 = 8192 values; 8 rows: at most 8 x 32.
  ASSERT_GE(n * w.config.num_experts_per_tok / w.config.num_experts * w.config.moe_intermediate_size / 2,
            engine::kParallelGateElements);
  ASSERT_LT(8 * w.config.moe_intermediate_size, engine::kParallelGateElements);  // an expert gets <= 8 rows
  ASSERT_LT(8, engine::kParallelRouteRows);
  ASSERT_GE(n, engine::kParallelRouteRows);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[size_t(i)] = int32_t((i * 7919 + 13) % V);
  kernels::ThreadPool pool(4);
  std::vector<float> whole(static_cast<size_t>(V)), chunked(static_cast<size_t>(V));
  {
    engine::Forward f(w, pool, ledger, n, n);
    engine::KVCache cache(w.config, n, ledger);
    f.run(tokens, 0, cache, whole.data());
  }
  {
    engine::Forward f(w, pool, ledger, 8, n);
    engine::KVCache cache(w.config, n, ledger);
    for (int64_t s = 0; s < n; s += 8)
      f.run(std::span<const int32_t>(tokens).subspan(size_t(s), 8), s, cache, chunked.data());
  }
  for (int64_t i = 0; i < V; ++i) ASSERT_NEAR(whole[size_t(i)], chunked[size_t(i)], 1e-3f) << "logit " << i;
}

// Prefill's experts on lanes (each pool thread whole experts on a serial pool, outputs added afterwards in batch
// order) give the residual bit for bit what each expert split over the pool gives: MLX 4-bit (f32 activations),
// MXFP4 with gpt-oss's biases and interleaved gate, DeepSeek's MLX experts with its shared experts. Rows: a few per
// expert (cut into pieces of 4 on 3 lanes) and more than kLaneRows for some (pieces of up to kLaneRows); the
// cache either streams (as many slots as one row's top-k: several batches, reads landing while lanes run) or holds
// every expert.
TEST(MoeForward, ExpertsOnLanesGiveTheSumsOfExpertsSplitOverThePool) {
  for (const std::string name : {"qwen3_5_moe-mlx4", "gpt_oss-mxfp4", "deepseek_v3-mlx4"}) {
    for (bool streaming : {true, false}) {
      const auto config = model::load_config(fixture(name));
      const int64_t many = 2 * engine::kLaneRows * config.num_experts / config.num_experts_per_tok;
      for (int64_t n : {int64_t(24), many}) {
        SCOPED_TRACE(name + (streaming ? " streaming" : " in memory") + ", " + std::to_string(n) + " rows");
        // Each mode on a model of its own: what the cache holds orders a step's experts, and so its sums.
        auto run = [&](bool lanes) {
          tiering::Ledger ledger;
          model::LoadOptions o = streaming ? streaming_options(name) : model::LoadOptions{};
          o.packed_experts = "";
          o.ledger = &ledger;
          auto w = model::load_model(fixture(name), o);
          int64_t layer = 0;
          while (w.config.layer(layer).expert_layer < 0) ++layer;
          const int64_t H = w.config.hidden_size;
          kernels::ThreadPool pool(3);
          engine::MoeBlock block(w, pool, ledger, n);
          EXPECT_TRUE(block.lanes()) << "the experts' format takes lanes";
          block.set_lanes(lanes);
          std::vector<float> x(size_t(n * H)), hidden(size_t(n * H));
          for (size_t i = 0; i < x.size(); ++i) {
            x[i] = float(int64_t(i * 7919 % 61) - 30) / 16.0f;
            hidden[i] = float(int64_t(i * 104729 % 37) - 18) / 8.0f;
          }
          const std::vector<float> base = hidden;
          block.accumulate(layer, x.data(), n, hidden.data());
          EXPECT_NE(hidden, base) << "the experts added nothing";
          return hidden;
        };
        const std::vector<float> on = run(true), off = run(false);
        ASSERT_EQ(on.size(), off.size());
        for (size_t i = 0; i < on.size(); ++i) ASSERT_EQ(on[i], off[i]) << "element " << i;
      }
    }
  }
}

// A decode row's resident experts run together (kernels::matvec_batch: their gate_ups in one dispatch, their downs in
// another) and give, bit for bit, what they give one after another: MLX 4-bit, f32 and q4 experts, gpt-oss's biases
// (bf16), DeepSeek's shared expert; every expert resident or only half of each layer's (the resident head of a
// step's batch together, the rest one by one after it). MXFP4 experts run one after another either way.
TEST(MoeForward, ResidentExpertsOfADecodeRowTogetherGiveTheSumsOfOneAfterAnother) {
  struct Case {
    std::string name, format;
    bool together;  // whether the experts can run together
  };
  int64_t half_runs = 0;
  for (const Case& c : {Case{"qwen3_5_moe-mlx4", "", true}, Case{"qwen3_moe", "", true}, Case{"qwen3_moe", "q4", true},
                        Case{"gpt_oss", "", true}, Case{"deepseek_v3-mlx4", "", true},
                        Case{"gpt_oss-mxfp4", "", false}}) {
    for (bool half : {false, true}) {
      SCOPED_TRACE(c.name + " " + c.format + (half ? " half resident" : " all resident"));
      const auto config = model::load_config(fixture(c.name));
      auto run = [&](bool together, int64_t& runs) {
        tiering::Ledger ledger;
        model::LoadOptions o;
        o.packed_experts = "";
        o.ledger = &ledger;
        if (!c.format.empty()) o.weight_format = kernels::parse_format(c.format);
        for (int64_t l = 0; l < config.sparse_layers(); ++l)
          for (int64_t e = 0; e < config.num_experts; e += half ? 2 : 1) o.experts.cache.resident.emplace_back(l, e);
        o.experts.cache.slots = config.num_experts;
        auto w = model::load_model(fixture(c.name), o);
        const int64_t H = w.config.hidden_size;
        kernels::ThreadPool pool(3);
        engine::MoeBlock block(w, pool, ledger, 4);
        block.set_row_experts_together(together);
        std::vector<float> out;
        for (int64_t layer = 0; layer < w.config.num_layers; ++layer) {
          if (w.config.layer(layer).expert_layer < 0) continue;
          for (int64_t row = 0; row < 3; ++row) {
            std::vector<float> x(static_cast<size_t>(H)), hidden(static_cast<size_t>(H));
            for (int64_t i = 0; i < H; ++i) {
              x[size_t(i)] = float((i * 7919 + row * 131 + layer * 17) % 61 - 30) / 16.0f;
              hidden[size_t(i)] = float((i * 104729 + row) % 37 - 18) / 8.0f;
            }
            block.accumulate(layer, x.data(), 1, hidden.data());
            out.insert(out.end(), hidden.begin(), hidden.end());
          }
        }
        runs = block.row_experts_together_runs();
        return out;
      };
      int64_t runs_on = 0, runs_off = 0;
      const std::vector<float> on = run(true, runs_on), off = run(false, runs_off);
      EXPECT_EQ(runs_off, 0);
      if (!c.together) {
        EXPECT_EQ(runs_on, 0);
      } else if (!half) {
        EXPECT_GT(runs_on, 0) << "the resident experts never ran together";
      } else {
        half_runs += runs_on;  // a small model's step may never start with two resident experts
      }
      ASSERT_EQ(on.size(), off.size());
      for (size_t i = 0; i < on.size(); ++i) ASSERT_EQ(on[i], off[i]) << "element " << i;
    }
  }
  EXPECT_GT(half_runs, 0) << "no half-resident step ran its resident head together";
}

// The routed entry (MoeBlock::accumulate_routed, what the GPU layers' hybrid placement calls with the choices they
// route on the host) gives, bit for bit, what accumulate gives for the same choices (a routing override), on one
// row and on a prefill's rows (the lanes); and choices split in two calls (kNotHere marking the other call's) sum
// to the whole within f32 rounding. Fixtures without a shared expert (accumulate_routed runs none): SiLU, gpt-oss's
// biases and clamped SwiGLU, OLMoE.
TEST(MoeForward, RoutedEntryGivesWhatTheRouterPathGivesForTheSameChoices) {
  for (const std::string name : {"qwen3_moe", "gpt_oss", "olmoe"}) {
    for (int64_t n : {int64_t(1), int64_t(24)}) {
      SCOPED_TRACE(name + ", " + std::to_string(n) + " rows");
      tiering::Ledger ledger;
      model::LoadOptions o;
      o.packed_experts = "";
      o.ledger = &ledger;
      auto w = model::load_model(fixture(name), o);
      ASSERT_EQ(w.layers[0].shared_down.view.rows, 0) << "a fixture without a shared expert";
      const int64_t H = w.config.hidden_size, E = w.config.num_experts, k = w.config.num_experts_per_tok;
      kernels::ThreadPool pool(3);
      engine::MoeBlock block(w, pool, ledger, n);
      auto choice = [&](int64_t layer, int64_t row, int64_t j) { return int32_t((row * 5 + layer * 3 + j) % E); };
      auto weight = [&](int64_t row, int64_t j) { return 0.25f + 0.125f * float(j) + 0.01f * float(row); };
      block.set_routing_override([&](int64_t layer, int64_t row, std::span<int32_t> ids, std::span<float> wts) {
        for (int64_t j = 0; j < k; ++j) ids[size_t(j)] = choice(layer, row, j), wts[size_t(j)] = weight(row, j);
      });
      engine::MoeBlock routed(w, pool, ledger, n);
      for (int64_t layer = 0; layer < w.config.num_layers; ++layer) {
        if (w.config.layer(layer).expert_layer < 0) continue;
        const int64_t el = w.config.layer(layer).expert_layer;
        std::vector<float> x(size_t(n * H)), base(size_t(n * H));
        for (size_t i = 0; i < x.size(); ++i) {
          x[i] = float(int64_t(i * 7919 % 61) - 30) / 16.0f;
          base[i] = float(int64_t(i * 104729 % 37) - 18) / 8.0f;
        }
        std::vector<int32_t> ids(size_t(n * k)), first(size_t(n * k)), second(size_t(n * k));
        std::vector<float> wts(size_t(n * k));
        for (int64_t r = 0; r < n; ++r)
          for (int64_t j = 0; j < k; ++j) {
            const size_t at = size_t(r * k + j);
            ids[at] = choice(el, r, j), wts[at] = weight(r, j);
            first[at] = ids[at] % 2 == 0 ? ids[at] : engine::MoeBlock::kNotHere;
            second[at] = ids[at] % 2 == 0 ? engine::MoeBlock::kNotHere : ids[at];
          }
        std::vector<float> by_router = base, by_entry = base, split(size_t(n * H), 0.0f);
        block.accumulate(layer, x.data(), n, by_router.data());
        routed.accumulate_routed(layer, x.data(), n, ids, wts, by_entry.data());
        ASSERT_NE(by_router, base) << "the experts added nothing";
        for (size_t i = 0; i < by_router.size(); ++i) ASSERT_EQ(by_router[i], by_entry[i]) << "element " << i;
        routed.accumulate_routed(layer, x.data(), n, first, wts, split.data());
        routed.accumulate_routed(layer, x.data(), n, second, wts, split.data());
        double worst = 0, scale = 0;
        for (size_t i = 0; i < split.size(); ++i) {
          worst = std::max(worst, double(std::fabs(split[i] + base[i] - by_entry[i])));
          scale = std::max(scale, double(std::fabs(by_entry[i] - base[i])));
        }
        EXPECT_LE(worst, 1e-5 * scale) << "layer " << layer;
      }
      // Bad calls are refused: more rows than the block holds, choices that are not n rows.
      std::vector<float> x(size_t((n + 1) * H)), h(size_t((n + 1) * H));
      std::vector<int32_t> ids(size_t((n + 1) * k), 0);
      std::vector<float> wts(size_t((n + 1) * k), 1.0f);
      int64_t sparse = 0;
      while (w.config.layer(sparse).expert_layer < 0) ++sparse;
      EXPECT_THROW(routed.accumulate_routed(sparse, x.data(), n + 1, ids, wts, h.data()), std::invalid_argument);
      EXPECT_THROW(routed.accumulate_routed(sparse, x.data(), n, std::span(ids).first(size_t(n * k + 1)),
                                            std::span(wts).first(size_t(n * k + 1)), h.data()),
                   std::invalid_argument);
    }
  }
}

// The lookahead's depth: one decode row through the first sparse layer starts reads for the next sparse layer only,
// or, with lookahead_layers 2, for the one after it too (each guessed through its own router).
TEST(MoeForward, LookaheadLayersReachTheSparseLayerAfterNext) {
  for (int64_t depth : {1, 2}) {
    tiering::Ledger ledger;
    model::LoadOptions o = streaming_options("qwen3_5_moe-text");
    o.ledger = &ledger;
    o.experts.cache.slots = 8;
    o.experts.cache.prefetch_limit = 8;
    o.experts.cache.lookahead_layers = depth;
    auto w = model::load_model(fixture("qwen3_5_moe-text"), o);
    std::vector<int64_t> sparse;
    for (int64_t i = 0; i < w.config.num_layers; ++i)
      if (w.config.layer(i).expert_layer >= 0) sparse.push_back(i);
    ASSERT_GE(sparse.size(), 3u);
    kernels::ThreadPool pool(2);
    engine::MoeBlock block(w, pool, ledger, 4);
    const int64_t H = w.config.hidden_size;
    std::vector<float> x(static_cast<size_t>(H)), hidden(static_cast<size_t>(H), 0.0f);
    for (int64_t i = 0; i < H; ++i) x[size_t(i)] = float((i * 37) % 17) / 8.0f - 1.0f;
    w.experts->cache().reset_counters();
    block.accumulate(sparse[0], x.data(), 1, hidden.data());
    const tiering::ExpertTierTelemetry t = w.experts->telemetry();
    const auto next = size_t(w.config.layer(sparse[1]).expert_layer);
    const auto after = size_t(w.config.layer(sparse[2]).expert_layer);
    EXPECT_GT(t.layers[next].prefetches, 0u) << "depth " << depth;
    if (depth == 1)
      EXPECT_EQ(t.layers[after].prefetches, 0u);
    else
      EXPECT_GT(t.layers[after].prefetches, 0u);
  }
}

TEST(MoeConfig, RejectsBadExpertCounts) {
  std::string text = R"({"model_type": "qwen3_moe", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_experts": 4, "num_experts_per_tok": 5, "moe_intermediate_size": 8})";
  EXPECT_THROW(model::parse_config(text, "test"), model::ModelError);
  text = R"({"model_type": "qwen2_moe", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8})";
  EXPECT_THROW(model::parse_config(text, "test"), model::ModelError);  // no shared_expert_intermediate_size
}

}  // namespace
