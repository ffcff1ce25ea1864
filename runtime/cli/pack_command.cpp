// `tierlm pack` — rewrites a MoE model's experts expert-major into DIR/experts.tierlm: each expert one 4 KiB aligned
// block already in the in-memory format (quantized here, once), so a cache miss is a single O_DIRECT read with no
// conversion. load_model picks the file up automatically.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "runtime/cli/commands.h"
#include "runtime/cli/model_setup.h"
#include "runtime/cli/progress.h"
#include "runtime/model/moe_model.h"

namespace tierlm::cli {

void add_pack_command(CLI::App& app) {
  struct PackOptions {
    std::string model;
    std::string format = "q4";
    std::string out;
  };
  auto o = std::make_shared<PackOptions>();
  CLI::App* cmd = app.add_subcommand("pack", "Rewrite a MoE model's experts expert-major and pre-quantized for streaming");
  cmd->add_option("model", o->model, "Model folder (Hugging Face layout) or hub id ORG/NAME[@REV]")->required();
  cmd->add_option("--format", o->format, "Expert format: q4, q8_0, f16, bf16, f32 (MLX models keep MLX)");
  cmd->add_option("--out", o->out, "Output file (default MODEL/experts.tierlm)");
  cmd->callback([o] {
    o->model = resolve_model(o->model);
    ProgressBar bar("pack experts");
    const auto result = model::pack_experts(o->model, kernels::parse_format(o->format), o->out,
                                            [&](size_t done, size_t total) { bar.update(done, total); });
    std::printf("wrote %s: %lld experts x %llu bytes (%.2f GiB)\n", result.path.c_str(), (long long)result.experts,
                (unsigned long long)result.expert_bytes, result.file_bytes / double(1ull << 30));
  });
}

}  // namespace tierlm::cli
