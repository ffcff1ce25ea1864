// tests/tools/write_moe_fixture.cpp — writes a servable synthetic MoE model folder for the CLI end-to-end tests: the
// Qwen3-MoE-shaped random model of runtime/model/synthetic_moe.h (dense f32 weights, 4-bit experts in an
// expert-major experts.tierlm, so the experts dominate its size) with the embedded default model's tokenizer
// (its vocabulary sizes the model), so `tierlm calibrate` and `tierlm serve` take it like a user's folder.
// usage: write_moe_fixture DIR LAYERS EXPERTS TOP_K HIDDEN EXPERT_INTERMEDIATE [HEADS KV_HEADS HEAD_DIM]
// (attention by default: head_dim 64, hidden / 64 heads, a quarter of them kv heads)
// Prints the folder's total bytes on stdout.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <boost/json.hpp>

#include "runtime/model/synthetic_moe.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 7 && argc != 10) {
    std::fprintf(stderr, "usage: %s DIR LAYERS EXPERTS TOP_K HIDDEN EXPERT_INTERMEDIATE [HEADS KV_HEADS HEAD_DIM]\n",
                 argv[0]);
    return 2;
  }
  try {
    const fs::path dir = argv[1];
    const fs::path tokenizer_dir = fs::path(TIERLM_SOURCE_DIR) / "profiles/models/tierlm-tiny";
    tierlm::model::SyntheticMoeSpec s;
    s.layers = std::stoll(argv[2]);
    s.experts = std::stoll(argv[3]);
    s.top_k = std::stoll(argv[4]);
    s.hidden = std::stoll(argv[5]);
    s.expert_intermediate = std::stoll(argv[6]);
    s.head_dim = 64;
    s.heads = s.hidden / s.head_dim;
    s.kv_heads = std::max<int64_t>(1, s.heads / 4);
    if (argc == 10) {
      s.heads = std::stoll(argv[7]);
      s.kv_heads = std::stoll(argv[8]);
      s.head_dim = std::stoll(argv[9]);
    }
    std::ifstream config(tokenizer_dir / "config.json");
    std::string text((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
    s.vocab = boost::json::parse(text).as_object().at("vocab_size").to_number<int64_t>();
    tierlm::model::write_synthetic_moe(dir, s);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(tokenizer_dir / f, dir / f, fs::copy_options::overwrite_existing);
    uint64_t bytes = 0;
    for (auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) bytes += e.file_size();
    std::printf("%llu\n", static_cast<unsigned long long>(bytes));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "write_moe_fixture: %s\n", e.what());
    return 1;
  }
  return 0;
}
