#include "tiering/expert_layout.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace tierlm::tiering {

using kernels::SourceType;
using kernels::WeightFormat;
using kernels::WeightView;

namespace {

constexpr int kPanelRows = 16;  // the packed panel height of runtime/kernels/kernel_isa.h

bool is_dense(WeightFormat f) { return f == WeightFormat::f32 || f == WeightFormat::f16 || f == WeightFormat::bf16; }

WeightView view_for(const ExpertLayout& l, int64_t rows, int64_t cols) {
  WeightView v;
  v.format = l.format;
  v.rows = rows;
  v.cols = cols;
  v.group_size = l.group_size;
  v.bits = l.bits;
  v.scale_type = l.scale_type;
  return v;
}

// Sizes of (data, scales, biases) of one matrix in the kernel layout (see kernel_isa.h, weights.cpp).
void part_sizes(const WeightView& v, uint64_t out[3]) {
  if (v.format == WeightFormat::mxfp4) {  // blocks and E8M0 scales as stored (runtime/kernels/mxfp4.h)
    out[0] = uint64_t(v.rows) * uint64_t(v.cols) / 2;
    out[1] = uint64_t(v.rows) * uint64_t(v.cols / 32);
    out[2] = 0;
    return;
  }
  if (is_dense(v.format)) {
    out[0] = uint64_t(v.rows) * uint64_t(v.cols) * (v.format == WeightFormat::f32 ? 4 : 2);
    out[1] = out[2] = 0;
    return;
  }
  const uint64_t panels = uint64_t((v.rows + kPanelRows - 1) / kPanelRows);
  const uint64_t scale_size = v.scale_type == SourceType::f32 ? 4 : 2;
  out[0] = panels * kPanelRows * uint64_t(v.cols) * uint64_t(v.bits) / 8;
  out[1] = panels * uint64_t(v.cols / v.group_size) * kPanelRows * scale_size;
  out[2] = v.format == WeightFormat::q8_0 ? 0 : out[1];
  if (out[0] + out[1] + out[2] != kernels::weight_bytes(v))
    throw std::logic_error("expert layout disagrees with the kernel weight layout");
}

}  // namespace

ExpertLayout ExpertLayout::make(WeightFormat format, int64_t hidden, int64_t intermediate, int group_size, int bits,
                                SourceType scale_type, bool row_biases) {
  if (hidden <= 0 || intermediate <= 0) throw std::invalid_argument("expert layout: shapes must be positive");
  ExpertLayout l;
  l.format = format;
  l.hidden = hidden;
  l.intermediate = intermediate;
  switch (format) {
    case WeightFormat::q8_0:
    case WeightFormat::q4:
      l.group_size = 32;
      l.bits = format == WeightFormat::q8_0 ? 8 : 4;
      l.scale_type = SourceType::f16;
      break;
    case WeightFormat::mxfp4:
      l.group_size = 32;
      l.bits = 4;
      break;
    case WeightFormat::mlx_q4:
    case WeightFormat::mlx_q8:
      l.group_size = group_size;
      l.bits = format == WeightFormat::mlx_q4 ? 4 : 8;
      l.scale_type = scale_type;
      if (bits != 0 && bits != l.bits) throw std::invalid_argument("expert layout: MLX bits disagree with format");
      break;
    default:
      break;
  }
  if (!is_dense(format) && (hidden % l.group_size != 0 || intermediate % l.group_size != 0))
    throw std::invalid_argument("expert layout: hidden " + std::to_string(hidden) + " and intermediate " +
                                std::to_string(intermediate) + " must be multiples of the group size " +
                                std::to_string(l.group_size) + " for " + kernels::format_name(format));
  uint64_t sizes[8] = {};
  part_sizes(view_for(l, 2 * intermediate, hidden), sizes);
  part_sizes(view_for(l, hidden, intermediate), sizes + 3);
  l.row_biases = row_biases;
  if (row_biases) {
    sizes[6] = uint64_t(2 * intermediate) * sizeof(float);
    sizes[7] = uint64_t(hidden) * sizeof(float);
  }
  uint64_t offset = 0;
  for (int i = 0; i < 8; ++i) {
    l.parts[i] = {offset, sizes[i]};
    offset = align_up(offset + sizes[i], 64);
  }
  l.bytes = align_up(offset, kIoAlignment);
  return l;
}

uint64_t ExpertLayout::payload_bytes() const {
  uint64_t total = 0;
  for (const Part& p : parts) total += p.bytes;
  return total;
}

ExpertViews ExpertLayout::views(const void* block) const {
  auto at = [&](int i) -> const void* {
    return parts[i].bytes ? static_cast<const std::byte*>(block) + parts[i].offset : nullptr;
  };
  ExpertViews v{view_for(*this, 2 * intermediate, hidden), view_for(*this, hidden, intermediate)};
  v.gate_up.data = at(0);
  v.gate_up.scales = at(1);
  v.gate_up.biases = at(2);
  v.down.data = at(3);
  v.down.scales = at(4);
  v.down.biases = at(5);
  v.gate_up_bias = static_cast<const float*>(at(6));
  v.down_bias = static_cast<const float*>(at(7));
  return v;
}

void ExpertLayout::store(const kernels::Weight& gate_up, const kernels::Weight& down, void* block) const {
  const kernels::Weight* w[2] = {&gate_up, &down};
  for (int m = 0; m < 2; ++m) {
    const tiering::LedgerBuffer* src[3] = {&w[m]->data, &w[m]->scales, &w[m]->biases};
    for (int k = 0; k < 3; ++k) {
      const Part& p = parts[m * 3 + k];
      if (p.bytes == 0) continue;
      if (src[k]->size() < p.bytes) throw std::logic_error("expert layout: converted weight is smaller than its part");
      std::memcpy(static_cast<std::byte*>(block) + p.offset, src[k]->data(), p.bytes);
    }
  }
}

void ExpertLayout::store_row_biases(const float* gate_up_bias, const float* down_bias, void* block) const {
  if (!row_biases) throw std::logic_error("expert layout: this layout has no output biases");
  std::memcpy(static_cast<std::byte*>(block) + parts[6].offset, gate_up_bias, parts[6].bytes);
  std::memcpy(static_cast<std::byte*>(block) + parts[7].offset, down_bias, parts[7].bytes);
}

}  // namespace tierlm::tiering
