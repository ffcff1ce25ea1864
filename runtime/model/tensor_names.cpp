#include "runtime/model/tensor_names.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace tierlm::model {

namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

TensorNames find_tensor_names(const TensorIndex& index) {
  TensorNames names;
  struct Layout {
    const char* model;
    const char* lm_head;
    bool mlx;
  };
  static constexpr Layout kLayouts[] = {{"model.", "lm_head", false},
                                        {"model.language_model.", "lm_head", false},
                                        {"language_model.model.", "language_model.lm_head", true}};
  bool found = false;
  for (const Layout& l : kLayouts)
    if (index.contains(std::string(l.model) + "embed_tokens.weight")) {
      names = {l.model, l.lm_head, l.mlx};
      found = true;
      break;
    }
  // A file of expert tensors alone (a shard, or a test's): the layout its layer tensors use.
  for (const Layout& l : kLayouts) {
    if (found) break;
    const std::string layers = std::string(l.model) + "layers.";
    for (const auto& entry : index.tensors())
      if (starts_with(entry.first, layers.c_str())) {
        names = {l.model, l.lm_head, l.mlx};
        found = true;
        break;
      }
  }
  if (!found)
    throw ModelError(fmt::format("{}: no embed_tokens.weight under model., model.language_model. or "
                                 "language_model.model. (is this a decoder language model?)", index.origin()));
  return names;
}

void log_skipped_tensors(const TensorIndex& index) {
  size_t vision = 0, mtp = 0;
  for (const auto& [name, info] : index.tensors()) {
    if (starts_with(name, "model.visual.") || starts_with(name, "vision_tower.") ||
        starts_with(name, "model.language_model.visual."))
      ++vision;
    else if (starts_with(name, "mtp."))
      ++mtp;
  }
  if (vision + mtp > 0)
    spdlog::info("model: skipping {} vision-tower tensors and {} multi-token-prediction (mtp.*) tensors; tierlm runs "
                 "the language model only", vision, mtp);
}

}  // namespace tierlm::model
