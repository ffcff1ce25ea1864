// bench/peer/tierlm_peer.cpp — tierlm's side of bench/peer.sh: loads a Hugging Face folder in a weight format (or
// "stored": as the folder holds it, e.g. an MLX 4-bit one; an MoE model with every expert resident), then
// prefills a fixed token-id prompt and decodes greedily, and prints one JSON line with prefill and decode tok/s and
// the greedy tokens (the peer side, llamacpp_peer.mjs, prints the same fields).
// A warm-up round (a short prompt and a few decode steps) runs first, as llama-bench and llamacpp_peer.mjs do, so
// the figures are steady state, not first use.
//
// Usage: tierlm_peer HF_DIR FORMAT|stored THREADS PROMPT_TOKENS DECODE_TOKENS
//        (env TIERLM_PEER_ROW_EXPERTS_APART=1: a decode row's resident experts one after another, the old way)
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/engine/forward.h"
#include "runtime/engine/generator.h"
#include "runtime/model/model.h"

using namespace tierlm;

namespace {

// The bench prompt: token ids spread over the vocabulary, past the placeholder vocabulary's special and byte tokens.
std::vector<int32_t> prompt_ids(int64_t n, int64_t vocab) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(int32_t(300 + (i * 7919) % (vocab - 300)));
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc != 6)
      throw std::invalid_argument("usage: tierlm_peer HF_DIR FORMAT THREADS PROMPT_TOKENS DECODE_TOKENS");
    const std::string dir = argv[1], format = argv[2];
    const int threads = std::atoi(argv[3]);
    const int64_t prompt = std::atoll(argv[4]), decode = std::atoll(argv[5]);
    tiering::Ledger ledger;
    model::LoadOptions options;
    options.ledger = &ledger;
    if (format != "stored") options.weight_format = kernels::parse_format(format);
    // An MoE model held wholly in RAM: every expert resident, read once at load (as a plan with room for all of
    // them makes it), so no step waits on the disk.
    const model::ModelConfig config = model::load_config(dir);
    if (config.arch.moe)
      for (int64_t l = 0; l < config.sparse_layers(); ++l)
        for (int64_t e = 0; e < config.num_experts; ++e) options.experts.cache.resident.emplace_back(l, e);
    const model::ModelWeights m = model::load_model(dir, options);
    kernels::ThreadPool pool(threads);
    const int64_t context = prompt + decode + 8, chunk = 512;
    engine::Forward forward(m, pool, ledger, chunk, context);
    // An A/B of a decode row's resident experts together (engine::MoeBlock::set_row_experts_together).
    if (const char* e = std::getenv("TIERLM_PEER_ROW_EXPERTS_APART"); e && *e == '1' && forward.moe())
      forward.moe()->set_row_experts_together(false);
    engine::Generator generator(forward, ledger, context);

    engine::GenerationRequest warm;
    warm.prompt = prompt_ids(16, m.config.vocab_size);
    warm.max_tokens = 4;
    warm.ignore_stop_tokens = true;
    generator.generate(warm, [](int32_t) { return true; });

    engine::GenerationRequest request;
    request.prompt = prompt_ids(prompt, m.config.vocab_size);
    request.max_tokens = decode;
    request.ignore_stop_tokens = true;
    std::vector<int32_t> tokens;
    const auto stats = generator.generate(request, [&](int32_t t) {
      tokens.push_back(t);
      return true;
    });
    // The first generated token comes from the prefill's logits; decode_seconds covers the other steps.
    const double decode_tps = double(stats.generated_tokens - 1) / stats.decode_seconds;
    std::string list;
    for (int32_t t : tokens) {
      if (!list.empty()) list += ',';
      list += std::to_string(t);
    }
    std::printf("%s\n", fmt::format(R"({{"engine":"tierlm","format":"{}","threads":{},"prompt_tokens":{},)"
                                    R"("prefill_tps":{:.2f},"decode_tps":{:.2f},"tokens":[{}]}})",
                                    format, pool.size(), stats.prompt_tokens, stats.prefill_tokens_per_second(),
                                    decode_tps, list)
                            .c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tierlm_peer: %s\n", e.what());
    return 1;
  }
}
