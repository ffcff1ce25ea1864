#include "runtime/model/mlx_matrix.h"

#include <cstring>

#include <fmt/format.h>

namespace tierlm::model {

using kernels::SourceType;

namespace {

// One module's tensors, checked against its logical [..., rows, cols] shape.
struct MlxTensors {
  const TensorInfo* words = nullptr;
  const TensorInfo* scales = nullptr;
  const TensorInfo* biases = nullptr;  // affine only
  int64_t rows = 0, cols = 0, word_cols = 0, groups = 0;
};

MlxTensors mlx_tensors(const TensorIndex& index, const std::string& base, const QuantizationConfig::Module& q,
                       std::vector<int64_t> shape) {
  MlxTensors t;
  t.cols = shape.back();
  t.rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) t.rows *= shape[i];
  if (t.cols % q.group_size != 0 || (t.cols * q.bits) % 32 != 0)
    throw ModelError(fmt::format("MLX tensor '{}': {} columns do not fit group size {}", base, t.cols,
                                 q.group_size));
  t.word_cols = t.cols * q.bits / 32;
  t.groups = t.cols / q.group_size;
  auto expect = [&](const std::string& name, int64_t last) -> const TensorInfo& {
    const TensorInfo& info = index.at(name);
    shape.back() = last;
    if (info.shape != shape)
      throw ModelError(fmt::format("tensor '{}' in {} has shape [{}], expected [{}] from config.json ({} bits, group "
                                   "{}{})", name, info.file, fmt::join(info.shape, ", "), fmt::join(shape, ", "),
                                   q.bits, q.group_size, q.mxfp4 ? ", mxfp4" : ""));
    return info;
  };
  t.words = &expect(base + ".weight", t.word_cols);
  if (t.words->dtype != DType::U32 && t.words->dtype != DType::I32)
    throw ModelError(fmt::format("MLX tensor '{}.weight' must be U32, found {}", base, dtype_name(t.words->dtype)));
  t.scales = &expect(base + ".scales", t.groups);
  if (q.mxfp4) {
    if (t.scales->dtype != DType::U8)
      throw ModelError(fmt::format("MLX mxfp4 tensor '{}.scales' must be U8 (E8M0), found {}", base,
                                   dtype_name(t.scales->dtype)));
    return t;
  }
  if (t.scales->dtype != DType::F16 && t.scales->dtype != DType::BF16 && t.scales->dtype != DType::F32)
    throw ModelError(fmt::format("MLX tensor '{}.scales' has unsupported dtype {}", base,
                                 dtype_name(t.scales->dtype)));
  t.biases = &expect(base + ".biases", t.groups);
  if (t.biases->dtype != t.scales->dtype)
    throw ModelError(fmt::format("MLX tensor '{}': scales and biases must share one dtype", base));
  return t;
}

// The rows of `tensors` (one quantization, one column count) concatenated into one weight, reordered by row_source.
kernels::Weight assemble(const TensorIndex& index, const QuantizationConfig::Module& q,
                         const std::vector<MlxTensors>& tensors, tiering::Ledger& ledger, const std::string& account,
                         const std::function<int64_t(int64_t)>& row_source) {
  const MlxTensors& first = tensors.front();
  for (const MlxTensors& t : tensors)
    if (t.scales->dtype != first.scales->dtype)
      throw ModelError(fmt::format("MLX tensors '{}' and '{}' are fused but their scales differ in dtype",
                                   first.scales->name, t.scales->name));
  const size_t word_row = size_t(first.word_cols) * 4, scale_row = size_t(first.groups) * dtype_size(first.scales->dtype);
  // Where each source row lives: (part, row within it).
  std::vector<std::pair<size_t, int64_t>> where;
  for (size_t i = 0; i < tensors.size(); ++i)
    for (int64_t r = 0; r < tensors[i].rows; ++r) where.emplace_back(i, r);
  const int64_t rows = int64_t(where.size());
  tiering::LedgerBuffer words(ledger, tiering::accounts::scratch, size_t(rows) * word_row);
  tiering::LedgerBuffer scales(ledger, tiering::accounts::scratch, size_t(rows) * scale_row);
  tiering::LedgerBuffer biases(ledger, tiering::accounts::scratch, q.mxfp4 ? 0 : size_t(rows) * scale_row);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t from = row_source ? row_source(r) : r;
    if (from < 0 || from >= rows) throw std::logic_error("mlx_matrix: row_source out of range");
    const auto [part, local] = where[size_t(from)];
    const MlxTensors& t = tensors[part];
    std::memcpy(words.as<char>() + size_t(r) * word_row, index.data(*t.words).data() + size_t(local) * word_row,
                word_row);
    std::memcpy(scales.as<char>() + size_t(r) * scale_row, index.data(*t.scales).data() + size_t(local) * scale_row,
                scale_row);
    if (t.biases)
      std::memcpy(biases.as<char>() + size_t(r) * scale_row,
                  index.data(*t.biases).data() + size_t(local) * scale_row, scale_row);
  }
  if (q.mxfp4) return kernels::make_mxfp4_weight(words.data(), scales.data(), rows, first.cols, ledger, account);
  const DType d = first.scales->dtype;
  const SourceType scale_type = d == DType::F16 ? SourceType::f16 : d == DType::BF16 ? SourceType::bf16 : SourceType::f32;
  return kernels::make_mlx_weight(words.data(), scales.data(), biases.data(), scale_type, rows, first.cols,
                                  q.group_size, q.bits, ledger, account);
}

}  // namespace

