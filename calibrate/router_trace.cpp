// calibrate/router_trace.cpp — measure_model_profile: load a model, size every weight class from what was loaded,
// and for MoE models record which experts each layer's router picks for the calibration prompts.
//
// Routing is read through MoeBlock's routing observer, token by token. Afterwards the decode costs the planner needs
// are timed on this model (ModelTiming): a decode step with fixed routing whose experts are all in memory, one
// expert's matvecs, the router, and a miss, at each thread count asked for. The step minus its experts is the
// per-step fixed cost (dense weights, norms, attention, routing bookkeeping, thread-pool dispatch) of this model's
// shapes on this machine; nothing is a constant guessed elsewhere.
#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
#include <fstream>
#include <sstream>

#include "calibrate/kv_quality.h"
#include "calibrate/model_profile.h"
#include "runtime/engine/forward.h"
#include "runtime/engine/moe.h"
#include "runtime/engine/kv_cache.h"
#include "runtime/engine/ops.h"
#include "runtime/model/model.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tierlm::calibrate {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> read_prompts(const std::string& dir, int64_t max_prompts) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path());
  if (ec || files.empty())
    throw std::runtime_error("no calibration prompts (*.txt) in " + dir + " (use --prompts DIR)");
  std::sort(files.begin(), files.end());
  if (max_prompts > 0 && int64_t(files.size()) > max_prompts) files.resize(size_t(max_prompts));
  std::vector<std::string> prompts;
  for (auto& f : files) {
    std::ifstream in(f);
    std::stringstream s;
    s << in.rdbuf();
    if (!s.str().empty()) prompts.push_back(s.str());
  }
  return prompts;
}

