// bench/kv_loss_bench.cpp — where a turbo KV codec's perplexity loss comes from, on a trained model
// (default tests/fixtures/models/code-small and the first 1,024 ids of its reference text): for each turbo variant
// (bits of keys and values, QJL or not) the perplexity increase over the exact f32 cache, how the per-token NLL
// difference spreads over positions (the first block, the largest few, the rest), and the increase when only one
// layer uses the codec (the others exact). Not a timing benchmark: a study printed as a table.
// Run: build/bench/kv_loss_bench [model_dir] [tokens] [--no-layers]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "runtime/engine/perplexity.h"
#include "runtime/kv/codec.h"
#include "runtime/model/model.h"

using namespace tierlm;

namespace {

std::vector<int32_t> reference_ids(const std::string& dir) {
  std::ifstream in(dir + "/reference.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const boost::json::value ref = boost::json::parse(ss.str());
  std::vector<int32_t> ids;
  for (auto& t : ref.at("text").at("ids").as_array()) ids.push_back(int32_t(t.as_int64()));
  return ids;
}

struct Variant {
  const char* name;
  kv::TurboSpec spec;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : std::string(TIERLM_SOURCE_DIR) + "/tests/fixtures/models/code-small";
  const size_t limit = argc > 2 ? size_t(std::stoul(argv[2])) : 1024;
  const bool by_layer = !(argc > 3 && std::string(argv[3]) == "--no-layers");
  tiering::Ledger ledger;
  model::LoadOptions load;
  load.ledger = &ledger;
  const model::ModelWeights w = model::load_model(dir, load);
  kernels::ThreadPool pool(0);
  std::vector<int32_t> ids = reference_ids(dir);
  if (ids.size() > limit) ids.resize(limit);
  const int64_t layers = w.config.num_layers;
  const auto exact = engine::perplexity(w, pool, ledger, ids, {kv::Codec::f32, {}, {}}, 64);
  std::printf("model %s, %zu tokens, exact perplexity %.4f\n", dir.c_str(), ids.size(), exact.perplexity());
  const Variant variants[] = {
      {"k3+qjl v3 (old turbo3)", {3, true, 3}}, {"k4 v4 (turbo4)", {4, false, 4}},
      {"k4 v3 (turbo3)", {4, false, 3}},        {"k3+qjl v4", {3, true, 4}},
      {"k3 v4", {3, false, 4}},                 {"k4 v2", {4, false, 2}},
      {"k3 v3", {3, false, 3}},
  };
  std::printf("| variant | bits/value | ppl increase | first 32 | top 10 after them | rest | per layer (only it "
              "turbo) |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Variant& v : variants) {
    engine::KVCacheOptions o{kv::Codec::turbo3, {}, v.spec};
    const auto r = engine::perplexity(w, pool, ledger, ids, o, 64);
    const kv::CodecLayout L = kv::turbo_layout(v.spec, int(w.config.head_dim));
    const double bits = 8.0 * double(L.head_bytes()) / (2.0 * kv::kBlockTokens * L.head_dim);
    std::vector<double> diff(r.nll.size());
    for (size_t i = 0; i < diff.size(); ++i) diff[i] = r.nll[i] - exact.nll[i];
    const double total = std::accumulate(diff.begin(), diff.end(), 0.0);
    const double first = std::accumulate(diff.begin(), diff.begin() + std::min<size_t>(32, diff.size()), 0.0);
    std::vector<size_t> order(diff.size() - std::min<size_t>(32, diff.size()));
    std::iota(order.begin(), order.end(), std::min<size_t>(32, diff.size()));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return std::fabs(diff[a]) > std::fabs(diff[b]); });
    double top = 0;
    std::string where;
    for (size_t i = 0; i < std::min<size_t>(10, order.size()); ++i) {
      top += diff[order[i]];
      if (i < 4) where += std::to_string(order[i]) + ":" + std::to_string(diff[order[i]]).substr(0, 6) + " ";
    }
    std::string per_layer;
    for (int64_t l = 0; l < (by_layer ? layers : 0); ++l) {
      engine::KVCacheOptions one{kv::Codec::f32, std::vector<kv::Codec>(size_t(layers), kv::Codec::f32), v.spec};
      one.per_layer[size_t(l)] = kv::Codec::turbo3;
      const double p = engine::perplexity(w, pool, ledger, ids, one, 64).perplexity();
      per_layer += std::to_string(100 * (p / exact.perplexity() - 1)).substr(0, 5) + "% ";
    }
    const double n = double(diff.size());
    std::printf("| %s | %.3f | %+.3f%% | %+.4f | %+.4f (%s) | %+.4f | %s |\n", v.name, bits,
                100 * (r.perplexity() / exact.perplexity() - 1), first / n, top / n, where.c_str(),
                (total - first - top) / n, per_layer.c_str());
  }
  std::printf("(first 32 positions / the 10 largest after them / rest: their share of the mean NLL increase, nats "
              "per token; the 4 largest are listed as position:difference)\n");
}