bool is_mlx_module(const TensorIndex& index, const ModelConfig& config, const std::string& base) {
  return config.quantization && index.contains(base + ".scales");
}

void refuse_packed_without_scales(const TensorInfo& weight, const std::string& base) {
  if (weight.dtype == DType::U32 || weight.dtype == DType::I32)
    throw ModelError(fmt::format("tensor '{}' in {} is MLX-packed ({}) but '{}.scales' is missing", weight.name,
                                 weight.file, dtype_name(weight.dtype), base));
}

kernels::Weight mlx_matrix(const TensorIndex& index, const ModelConfig& config, const std::vector<MlxPart>& parts,
                           int64_t cols, tiering::Ledger& ledger, const std::string& account,
                           const std::function<int64_t(int64_t)>& row_source) {
  // Bits, group size and mode per module (mlx-lm writes 8-bit routers as per-module entries); fused parts must agree.
  const QuantizationConfig::Module q = config.quantization->of(parts.front().base);
  std::vector<MlxTensors> tensors;
  for (const MlxPart& p : parts) {
    const QuantizationConfig::Module other = config.quantization->of(p.base);
    if (other.bits != q.bits || other.group_size != q.group_size || other.mxfp4 != q.mxfp4)
      throw ModelError(fmt::format("MLX tensors '{}' ({} bits, group {}) and '{}' ({} bits, group {}) are fused "
                                   "but quantized differently", parts.front().base, q.bits, q.group_size, p.base,
                                   other.bits, other.group_size));
    tensors.push_back(mlx_tensors(index, p.base, q, {p.rows, cols}));
  }
  return assemble(index, q, tensors, ledger, account, row_source);
}

std::vector<float> mlx_dequantize(const TensorIndex& index, const ModelConfig& config, const std::string& base,
                                  const std::vector<int64_t>& shape, tiering::Ledger& ledger) {
  // Checked in its own shape, then read as the [rows, cols] matrix it is in memory.
  const QuantizationConfig::Module q = config.quantization->of(base);
  const MlxTensors t = mlx_tensors(index, base, q, shape);
  const kernels::Weight w = assemble(index, q, {t}, ledger, tiering::accounts::scratch, {});
  std::vector<float> out(size_t(t.rows * t.cols));
  for (int64_t r = 0; r < t.rows; ++r) kernels::dequantize_row(w.view, r, out.data() + r * t.cols);
  return out;
}

}  // namespace tierlm::model