// Sizes by class from the loaded weights (what the ledger really holds).
void measure_classes(const model::ModelWeights& m, ModelProfile& p) {
  const auto& c = m.config;
  auto bytes = [](const kernels::Weight& w) { return w.view.rows ? kernels::weight_bytes(w.view) : uint64_t(0); };
  const uint64_t embed = bytes(m.embed);
  const uint64_t row = c.vocab_size ? embed / uint64_t(c.vocab_size) : 0;
  p.classes.clear();
  p.classes.push_back({"embedding", embed, m.lm_head.view.rows ? row : embed});
  if (m.lm_head.view.rows) p.classes.push_back({"output", bytes(m.lm_head), bytes(m.lm_head)});
  uint64_t attention = 0, mlp = 0, router = 0, shared = 0, norms = m.final_norm.size() * 4;
  uint64_t per_layer_inputs = bytes(m.embed_per_layer) + bytes(m.per_layer_model_projection) +
                              m.per_layer_projection_norm.size() * 4;
  for (auto& L : m.layers) {
    // The mixer: attention's qkv and o, or a Gated DeltaNet's fused in-projection, out_proj and its small vectors,
    // or MLA's [q (a) | kv_a], q_b and the f32 halves of kv_b.
    attention += bytes(L.qkv) + bytes(L.linear_in) + bytes(L.o) + (L.qkv_bias.size() + L.o_bias.size()) * 4 +
                 (L.conv.size() + L.decay_rate.size() + L.dt_bias.size() + L.gated_norm.size()) * 4 +
                 bytes(L.mla_in) + bytes(L.q_b) + L.kv_b_key.size() + L.kv_b_value.size();
    norms += (L.q_a_norm.size() + L.kv_a_norm.size()) * 4;
    per_layer_inputs += bytes(L.per_layer_input_gate) + bytes(L.per_layer_projection) +
                        L.post_per_layer_input_norm.size() * 4;
    norms += (L.pre_feedforward_norm.size() + L.post_feedforward_norm.size() + L.post_feedforward_norm_1.size() +
              L.pre_feedforward_norm_2.size() + L.post_feedforward_norm_2.size() + L.router_scale.size() +
              L.per_expert_scale.size()) * 4;
    mlp += bytes(L.gate_up) + bytes(L.down) + (L.gate_up_bias.size() + L.down_bias.size()) * 4;
    router += bytes(L.router);
    shared += bytes(L.shared_gate_up) + bytes(L.shared_down) + L.shared_expert_gate.size() * 4;
    norms += (L.input_norm.size() + L.post_attention_norm.size() + L.q_norm.size() + L.k_norm.size()) * 4;
  }
  p.classes.push_back({"attention", attention, attention});
  p.classes.push_back({"norms", norms, norms});
  if (mlp) p.classes.push_back({"dense_mlp", mlp, mlp});
  if (router) p.classes.push_back({"router", router, router});
  if (shared) p.classes.push_back({"shared_expert", shared, shared});
  if (per_layer_inputs) p.classes.push_back({"per_layer_inputs", per_layer_inputs, per_layer_inputs});
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Median seconds per call of fn over repeats until `budget` seconds pass (at least 3 after one warm-up call).
template <class Fn>
double median_seconds(double budget, Fn fn) {
  fn();
  std::vector<double> samples;
  const auto start = Clock::now();
  while (samples.size() < 3 || seconds_since(start) < budget) {
    const auto t = Clock::now();
    fn();
    samples.push_back(seconds_since(t));
    if (samples.size() >= 10000) break;
  }
  std::nth_element(samples.begin(), samples.begin() + long(samples.size() / 2), samples.end());
  return samples[samples.size() / 2];
}

// Decode costs of this model at `threads` (see the file comment). When the cache holds layers * top_k slots, the
// fixed routing (experts 0..top_k-1 of every layer) stays in memory after its first step. When the memory budget
// left fewer (an unpacked bf16 model in a small cgroup), every such step misses, and what the misses cost beyond
// their read stall and conversion (submission, page pinning, fresh scratch pages) cannot be taken out of it: the
// DeepSeek-V2-Lite bf16 step measured 818 ms with those taken out against 319 ms with every expert in memory. Then
// no step is timed (step_seconds 0: the planner's analytic step, which is within 10% of the 319 ms there); the
// expert, router and miss timings are still measured.
ModelTiming time_decode(const model::ModelWeights& m, tiering::Ledger& ledger, int threads, double budget) {
  const auto& c = m.config;
  const int64_t L = c.sparse_layers(), k = c.num_experts_per_tok, E = c.num_experts, H = c.hidden_size;
  kernels::ThreadPool pool(threads);
  ModelTiming t;
  t.threads = pool.size();
  tiering::ExpertCache& cache = m.experts->cache();
  const int64_t slots = m.experts->telemetry().cache_slots;
  const int64_t context = 64;
  if (slots >= L * k) {
    engine::Forward forward(m, pool, ledger, 1, context);
    forward.moe()->set_prefetch(false);
    forward.moe()->set_routing_override([k](int64_t, int64_t, std::span<int32_t> ids, std::span<float> weights) {
      for (int64_t j = 0; j < k; ++j) {
        ids[size_t(j)] = int32_t(j);
        weights[size_t(j)] = 1.0f / float(k);
      }
    });
    std::vector<float> logits(size_t(c.vocab_size));
    std::optional<engine::KVCache> kv;
    int64_t pos = context;
    const int32_t token = 1 % int32_t(c.vocab_size);
    t.step_seconds = median_seconds(budget, [&] {
      if (pos + 1 >= context) {  // a fresh sequence every context - 1 steps: attention stays short, as traced
        kv.reset();
        kv.emplace(c, context, ledger);
        pos = 0;
      }
      forward.run(std::span(&token, 1), pos++, *kv, logits.data());
    });
  }

  // One expert on one row, cycling over every cached (layer, expert): the weights stream from RAM as in decode.
  // With fewer slots than layers x top_k, over the layers whose top_k the slots hold, so nothing misses.
  const int64_t cycled_layers = std::clamp<int64_t>(slots / std::max<int64_t>(k, 1), 1, L);
  const int64_t I = c.moe_intermediate_size;
  std::vector<float> x(static_cast<size_t>(H), 0.25f), ffn(static_cast<size_t>(2 * I));
  std::vector<float> act(static_cast<size_t>(I)), out(static_cast<size_t>(H)), router(static_cast<size_t>(E));
  for (int64_t l = 0; l < cycled_layers; ++l)  // fill the cycled experts first: the timed calls then only hit
    for (int32_t e = 0; e < int32_t(k); ++e) {
      cache.request(l, std::span(&e, 1));
      cache.acquire(l, e);
      cache.release(l, e);
    }
  int64_t layer = 0, j = 0;
  t.expert_seconds = median_seconds(budget, [&] {
    const int32_t e = int32_t(j);
    cache.request(layer, std::span(&e, 1));
    const tiering::ExpertViews v = cache.acquire(layer, e);
    kernels::matvec(v.gate_up, x.data(), ffn.data(), pool);
    engine::silu_gate(ffn.data(), I, act.data());
    kernels::matvec(v.down, act.data(), out.data(), pool);
    cache.release(layer, e);
    if (++j == k) {
      j = 0;
      layer = (layer + 1) % cycled_layers;
    }
  });
  std::vector<int32_t> order(static_cast<size_t>(E));
  layer = 0;
  t.router_seconds = median_seconds(budget, [&] {
    kernels::matvec(m.layers[size_t(layer)].router.view, x.data(), router.data(), pool);
    engine::softmax(router.data(), E);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return router[size_t(a)] > router[size_t(b)]; });
    layer = (layer + 1) % L;
  });

  // Misses: experts not in memory, one alone and top_k together (their reads overlap), from rotating layers.
  if (E > 2 * k) {
    auto not_cached = [&](int64_t l, int64_t count) {
      std::vector<int32_t> ids;
      for (int32_t e = 0; e < E && int64_t(ids.size()) < count; ++e)
        if (!cache.cached(l, e)) ids.push_back(e);
      return ids;
    };
    auto miss = [&](int64_t count) {
      const std::vector<int32_t> ids = not_cached(layer, count);
      cache.request(layer, ids);
      for (int32_t e : ids) cache.acquire(layer, e);
      for (int32_t e : ids) cache.release(layer, e);
      layer = (layer + 1) % L;
      return double(ids.size());
    };
    double n = 1;
    t.miss_seconds = median_seconds(budget / 2, [&] { n = miss(1); }) / n;
    t.miss_batch_seconds = median_seconds(budget / 2, [&] { n = miss(k); }) / n;
  }
  return t;
}

}  // namespace

