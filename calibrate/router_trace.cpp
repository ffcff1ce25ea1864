// calibrate/router_trace.cpp — measure_model_profile: load a model, size every weight class from what was loaded,
// and for MoE models record which experts each layer's router picks for the calibration prompts.
//
// How routing is observed without a hook in the forward pass: the expert cache is configured with no resident
// experts, exactly layers * top_k LRU slots and prefetch off. One decode step requests exactly top_k distinct
// experts per layer, layers * top_k keys in all, each touched during that step; true LRU then holds exactly those
// keys afterwards, so after every step the cache's contents (ExpertCache::cached) are that token's routing.
// Every layer must show exactly top_k cached experts; a step where it does not is an error, not a guess.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include "calibrate/model_profile.h"
#include "runtime/engine/forward.h"
#include "runtime/engine/kv_cache.h"
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
  for (auto& L : m.layers) {
    attention += bytes(L.qkv) + bytes(L.o) + L.qkv_bias.size() * 4;
    mlp += bytes(L.gate_up) + bytes(L.down);
    router += bytes(L.router);
    shared += bytes(L.shared_gate_up) + bytes(L.shared_down) + L.shared_expert_gate.size() * 4;
    norms += (L.input_norm.size() + L.post_attention_norm.size() + L.q_norm.size() + L.k_norm.size()) * 4;
  }
  p.classes.push_back({"attention", attention, attention});
  p.classes.push_back({"norms", norms, norms});
  if (mlp) p.classes.push_back({"dense_mlp", mlp, mlp});
  if (router) p.classes.push_back({"router", router, router});
  if (shared) p.classes.push_back({"shared_expert", shared, shared});
}

}  // namespace

ModelProfile measure_model_profile(const fs::path& dir, const ModelProfileOptions& options) {
  const model::ModelConfig config = model::load_config(dir);
  const bool moe = config.arch.moe && config.num_experts > 0;
  tiering::Ledger ledger;
  model::LoadOptions load;
  load.ledger = &ledger;
  if (!options.weight_format.empty()) load.weight_format = kernels::parse_format(options.weight_format);
  if (moe) {
    load.experts.cache.slots = config.num_layers * config.num_experts_per_tok;
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
  if (!moe) return p;

  tiering::ExpertTier& tier = *m.experts;
  const auto& store = tier.store();
  p.expert_format = kernels::format_name(store.layout().format);
  p.expert_bytes = store.layout().bytes;
  p.expert_payload_bytes = store.layout().payload_bytes();
  p.expert_read_bytes = store.read_bytes(0, 0);
  p.expert_staging_bytes = store.staging_bytes();
  p.expert_conversion_bytes = store.conversion_bytes();
  p.packed_experts = store.encoding() == tiering::ExpertEncoding::packed;
  p.classes.push_back({"experts", p.total_expert_bytes(), uint64_t(p.moe_layers * p.top_k) * p.expert_payload_bytes});

  // Router traces.
  const std::vector<std::string> prompts = read_prompts(options.prompts_dir, options.max_prompts);
  std::optional<tok::Tokenizer> tokenizer;
  if (fs::exists(dir / "tokenizer.json")) tokenizer = tok::Tokenizer::load(dir);
  const int64_t context = options.max_tokens_per_prompt + 1;
  kernels::ThreadPool pool(options.threads);
  engine::Forward forward(m, pool, ledger, 1, context);
  forward.moe()->set_prefetch(false);
  std::vector<float> logits(size_t(config.vocab_size));
  RouterTrace local;
  RouterTrace& trace = options.trace ? *options.trace : local;
  trace = RouterTrace{config.num_layers, config.num_experts, config.num_experts_per_tok, {}};
  const auto start = std::chrono::steady_clock::now();
  int64_t traced_prompts = 0;
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
      for (int64_t l = 0; l < config.num_layers; ++l) {
        int64_t found = 0;
        for (int32_t e = 0; e < config.num_experts; ++e)
          if (tier.cache().cached(l, e)) {
            trace.selections.push_back(e);
            ++found;
          }
        if (found != config.num_experts_per_tok)
          throw std::logic_error("router trace: layer " + std::to_string(l) + " shows " + std::to_string(found) +
                                 " cached experts after a step, expected top_k = " +
                                 std::to_string(config.num_experts_per_tok) + " (expert cache is not plain LRU?)");
      }
    }
    ++traced_prompts;
    if (options.progress) options.progress("router traces", i + 1, prompts.size());
  }
  p.expert_frequency = frequencies(trace);
  p.traced_prompts = traced_prompts;
  p.traced_tokens = trace.tokens();
  p.frequency_source = "router traces: " + std::to_string(traced_prompts) + " prompts, " +
                       std::to_string(p.traced_tokens) + " tokens from " + options.prompts_dir;
  if (p.traced_tokens == 0) throw std::runtime_error("router trace: no tokens traced (empty prompts?)");
  return p;
}

}  // namespace tierlm::calibrate
