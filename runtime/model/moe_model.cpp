#include "runtime/model/moe_model.h"

#include <map>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include "runtime/kernels/fp8.h"
#include "runtime/model/tensor_names.h"

namespace tierlm::model {

using kernels::SourceType;
using kernels::WeightFormat;
using tiering::Extent;

namespace {

struct FileTable {
  std::vector<std::string> files;
  std::map<std::string, int32_t> index;
  int32_t of(const std::string& f) {
    auto [it, inserted] = index.try_emplace(f, int32_t(files.size()));
    if (inserted) files.push_back(f);
    return it->second;
  }
};

void expect_shape(const TensorInfo& t, const std::vector<int64_t>& shape) {
  if (t.shape != shape)
    throw ModelError(fmt::format("tensor '{}' in {} has shape [{}], expected [{}] from config.json", t.name, t.file,
                                 fmt::join(t.shape, ", "), fmt::join(shape, ", ")));
}

SourceType source_type(const TensorInfo& t) {
  switch (t.dtype) {
    case DType::F32: return SourceType::f32;
    case DType::F16: return SourceType::f16;
    case DType::BF16: return SourceType::bf16;
    default:
      throw ModelError(fmt::format("expert tensor '{}' has unsupported dtype {}", t.name, dtype_name(t.dtype)));
  }
}

// Every expert's extents of one layer's stacked tensors [E, ...] (in `infos` order): expert e's contiguous slice.
void add_stacked_extents(const std::vector<const TensorInfo*>& infos, int64_t E, FileTable& files,
                         std::vector<std::vector<Extent>>& extents) {
  for (int64_t e = 0; e < E; ++e) {
    std::vector<Extent> ext;
    for (const TensorInfo* t : infos) {
      const uint64_t slice = t->length / uint64_t(E);
      ext.push_back({files.of(t->file), t->offset + slice * uint64_t(e), slice});
    }
    extents.push_back(std::move(ext));
  }
}

// gpt-oss's experts (mlp.experts.*): gate_up_proj [E, H, 2I] (gate/up interleaved along 2I) and down_proj [E, I, H]
// as `x @ W` stores them, or MXFP4's *_blocks / *_scales (rows = output features, interleaved likewise), with
// gate_up_proj_bias [E, 2I] and down_proj_bias [E, H]; each expert's slice of every tensor is contiguous.
tiering::ExpertStore gpt_oss_expert_store(const TensorIndex& index, const ModelConfig& c, const TensorNames& names,
                                          const std::vector<int64_t>& sparse,
                                          std::optional<WeightFormat> slot_format) {
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts;
  FileTable files;
  std::vector<std::vector<Extent>> extents;
  SourceType source = SourceType::f32;
  const bool mxfp4 = c.mxfp4_experts;
  if (mxfp4 && (H % 32 != 0 || I % 32 != 0))
    throw ModelError(fmt::format("MXFP4 experts need hidden_size ({}) and intermediate_size ({}) to be multiples of "
                                 "32", H, I));
  using Shape = std::vector<int64_t>;
  const std::vector<std::pair<const char*, Shape>> tensors =
      mxfp4 ? std::vector<std::pair<const char*, Shape>>{{"gate_up_proj_blocks", {E, 2 * I, H / 32, 16}},
                                                        {"gate_up_proj_scales", {E, 2 * I, H / 32}},
                                                        {"down_proj_blocks", {E, H, I / 32, 16}},
                                                        {"down_proj_scales", {E, H, I / 32}},
                                                        {"gate_up_proj_bias", {E, 2 * I}},
                                                        {"down_proj_bias", {E, H}}}
            : std::vector<std::pair<const char*, Shape>>{{"gate_up_proj", {E, H, 2 * I}},
                                                        {"down_proj", {E, I, H}},
                                                        {"gate_up_proj_bias", {E, 2 * I}},
                                                        {"down_proj_bias", {E, H}}};
  for (int64_t layer : sparse) {
    const std::string block = names.layer(layer) + c.arch.moe_block + ".experts.";
    std::vector<const TensorInfo*> infos;
    for (const auto& [name, shape] : tensors) {
      const TensorInfo& t = index.at(block + name);
      expect_shape(t, shape);
      infos.push_back(&t);
      if (mxfp4 && infos.size() <= 4) {  // blocks and scales: bytes
        if (t.dtype != DType::U8)
          throw ModelError(fmt::format("MXFP4 tensor '{}' must be U8, found {}", t.name, dtype_name(t.dtype)));
        continue;
      }
      const bool first = infos.size() == (mxfp4 ? 5u : 1u);
      if (!first && source_type(t) != source)
        throw ModelError(fmt::format("'{}' and '{}' differ in dtype", infos.front()->name, t.name));
      source = source_type(t);
    }
    add_stacked_extents(infos, E, files, extents);
  }
  const WeightFormat file_format = source == SourceType::f32   ? WeightFormat::f32
                                   : source == SourceType::f16 ? WeightFormat::f16
                                                               : WeightFormat::bf16;
  const auto layout = tiering::ExpertLayout::make(slot_format.value_or(mxfp4 ? WeightFormat::mxfp4 : file_format), H,
                                                  I, 0, 0, SourceType::f16, /*row_biases=*/true);
  return tiering::ExpertStore(std::move(files.files), int64_t(sparse.size()), E,
                              mxfp4 ? tiering::ExpertEncoding::mxfp4 : tiering::ExpertEncoding::transposed, source,
                              layout, std::move(extents));
}

// gpt-oss experts as mlx-lm writes them. What the layout is (ml-explore/mlx-lm @ d78bf58, ml-explore/mlx @ 846d176):
// - mlx_lm/models/gpt_oss.py sanitize: *_blocks viewed as uint32 and flattened -> mlp.experts.{gate,up,down}_proj
//   .weight [E, rows, cols/8], *_scales -> .scales (uint8); gate = gate_up's even rows, up = its odd rows, and
//   gate_up_proj_bias split alike into gate_proj.bias / up_proj.bias; down_proj_bias -> down_proj.bias; attention
//   biases and sinks as in HF; quant_predicate puts mlp.router at 8 bits, group 64.
// - mlx_lm/utils.py load_model maps quantization_config quant_method "mxfp4" to {"group_size": 32, "bits": 4, "mode":
//   "mxfp4"}; quantize_model on that partly quantized model keeps the top level and records every module it
//   quantizes per path (affine), so mlx-community gpt-oss-*-MXFP4-Q4/Q8 hold MXFP4 experts and affine everything else
//   (Blaizzy/mlx-vlm mlx_vlm/tests/test_models.py TestGptOssMixedQuant mirrors gpt-oss-20b-MXFP4-Q8's config).
// - Before mlx-lm 1cd6045 ("support mxfp4", 2025-08-29) sanitize dequantized the blocks to bf16 first, so early
//   conversions hold affine experts (.weight/.scales/.biases) under the same names.
// - mlx/ops.cpp fp_quantize / fp_dequantize: mxfp4 = E2M1 codes, 8 per uint32 from the low nibble, one uint8 E8M0
//   exponent (2^(s - 127)) per 32, no biases: byte for byte gpt-oss's blocks and scales.
// Each expert's slice of every stacked tensor is contiguous.
tiering::ExpertStore gpt_oss_mlx_expert_store(const TensorIndex& index, const ModelConfig& c, const TensorNames& names,
                                              const std::vector<int64_t>& sparse) {
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts;
  const std::string first = names.layer(sparse.front()) + c.arch.moe_block + ".experts.gate_proj";
  if (!c.quantization || !index.contains(first + ".scales"))
    throw ModelError(fmt::format("tensor '{}.weight' is not MLX-quantized (no {}.scales): unquantized mlx-lm gpt-oss "
                                 "experts are not supported", first, first));
  const QuantizationConfig::Module q = c.quantization->of(first);
  FileTable files;
  std::vector<std::vector<Extent>> extents;
  std::optional<DType> scale_dtype, bias_dtype;
  const std::tuple<const char*, int64_t, int64_t> projections[3] = {{"gate_proj", I, H}, {"up_proj", I, H},
                                                                    {"down_proj", H, I}};
  for (int64_t layer : sparse) {
    const std::string block = names.layer(layer) + c.arch.moe_block + ".experts.";
    std::vector<const TensorInfo*> infos;
    for (auto [name, rows, cols] : projections) {
      const std::string base = block + name;
      const QuantizationConfig::Module m = c.quantization->of(base);
      if (m.bits != q.bits || m.group_size != q.group_size || m.mxfp4 != q.mxfp4)
        throw ModelError(fmt::format("MLX expert module '{}' is quantized unlike '{}' ({} bits, group {}{}); one "
                                     "expert layout is needed", base, first, q.bits, q.group_size,
                                     q.mxfp4 ? ", mxfp4" : ""));
      if (cols % q.group_size != 0)
        throw ModelError(fmt::format("MLX tensor '{}': {} columns do not fit group size {}", base, cols, q.group_size));
      std::vector<std::pair<std::string, int64_t>> parts = {{".weight", cols * q.bits / 32},
                                                            {".scales", cols / q.group_size}};
      if (!q.mxfp4) parts.push_back({".biases", cols / q.group_size});
      for (auto& [suffix, last] : parts) {
        const TensorInfo& t = index.at(base + suffix);
        expect_shape(t, {E, rows, last});
        if (suffix == ".weight" && t.dtype != DType::U32 && t.dtype != DType::I32)
          throw ModelError(fmt::format("MLX tensor '{}' must be U32, found {}", t.name, dtype_name(t.dtype)));
        if (suffix == ".scales" && q.mxfp4 && t.dtype != DType::U8)
          throw ModelError(fmt::format("MLX mxfp4 tensor '{}' must be U8 (E8M0), found {}", t.name,
                                       dtype_name(t.dtype)));
        if (suffix != ".weight" && !q.mxfp4) {
          source_type(t);  // f32/f16/bf16
          if (scale_dtype && t.dtype != *scale_dtype)
            throw ModelError(fmt::format("MLX tensor '{}' is {}, other expert scales {}", t.name,
                                         dtype_name(t.dtype), dtype_name(*scale_dtype)));
          scale_dtype = t.dtype;
        }
        infos.push_back(&t);
      }
    }
    for (auto [name, rows, cols] : projections) {
      const TensorInfo& t = index.at(block + name + ".bias");
      expect_shape(t, {E, rows});
      source_type(t);
      if (bias_dtype && t.dtype != *bias_dtype)
        throw ModelError(fmt::format("expert bias '{}' is {}, the others {}", t.name, dtype_name(t.dtype),
                                     dtype_name(*bias_dtype)));
      bias_dtype = t.dtype;
      infos.push_back(&t);
    }
    add_stacked_extents(infos, E, files, extents);
  }
  // One element type for the biases and (affine) the scales: what the slot conversion reads them as.
  if (scale_dtype && *scale_dtype != *bias_dtype)
    throw ModelError(fmt::format("MLX gpt-oss experts: the scales are {} but the biases {}; not supported",
                                 dtype_name(*scale_dtype), dtype_name(*bias_dtype)));
  const SourceType source = source_type(index.at(first + ".bias"));
  const auto layout =
      q.mxfp4 ? tiering::ExpertLayout::make(WeightFormat::mxfp4, H, I, 0, 0, SourceType::f16, /*row_biases=*/true)
              : tiering::ExpertLayout::make(q.bits == 4 ? WeightFormat::mlx_q4 : WeightFormat::mlx_q8, H, I,
                                            q.group_size, q.bits, source, /*row_biases=*/true);
  return tiering::ExpertStore(std::move(files.files), int64_t(sparse.size()), E, tiering::ExpertEncoding::mlx_gpt_oss,
                              source, layout, std::move(extents));
}

}  // namespace

tiering::ExpertStore expert_store_from_safetensors(const TensorIndex& index, const ModelConfig& c,
                                                   std::optional<WeightFormat> slot_format) {
  const ArchitectureSpec& a = c.arch;
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts;
  FileTable files;
  std::vector<std::vector<Extent>> extents;
  auto extent = [&](const TensorInfo& t, uint64_t offset, uint64_t length) {
    return Extent{files.of(t.file), t.offset + offset, length};
  };
  // The expert tier numbers sparse layers only (LayerSpec::expert_layer); dense layers among them have no experts.
  std::vector<int64_t> sparse;
  for (int64_t layer = 0; layer < c.num_layers; ++layer)
    if (c.layer(layer).mlp == Mlp::moe) sparse.push_back(layer);
  if (sparse.empty()) throw ModelError("expert store: the model has no sparse layer");
  const TensorNames names = find_tensor_names(index);
  if (a.gpt_oss) {
    if (index.contains(names.layer(sparse.front()) + a.moe_block + ".experts.gate_proj.weight"))
      return gpt_oss_mlx_expert_store(index, c, names, sparse);  // MLX experts keep their format
    return gpt_oss_expert_store(index, c, names, sparse, slot_format);
  }
  // Gemma 4 keeps its experts in the layer itself (layers.N.experts.*, beside the dense mlp), the others under their
  // MoE block; mlx-lm stacks Gemma 4's as experts.switch_glu.{gate,up,down}_proj, the others' as switch_mlp.*.
  auto block_of = [&](int64_t layer) {
    return names.layer(layer) + (a.gemma4 ? std::string() : std::string(a.moe_block) + ".");
  };
  const std::string stacked_name = a.gemma4 ? "experts.switch_glu." : "switch_mlp.";
  const std::string first = block_of(sparse.front());
  const bool stacked = index.contains(first + stacked_name + "gate_proj.weight");
  // transformers 5's fused layout: experts.gate_up_proj [E, 2I, H] (gate rows first) and experts.down_proj [E, H, I].
  const bool fused = index.contains(first + "experts.gate_up_proj");
  const bool mlx = c.quantization &&
                   (stacked ? index.contains(first + stacked_name + "gate_proj.scales")
                            : index.contains(fmt::format("{}experts.0.{}.scales", first, a.expert_gate)));
  SourceType source = SourceType::f32;
  std::optional<tiering::ExpertLayout> layout;
  const QuantizationConfig::Module expert_quant =
      mlx ? c.quantization->of(first +
                               (stacked ? stacked_name + "gate_proj" : fmt::format("experts.0.{}", a.expert_gate)))
          : QuantizationConfig::Module{};
  if (expert_quant.mxfp4)
    throw ModelError(fmt::format("MLX experts '{}' are in mode mxfp4, which tierlm reads for gpt_oss only (other "
                                 "families' MLX experts must be affine)", first + stacked_name + "gate_proj"));
  const int bits = expert_quant.bits, group = expert_quant.group_size;
  const bool fp8 = !mlx && !stacked && !fused &&
                   index.contains(fmt::format("{}experts.0.{}.weight", first, a.expert_gate)) &&
                   index.at(fmt::format("{}experts.0.{}.weight", first, a.expert_gate)).dtype == DType::F8_E4M3;

  for (int64_t layer : sparse) {
    const std::string block = block_of(layer);
    for (int64_t e = 0; e < E; ++e) {
      std::vector<Extent> ext;
      if (fused) {
        const TensorInfo& gate_up = index.at(block + "experts.gate_up_proj");
        const TensorInfo& down = index.at(block + "experts.down_proj");
        expect_shape(gate_up, {E, 2 * I, H});
        expect_shape(down, {E, H, I});
        source = source_type(gate_up);
        if (source_type(down) != source)
          throw ModelError(fmt::format("'{}' and '{}' differ in dtype", gate_up.name, down.name));
        const uint64_t half = gate_up.length / uint64_t(2 * E), slice = down.length / uint64_t(E);
        ext.push_back(extent(gate_up, 2 * half * uint64_t(e), half));         // gate rows [0, I)
        ext.push_back(extent(gate_up, 2 * half * uint64_t(e) + half, half));  // up rows [I, 2I)
        ext.push_back(extent(down, slice * uint64_t(e), slice));
        extents.push_back(std::move(ext));
        continue;
      }
      // (name in per-expert files, name in switch_mlp, rows, cols)
      const std::tuple<const char*, const char*, int64_t, int64_t> projections[3] = {
          {a.expert_gate, "gate_proj", I, H}, {a.expert_up, "up_proj", I, H}, {a.expert_down, "down_proj", H, I}};
      for (auto [name, mlx_name, rows, cols] : projections) {
        const std::string base =
            stacked ? block + stacked_name + mlx_name : fmt::format("{}experts.{}.{}", block, e, name);
        if (!mlx) {
          const TensorInfo& t = index.at(base + ".weight");
          expect_shape(t, {rows, cols});
          if (fp8 != (t.dtype == DType::F8_E4M3))
            throw ModelError(fmt::format("expert tensor '{}' is {} where the first expert's is {}", t.name,
                                         dtype_name(t.dtype), fp8 ? "F8_E4M3" : "not"));
          ext.push_back(extent(t, 0, t.length));
          if (!fp8) {
            source = source_type(t);
            continue;
          }
          // DeepSeek's FP8 experts: the 128x128 block scales follow each weight (dequantized at a miss).
          const TensorInfo& scale = index.at(base + ".weight_scale_inv");
          expect_shape(scale, {(rows + kernels::kFp8Block - 1) / kernels::kFp8Block,
                               (cols + kernels::kFp8Block - 1) / kernels::kFp8Block});
          if (scale.dtype != DType::F32)
            throw ModelError(fmt::format("expert tensor '{}' must be F32", scale.name));
          ext.push_back(extent(scale, 0, scale.length));
          continue;
        }
        if (cols % group != 0) throw ModelError(fmt::format("MLX tensor '{}': columns do not fit group size", base));
        const std::vector<int64_t> w_shape = {rows, cols * bits / 32}, s_shape = {rows, cols / group};
        for (const char* part : {".weight", ".scales", ".biases"}) {
          const TensorInfo& t = index.at(base + part);
          std::vector<int64_t> shape = std::string(part) == ".weight" ? w_shape : s_shape;
          if (stacked) shape.insert(shape.begin(), E);
          expect_shape(t, shape);
          if (std::string(part) != ".weight") source = source_type(t);
          const uint64_t slice = stacked ? t.length / uint64_t(E) : t.length;
          ext.push_back(extent(t, stacked ? slice * uint64_t(e) : 0, slice));
        }
      }
      extents.push_back(std::move(ext));
    }
  }
  if (mlx) {
    layout = tiering::ExpertLayout::make(bits == 4 ? WeightFormat::mlx_q4 : WeightFormat::mlx_q8, H, I, group, bits,
                                         source);
  } else {
    const WeightFormat file_format = source == SourceType::f32   ? WeightFormat::f32
                                     : source == SourceType::f16 ? WeightFormat::f16
                                                                 : WeightFormat::bf16;
    layout = tiering::ExpertLayout::make(slot_format.value_or(file_format), H, I);
  }
  // FP8 experts convert at a miss to the slot format (default f32: float(q) * scale is exact in f32, as transformers
  // dequantizes; bf16 would round it).
  const auto encoding = mlx ? tiering::ExpertEncoding::mlx
                        : fp8 ? tiering::ExpertEncoding::fp8_blocks
                              : tiering::ExpertEncoding::dense;
  return tiering::ExpertStore(std::move(files.files), int64_t(sparse.size()), E, encoding, source, *layout,
                              std::move(extents));
}

std::shared_ptr<tiering::ExpertTier> open_expert_tier(const std::filesystem::path& dir, const TensorIndex& index,
                                                      const ModelConfig& c, const LoadOptions& options,
                                                      tiering::Ledger& ledger) {
  std::filesystem::path packed;
  if (options.packed_experts) {
    packed = *options.packed_experts;
  } else if (std::filesystem::exists(dir / "experts.tierlm")) {
    packed = dir / "experts.tierlm";
  }
  const auto format = options.expert_format ? options.expert_format : options.weight_format;
  tiering::ExpertTierOptions tier_options = options.experts;
  tier_options.min_slots = std::max(tier_options.min_slots, c.num_experts_per_tok);
  if (!packed.empty()) {
    tiering::ExpertStore store = tiering::ExpertStore::open_packed(packed);
    const auto& l = store.layout();
    if (store.layers() != c.sparse_layers() || store.experts() != c.num_experts || l.hidden != c.hidden_size ||
        l.intermediate != c.moe_intermediate_size)
      throw ModelError(fmt::format("{}: packed experts ({} layers x {} experts, {}x{}) do not match config.json",
                                   packed.string(), store.layers(), store.experts(), l.hidden, l.intermediate));
    if (format && *format != l.format)
      throw ModelError(fmt::format("{}: packed in {} but {} was asked for (re-pack, or pass no packed file)",
                                   packed.string(), kernels::format_name(l.format), kernels::format_name(*format)));
    return std::make_shared<tiering::ExpertTier>(std::move(store), ledger, tier_options);
  }
  return std::make_shared<tiering::ExpertTier>(expert_store_from_safetensors(index, c, format), ledger,
                                               tier_options);
}

PackResult pack_experts(const std::filesystem::path& dir, std::optional<WeightFormat> format,
                        const std::filesystem::path& out, const std::function<void(size_t, size_t)>& progress) {
  const ModelConfig c = load_config(dir);
  if (!c.arch.moe) throw ModelError(fmt::format("{}: '{}' has no experts to pack", dir.string(), c.model_type));
  const TensorIndex index = TensorIndex::open(dir);
  const tiering::ExpertStore store = expert_store_from_safetensors(
      index, c, format.value_or(c.mxfp4_experts ? WeightFormat::mxfp4 : WeightFormat::q4));
  PackResult result;
  result.path = out.empty() ? dir / "experts.tierlm" : out;
  // The same read + conversion path as a cache miss on the safetensors, so packed bytes equal what the cache holds.
  tiering::ReaderOptions reader_options;
  reader_options.direct = false;  // packing reads everything once; the page cache does not matter here
  tiering::ExpertReader reader(store.files(), reader_options);
  tiering::Ledger scratch;
  tiering::LedgerBuffer staging(scratch, tiering::accounts::scratch, store.staging_bytes(), tiering::kIoAlignment);
  tiering::PackedHeader header{c.sparse_layers(), c.num_experts, store.layout()};
  tiering::write_packed_experts(
      result.path, header,
      [&](int64_t layer, int64_t expert, void* block) {
        reader.wait(reader.submit(store.plan(layer, expert, block, staging.data())));
        store.finish(layer, expert, staging.data(), block, scratch);
      },
      progress);
  result.experts = c.sparse_layers() * c.num_experts;
  result.expert_bytes = store.layout().bytes;
  result.file_bytes = std::filesystem::file_size(result.path);
  return result;
}

}  // namespace tierlm::model
