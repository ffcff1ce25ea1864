// `tierlm perplexity` — a model's perplexity on a text with each KV cache codec, and each lossy codec's increase
// over the exact f32 cache: the measure calibrate uses to let the planner pick a lossy codec (see profiles/text).
// stdout: the table, or JSON with --json; progress goes to stderr.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>

#include "runtime/cli/commands.h"
#include "runtime/cli/model_setup.h"
#include "runtime/engine/perplexity.h"
#include "runtime/kv/codec.h"

namespace tierlm::cli {

namespace {

struct PerplexityOptions {
  std::string model = default_model_dir();
  std::string text = std::string(TIERLM_SOURCE_DIR) + "/profiles/text/kv-quality.txt";
  std::vector<std::string> codecs = {"f32", "f16", "q8", "turbo4", "turbo3"};
  int64_t max_tokens = 1024;
  int64_t chunk = 64;
  int threads = 0;
  std::string weight_format;
  bool json = false;
};

void run(const PerplexityOptions& o) {
  std::ifstream in(o.text, std::ios::binary);
  if (!in) throw std::runtime_error("perplexity: cannot read the text file " + o.text);
  std::stringstream ss;
  ss << in.rdbuf();
  LoadedModel loaded = load_for_cli(o.model, 0, o.weight_format, {});
  std::vector<int32_t> tokens = loaded.tokenizer.encode(ss.str(), /*add_special_tokens=*/true);
  int64_t limit = o.max_tokens;
  if (loaded.weights.config.max_position_embeddings > 0)
    limit = std::min<int64_t>(limit, loaded.weights.config.max_position_embeddings);
  if (int64_t(tokens.size()) > limit) tokens.resize(size_t(limit));
  if (tokens.size() < 2) throw std::runtime_error("perplexity: the text gives fewer than two tokens");
  kernels::ThreadPool pool(o.threads);
  std::fprintf(stderr, "perplexity: %zu tokens of %s, chunk %lld, %d threads\n", tokens.size(), o.text.c_str(),
               (long long)o.chunk, pool.size());
  boost::json::array rows;
  double base = 0;
  for (size_t i = 0; i < o.codecs.size(); ++i) {
    engine::KVCacheOptions kv;
    kv.codec = kv::parse_codec(o.codecs[i]);
    const engine::PerplexityResult r =
        engine::perplexity(loaded.weights, pool, *loaded.ledger, tokens, kv, o.chunk);
    if (i == 0) base = r.perplexity();
    const double increase = r.perplexity() / base - 1;
    rows.push_back({{"codec", o.codecs[i]}, {"tokens", r.predicted}, {"mean_nll", r.mean_nll},
                    {"perplexity", r.perplexity()}, {"increase", increase}});
    std::fprintf(stderr, "  %s: perplexity %.4f\n", o.codecs[i].c_str(), r.perplexity());
  }
  if (o.json) {
    std::printf("%s\n", boost::json::serialize(boost::json::object{
                                                   {"model", o.model}, {"text", o.text}, {"chunk", o.chunk},
                                                   {"baseline", o.codecs[0]}, {"codecs", rows}})
                            .c_str());
    return;
  }
  std::printf("| codec | tokens | perplexity | vs %s |\n|---|---|---|---|\n", o.codecs[0].c_str());
  for (auto& v : rows) {
    const auto& r = v.as_object();
    std::printf("| %s | %lld | %.4f | %+.2f%% |\n", r.at("codec").as_string().c_str(), (long long)r.at("tokens").as_int64(),
                r.at("perplexity").as_double(), 100 * r.at("increase").as_double());
  }
}

}  // namespace

void add_perplexity_command(CLI::App& app) {
  auto o = std::make_shared<PerplexityOptions>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of a text with each KV cache codec (teacher forcing)");
  cmd->add_option("--model,-m", o->model, "Model folder or hub id (default: the embedded tierlm-tiny)");
  cmd->add_option("--text", o->text, "Text file (default: profiles/text/kv-quality.txt)")->capture_default_str();
  cmd->add_option("--kv-codec", o->codecs, "Codecs to measure, the first is the baseline")
      ->delimiter(',')
      ->check(CLI::IsMember({"f32", "f16", "q8", "turbo3", "turbo4"}))
      ->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens of the text scored at most (and at most the model's context)")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 22))
      ->capture_default_str();
  cmd->add_option("--chunk", o->chunk, "Tokens per forward pass (attention reads earlier tokens through the codec)")
      ->check(CLI::Range(int64_t(1), int64_t(8192)))
      ->capture_default_str();
  cmd->add_option("--threads,-t", o->threads, "Worker threads (0: one per physical core)");
  cmd->add_option("--weight-format", o->weight_format, "Convert weights at load: f32, f16, bf16, q8_0, q4");
  cmd->add_flag("--json", o->json, "Print JSON instead of the table");
  cmd->callback([o] {
    o->model = resolve_model(o->model);
    run(*o);
  });
}

}  // namespace tierlm::cli