ModelProfile measure_model_profile(const fs::path& dir, const ModelProfileOptions& options) {
  const model::ModelConfig config = model::load_config(dir);
  const bool moe = config.arch.moe && config.num_experts > 0;
  tiering::Ledger ledger(options.memory_budget_bytes ? options.memory_budget_bytes : tiering::Ledger::kUnlimited);
  model::LoadOptions load;
  load.ledger = &ledger;
  if (!options.weight_format.empty()) load.weight_format = kernels::parse_format(options.weight_format);
  if (moe) {
    // Enough slots that the timed decode step's fixed routing never misses; within a memory budget, what the dense
    // weights leave (at least one layer's top_k), and where that is fewer time_decode times no step.
    const int64_t every_step = config.sparse_layers() * config.num_experts_per_tok;
    load.experts.cache.slots = options.memory_budget_bytes ? 0 : every_step;
    load.experts.max_slots = every_step;
    load.experts.leave_free_bytes = std::min(kMeasureLeaveFreeBytes, options.memory_budget_bytes / 8);
    load.experts.cache.policy = tiering::CachePolicy::lru;
    load.experts.cache.resident.clear();
    load.experts.cache.prefetch_limit = 0;
  }
  if (options.progress) options.progress("loading model", 0, 1);
  model::ModelWeights m = model::load_model(dir, load);
  if (options.progress) options.progress("loading model", 1, 1);

  const auto wf = m.layers.empty() ? kernels::WeightFormat::f32 : m.layers[0].qkv.view.format;
  ModelProfile p = model_profile_from_config(config, wf, wf);
  p.path = fs::absolute(dir).string();
  p.name = dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
  measure_classes(m, p);
  p.fingerprint = model_fingerprint(dir, options.weight_format);
  {
    // The engine's scratch as Forward allocates it for this model (every layer kind's buffers: Gemma 4's wider full
    // layers and dense MLP beside the experts, DeltaNet projections, ...): linear in the rows of a step.
    kernels::ThreadPool one(1), two(2, /*pin=*/false);
    auto scratch_at = [&](int64_t rows, kernels::ThreadPool& pool) {
      const uint64_t before = ledger.used(tiering::accounts::scratch);
      engine::Forward f(m, pool, ledger, rows, 2);
      return ledger.used(tiering::accounts::scratch) - before;
    };
    const uint64_t at1 = scratch_at(1, one), at2 = scratch_at(2, one), two_threads = scratch_at(1, two);
    // The MoE block's lane (one, on this one-thread pool, of 1 and 2 rows) is counted apart: the planner charges one
    // per thread of the plan, each of up to kLaneRows rows.
    if (m.experts) {
      const tiering::ExpertLayout& e = m.experts->store().layout();
      p.lane_row_bytes = engine::moe_lane_bytes(e.format, e.hidden, e.intermediate, e.group_size, 1);
    }
    const uint64_t rows = at2 > at1 ? at2 - at1 : at1;
    p.scratch_row_bytes = rows > p.lane_row_bytes ? rows - p.lane_row_bytes : rows;
    p.scratch_fixed_bytes = at1 > rows ? at1 - rows : 0;
    // What each further thread adds beyond its lane (MLA's per-thread latent work).
    const uint64_t thread = two_threads > at1 ? two_threads - at1 : 0;
    p.scratch_thread_bytes = thread > p.lane_row_bytes ? thread - p.lane_row_bytes : 0;
  }
  {
    KvQualityOptions q;
    q.max_seconds = options.kv_quality_seconds;
    q.threads = options.threads;
    if (options.progress) options.progress("kv quality", 0, 1);
    measure_kv_quality(m, dir, ledger, q, p);
    if (options.progress) options.progress("kv quality", 1, 1);
  }
  if (!moe) {
    if (options.memory) options.memory->ledger_peak = ledger.peak();
    return p;
  }

  tiering::ExpertTier& tier = *m.experts;
  const auto& store = tier.store();
  p.expert_format = kernels::format_name(store.layout().format);
  p.expert_bytes = store.layout().bytes;
  p.expert_payload_bytes = store.layout().payload_bytes();
  p.expert_read_bytes = store.read_bytes(0, 0);
  p.expert_read_extents = store.read_lengths(0, 0);
  p.expert_staging_bytes = store.staging_bytes();
  p.expert_conversion_bytes = store.conversion_bytes();
  p.packed_experts = store.encoding() == tiering::ExpertEncoding::packed;
  p.load_scratch_bytes = std::max<uint64_t>(p.load_scratch_bytes, store.staging_bytes());
  p.classes.push_back({"experts", p.total_expert_bytes(), uint64_t(p.moe_layers * p.top_k) * p.expert_payload_bytes});

  // Router traces.
  const std::vector<std::string> prompts = read_prompts(options.prompts_dir, options.max_prompts);
  std::optional<tok::Tokenizer> tokenizer;
  if (fs::exists(dir / "tokenizer.json")) tokenizer = tok::Tokenizer::load(dir);
  const int64_t context = options.max_tokens_per_prompt + 1;
  kernels::ThreadPool pool(options.threads);
  RouterTrace local;
  RouterTrace& trace = options.trace ? *options.trace : local;
  trace = RouterTrace{config.sparse_layers(), config.num_experts, config.num_experts_per_tok, {}};
  const auto start = std::chrono::steady_clock::now();
  int64_t traced_prompts = 0;
  {
    engine::Forward forward(m, pool, ledger, 1, context);
    forward.moe()->set_prefetch(false);
    // One token per step: each layer's routing arrives once per step, layers in order, top_k ids each.
    std::vector<int32_t> step(size_t(config.sparse_layers() * config.num_experts_per_tok));
    forward.moe()->set_routing_observer([&](int64_t layer, int64_t n, std::span<const int32_t> ids) {
      if (n != 1 || int64_t(ids.size()) != config.num_experts_per_tok)
        throw std::logic_error("router trace: expected one row of top_k experts per layer and step");
      std::copy(ids.begin(), ids.end(), step.begin() + layer * config.num_experts_per_tok);
    });
    std::vector<float> logits(size_t(config.vocab_size));
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > options.max_seconds) break;
      std::vector<int32_t> tokens;
      if (tokenizer) {
        tokens = tokenizer->encode(prompts[i], /*add_special_tokens=*/true);
      } else {  // no tokenizer (synthetic models): bytes as token ids
        for (unsigned char ch : prompts[i]) tokens.push_back(int32_t(ch % uint32_t(config.vocab_size)));
      }
      if (int64_t(tokens.size()) > options.max_tokens_per_prompt) tokens.resize(size_t(options.max_tokens_per_prompt));
      engine::KVCache cache(config, context, ledger);
      for (size_t t = 0; t < tokens.size(); ++t) {
        forward.run(std::span(&tokens[t], 1), int64_t(t), cache, logits.data());
        trace.selections.insert(trace.selections.end(), step.begin(), step.end());
      }
      ++traced_prompts;
      if (options.progress) options.progress("router traces", i + 1, prompts.size());
    }
  }
  for (size_t i = 0; i < options.timing_threads.size(); ++i) {
    if (options.progress) options.progress("decode timings", i, options.timing_threads.size());
    p.timings.push_back(time_decode(m, ledger, options.timing_threads[i], options.timing_seconds));
  }
  if (options.progress && !options.timing_threads.empty())
    options.progress("decode timings", options.timing_threads.size(), options.timing_threads.size());
  p.expert_frequency = frequencies(trace);
  p.traced_prompts = traced_prompts;
  p.traced_tokens = trace.tokens();
  p.trace_selections = trace.selections;
  p.frequency_source = "router traces: " + std::to_string(traced_prompts) + " prompts, " +
                       std::to_string(p.traced_tokens) + " tokens from " + options.prompts_dir;
  if (p.traced_tokens == 0) throw std::runtime_error("router trace: no tokens traced (empty prompts?)");
  if (options.memory) *options.memory = {ledger.peak(), tier.telemetry().cache_slots};
  return p;
}

}  // namespace tierlm::calibrate
