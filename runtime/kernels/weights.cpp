// runtime/kernels/weights.cpp — weight formats: load-time conversion/quantization, and the dispatch of matvec /
// matmul / dequantize_row onto the kernel backend chosen at run time.
//
// Layouts (all buffers 64-byte aligned, all charged to the caller's ledger account):
//   f32, f16, bf16   data: row-major [rows x cols]. No scales.
//   q8_0             symmetric int8, one f16 scale per 32 columns of a row, w = d*q, q in [-127, 127].
//                    Stored in the packed panel layout of kernel_isa.h with bits = 8, codes u = q + 128 (so the
//                    VNNI unsigned x signed product applies directly), scales = d (f16), biases absent.
//                    1.0625 bytes per weight.
//   q4               affine 4-bit per 32 columns: w = d*u + m, u in [0, 15], d and m f16. Affine (min + step)
//                    rather than symmetric because it spends all 16 levels on [min, max] of each group, which
//                    halves the worst-case error of lopsided groups. Packed layout with bits = 4. 0.625 bytes/weight.
//   mxfp4            gpt-oss's MXFP4 as stored (runtime/kernels/mxfp4.h): data = [rows, cols/32, 16] code bytes,
//                    scales = [rows, cols/32] E8M0 bytes; f32 activations, no activation quantization.
//                    0.53 bytes/weight.
//   mlx_q4, mlx_q8   MLX affine: w = scales*q + biases with MLX's group size (32/64/128) and MLX's scale type
//                    (f16/bf16/f32 kept as is, so the math is identical to MLX). Codes are unpacked from MLX's
//                    little-end-first uint32 words and repacked into the panel layout with bits = 4 or 8.
//                    matvec/matmul multiply them with the activations in f32, as MLX does (affine_f32.h); q8_0 and
//                    q4 quantize the activations to int8 per 32 columns (kernel_isa.h).
// Rounding: round-to-nearest everywhere. The stored f16 scale of q8_0 is rounded up and q4's (min, step) are
// rounded outward, so every source value lies inside the representable range and the per-element error is at most
// half the stored step (no clipping).
#include "runtime/kernels/weights.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/kernels/affine_f32.h"
#include "runtime/kernels/kernel_isa.h"
#include "runtime/kernels/mlx_repack.h"
#include "runtime/kernels/mxfp4.h"
#include "runtime/kernels/packed_codes.h"

namespace tierlm::kernels {

const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::f32: return "f32";
    case WeightFormat::f16: return "f16";
    case WeightFormat::bf16: return "bf16";
    case WeightFormat::q8_0: return "q8_0";
    case WeightFormat::q4: return "q4";
    case WeightFormat::mlx_q4: return "mlx_q4";
    case WeightFormat::mlx_q8: return "mlx_q8";
    case WeightFormat::mxfp4: return "mxfp4";
  }
  return "unknown";
}

std::optional<WeightFormat> format_from_name(std::string_view name) {
  for (WeightFormat f : {WeightFormat::f32, WeightFormat::f16, WeightFormat::bf16, WeightFormat::q8_0, WeightFormat::q4,
                         WeightFormat::mlx_q4, WeightFormat::mlx_q8, WeightFormat::mxfp4})
    if (name == format_name(f)) return f;
  return std::nullopt;
}

WeightFormat parse_format(std::string_view name) {
  if (name == "f32") return WeightFormat::f32;
  if (name == "f16") return WeightFormat::f16;
  if (name == "bf16") return WeightFormat::bf16;
  if (name == "q8_0" || name == "q8") return WeightFormat::q8_0;
  if (name == "q4") return WeightFormat::q4;
  throw std::invalid_argument("unknown weight format '" + std::string(name) +
                              "' (accepted: f32, f16, bf16, q8_0, q8, q4)");
}

namespace {

bool is_dense(WeightFormat f) {
  return f == WeightFormat::f32 || f == WeightFormat::f16 || f == WeightFormat::bf16;
}

size_t source_size(SourceType t) { return t == SourceType::f32 ? 4 : 2; }

size_t dense_element_size(WeightFormat f) { return f == WeightFormat::f32 ? 4 : 2; }

int64_t panel_count(int64_t rows) { return (rows + kPanelRows - 1) / kPanelRows; }

struct PackedSizes {
  uint64_t data = 0, scales = 0, biases = 0;
};

PackedSizes packed_sizes(const WeightView& w) {
  const int64_t panels = panel_count(w.rows);
  PackedSizes s;
  s.data = static_cast<uint64_t>(panels) * kPanelRows * static_cast<uint64_t>(w.cols) * w.bits / 8;
  s.scales = static_cast<uint64_t>(panels) * (w.cols / w.group_size) * kPanelRows * source_size(w.scale_type);
  s.biases = w.format == WeightFormat::q8_0 ? 0 : s.scales;
  return s;
}

PackedView packed_view(const WeightView& w) {
  PackedView p;
  p.data = static_cast<const uint8_t*>(w.data);
  p.d = w.scales;
  p.m = w.format == WeightFormat::q8_0 ? nullptr : w.biases;
  p.scale_type = w.scale_type;
  p.bits = w.bits;
  p.group = w.group_size;
  p.rows = w.rows;
  p.cols = w.cols;
  p.panels = panel_count(w.rows);
  return p;
}

float read_source(const void* src, SourceType t, int64_t i) {
  switch (t) {
    case SourceType::f32: return static_cast<const float*>(src)[i];
    case SourceType::f16: return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
    case SourceType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
  }
  return 0.0f;
}

// Next f16 bit pattern toward +inf / -inf (finite inputs).
uint16_t f16_step_up(uint16_t h) {
  if (h == 0x8000u) return 0x0001u;
  return (h & 0x8000u) ? static_cast<uint16_t>(h - 1) : static_cast<uint16_t>(h + 1);
}
uint16_t f16_step_down(uint16_t h) {
  if (h == 0x0000u) return 0x8001u;
  return (h & 0x8000u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
}
void check_f16_range(float v, const char* what) {
  if (!(std::fabs(v) <= 65000.0f))
    throw std::invalid_argument(std::string(what) + ": weight values too large (or not finite) for f16 scales");
}
uint16_t f16_round_up(float v) {
  uint16_t h = f32_to_f16(v);
  while (f16_to_f32(h) < v) h = f16_step_up(h);
  return h;
}
uint16_t f16_round_down(float v) {
  uint16_t h = f32_to_f16(v);
  while (f16_to_f32(h) > v) h = f16_step_down(h);
  return h;
}

void validate_shape(int64_t rows, int64_t cols, const char* what) {
  if (rows <= 0 || cols <= 0)
    throw std::invalid_argument(std::string(what) + ": rows and cols must be positive (got " + std::to_string(rows) +
                                " x " + std::to_string(cols) + ")");
}

// Quantizes one source row into codes[cols] and per-group (d, m) f16 bit patterns.
void quantize_q8_0_row(const float* x, int64_t cols, uint8_t* codes, uint16_t* d) {
  for (int64_t g = 0; g < cols / 32; ++g) {
    const float* xg = x + g * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xg[j]));
    check_f16_range(amax, "q8_0");
    const uint16_t dh = amax > 0.0f ? f16_round_up(amax / 127.0f) : 0;
    const float scale = f16_to_f32(dh);
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float v = std::clamp(std::nearbyint(xg[j] * inv), -127.0f, 127.0f);
      codes[g * 32 + j] = static_cast<uint8_t>(static_cast<int>(v) + 128);
    }
    d[g] = dh;
  }
}

void quantize_q4_row(const float* x, int64_t cols, uint8_t* codes, uint16_t* d, uint16_t* m) {
  for (int64_t g = 0; g < cols / 32; ++g) {
    const float* xg = x + g * 32;
    float lo = xg[0], hi = xg[0];
    for (int j = 1; j < 32; ++j) {
      lo = std::min(lo, xg[j]);
      hi = std::max(hi, xg[j]);
    }
    check_f16_range(lo, "q4");
    check_f16_range(hi, "q4");
    const uint16_t mh = f16_round_down(lo);
    const float mf = f16_to_f32(mh);
    const float range = hi - mf;
    check_f16_range(range, "q4");
    const uint16_t dh = range > 0.0f ? f16_round_up(range / 15.0f) : 0;
    const float df = f16_to_f32(dh);
    const float inv = df > 0.0f ? 1.0f / df : 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float v = std::clamp(std::nearbyint((xg[j] - mf) * inv), 0.0f, 15.0f);
      codes[g * 32 + j] = static_cast<uint8_t>(v);
    }
    d[g] = dh;
    m[g] = mh;
  }
}

// Writes one row's codes into the panel layout.
void pack_row_codes(uint8_t* data, int64_t panel_bytes, int bits, int64_t row, int64_t cols, const uint8_t* codes) {
  const int64_t p = row / kPanelRows;
  const int r = static_cast<int>(row % kPanelRows);
  uint8_t* panel = data + p * panel_bytes;
  if (bits == 8) {
    for (int64_t k = 0; k < cols / 4; ++k) std::memcpy(panel + k * 64 + r * 4, codes + k * 4, 4);
    return;
  }
  for (int64_t b = 0; b < cols / 32; ++b) {
    const uint8_t* cb = codes + b * 32;
    for (int c = 0; c < 4; ++c) {
      for (int j = 0; j < 4; ++j) {
        panel[b * 256 + c * 64 + r * 4 + j] = static_cast<uint8_t>((cb[c * 4 + j] & 0x0F) | (cb[(c + 4) * 4 + j] << 4));
      }
    }
  }
}

}  // namespace

uint64_t weight_bytes(const WeightView& w) {
  if (w.format == WeightFormat::mxfp4)
    return uint64_t(w.rows) * uint64_t(w.cols / kMxfp4Block) * (kMxfp4BlockBytes + 1);
  if (is_dense(w.format)) return static_cast<uint64_t>(w.rows) * w.cols * dense_element_size(w.format);
  const PackedSizes s = packed_sizes(w);
  return s.data + s.scales + s.biases;
}

Weight make_weight(const void* src, SourceType src_type, int64_t rows, int64_t cols, WeightFormat target,
                   tiering::Ledger& ledger, const std::string& account) {
  validate_shape(rows, cols, "make_weight");
  if (src == nullptr) throw std::invalid_argument("make_weight: source is null");
  Weight out;
  WeightView& v = out.view;
  v.format = target;
  v.rows = rows;
  v.cols = cols;
  if (is_dense(target)) {
    const size_t n = static_cast<size_t>(rows * cols);
    out.data = tiering::LedgerBuffer(ledger, account, n * dense_element_size(target));
    if (target == WeightFormat::f32) {
      float* dst = out.data.as<float>();
      if (src_type == SourceType::f32) {
        std::memcpy(dst, src, n * 4);
      } else {
        for (size_t i = 0; i < n; ++i) dst[i] = read_source(src, src_type, static_cast<int64_t>(i));
      }
    } else {
      uint16_t* dst = out.data.as<uint16_t>();
      const SourceType same = target == WeightFormat::f16 ? SourceType::f16 : SourceType::bf16;
      if (src_type == same) {
        std::memcpy(dst, src, n * 2);
      } else {
        for (size_t i = 0; i < n; ++i) {
          const float f = read_source(src, src_type, static_cast<int64_t>(i));
          dst[i] = target == WeightFormat::f16 ? f32_to_f16(f) : f32_to_bf16(f);
        }
      }
    }
    v.data = out.data.data();
    return out;
  }
  if (target != WeightFormat::q8_0 && target != WeightFormat::q4)
    throw std::invalid_argument(std::string("make_weight: cannot quantize into ") + format_name(target) +
                                " (use make_mlx_weight / make_mxfp4_weight for MLX / MXFP4 tensors)");
  if (cols % 32 != 0)
    throw std::invalid_argument(std::string("make_weight: ") + format_name(target) +
                                " needs cols to be a multiple of the group size 32 (got cols = " +
                                std::to_string(cols) + ")");
  v.bits = target == WeightFormat::q8_0 ? 8 : 4;
  v.group_size = 32;
  v.scale_type = SourceType::f16;
  const PackedSizes sizes = packed_sizes(v);
  out.data = tiering::LedgerBuffer(ledger, account, sizes.data);
  out.scales = tiering::LedgerBuffer(ledger, account, sizes.scales);
  if (sizes.biases) out.biases = tiering::LedgerBuffer(ledger, account, sizes.biases);
  // Padding rows: code for 0 with scale 0 (q8_0: u = 128; q4: u = 0, m = 0).
  std::memset(out.data.data(), target == WeightFormat::q8_0 ? 128 : 0, sizes.data);
  std::memset(out.scales.data(), 0, sizes.scales);
  if (sizes.biases) std::memset(out.biases.data(), 0, sizes.biases);

  const int64_t groups = cols / 32;
  const int64_t panel_bytes = cols * kPanelRows * v.bits / 8;
  std::vector<float> row(static_cast<size_t>(cols));
  std::vector<uint8_t> codes(static_cast<size_t>(cols));
  std::vector<uint16_t> d(static_cast<size_t>(groups)), m(static_cast<size_t>(groups));
  uint16_t* d_out = out.scales.as<uint16_t>();
  uint16_t* m_out = sizes.biases ? out.biases.as<uint16_t>() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    if (src_type == SourceType::f32) {
      std::memcpy(row.data(), static_cast<const float*>(src) + r * cols, static_cast<size_t>(cols) * 4);
    } else {
      for (int64_t c = 0; c < cols; ++c) row[c] = read_source(src, src_type, r * cols + c);
    }
    if (target == WeightFormat::q8_0) {
      quantize_q8_0_row(row.data(), cols, codes.data(), d.data());
    } else {
      quantize_q4_row(row.data(), cols, codes.data(), d.data(), m.data());
    }
    pack_row_codes(out.data.as<uint8_t>(), panel_bytes, v.bits, r, cols, codes.data());
    const int64_t p = r / kPanelRows;
    const int lane = static_cast<int>(r % kPanelRows);
    for (int64_t g = 0; g < groups; ++g) {
      d_out[(p * groups + g) * kPanelRows + lane] = d[g];
      if (m_out) m_out[(p * groups + g) * kPanelRows + lane] = m[g];
    }
  }
  v.data = out.data.data();
  v.scales = out.scales.data();
  v.biases = sizes.biases ? out.biases.data() : nullptr;
  return out;
}

Weight make_mlx_weight(const void* packed, const void* scales, const void* biases, SourceType scale_type,
                       int64_t rows, int64_t cols, int group_size, int bits, tiering::Ledger& ledger,
                       const std::string& account) {
  validate_shape(rows, cols, "make_mlx_weight");
  if (bits != 4 && bits != 8)
    throw std::invalid_argument("make_mlx_weight: bits must be 4 or 8 (got " + std::to_string(bits) + ")");
  if (group_size != 32 && group_size != 64 && group_size != 128)
    throw std::invalid_argument("make_mlx_weight: group_size must be 32, 64 or 128 (got " +
                                std::to_string(group_size) + ")");
  if (cols % group_size != 0)
    throw std::invalid_argument("make_mlx_weight: cols (" + std::to_string(cols) +
                                ") must be a multiple of group_size (" + std::to_string(group_size) + ")");
  if (packed == nullptr || scales == nullptr || biases == nullptr)
    throw std::invalid_argument("make_mlx_weight: packed, scales and biases must all be given");
  Weight out;
  WeightView& v = out.view;
  v.format = bits == 4 ? WeightFormat::mlx_q4 : WeightFormat::mlx_q8;
  v.rows = rows;
  v.cols = cols;
  v.bits = bits;
  v.group_size = group_size;
  v.scale_type = scale_type;
  const PackedSizes sizes = packed_sizes(v);
  out.data = tiering::LedgerBuffer(ledger, account, sizes.data);
  out.scales = tiering::LedgerBuffer(ledger, account, sizes.scales);
  out.biases = tiering::LedgerBuffer(ledger, account, sizes.biases);
  // Every byte, padding rows included, is written by the repack.
  pack_mlx_rows(packed, scales, biases, scale_type, rows, cols, group_size, bits,
                {out.data.data(), out.scales.data(), out.biases.data(), rows, 0});
  v.data = out.data.data();
  v.scales = out.scales.data();
  v.biases = out.biases.data();
  return out;
}

Weight make_mxfp4_weight(const void* blocks, const void* scales, int64_t rows, int64_t cols, tiering::Ledger& ledger,
                         const std::string& account) {
  validate_shape(rows, cols, "make_mxfp4_weight");
  if (cols % kMxfp4Block != 0)
    throw std::invalid_argument("make_mxfp4_weight: cols (" + std::to_string(cols) + ") must be a multiple of 32");
  if (blocks == nullptr || scales == nullptr)
    throw std::invalid_argument("make_mxfp4_weight: blocks and scales must both be given");
  Weight out;
  WeightView& v = out.view;
  v.format = WeightFormat::mxfp4;
  v.rows = rows;
  v.cols = cols;
  v.bits = 4;
  v.group_size = kMxfp4Block;
  const size_t groups = size_t(rows) * size_t(cols / kMxfp4Block);
  out.data = tiering::LedgerBuffer(ledger, account, groups * kMxfp4BlockBytes);
  out.scales = tiering::LedgerBuffer(ledger, account, groups);
  std::memcpy(out.data.data(), blocks, groups * kMxfp4BlockBytes);
  std::memcpy(out.scales.data(), scales, groups);
  v.data = out.data.data();
  v.scales = out.scales.data();
  return out;
}

void dequantize_row(const WeightView& w, int64_t row, float* out) {
  if (row < 0 || row >= w.rows)
    throw std::out_of_range("dequantize_row: row " + std::to_string(row) + " outside [0, " + std::to_string(w.rows) +
                            ")");
  if (w.format == WeightFormat::mxfp4) {
    const int64_t groups = w.cols / kMxfp4Block;
    mxfp4_dequantize_row(static_cast<const uint8_t*>(w.data) + row * groups * kMxfp4BlockBytes,
                         static_cast<const uint8_t*>(w.scales) + row * groups, w.cols, out);
    return;
  }
  if (is_dense(w.format)) {
    if (w.format == WeightFormat::f32) {
      std::memcpy(out, static_cast<const float*>(w.data) + row * w.cols, static_cast<size_t>(w.cols) * 4);
    } else {
      active_kernels().dense_to_f32(w.format, w.data, w.cols, row, row + 1, out);
    }
    return;
  }
  const PackedView p = packed_view(w);
  const int64_t panel = row / kPanelRows;
  const int lane = static_cast<int>(row % kPanelRows);
  for (int64_t g = 0; g < p.groups(); ++g) {
    const int64_t si = (panel * p.groups() + g) * kPanelRows + lane;
    const float d = load_scale(p.d, p.scale_type, si);
    const float m = p.symmetric() ? -128.0f * d : load_scale(p.m, p.scale_type, si);
    for (int64_t c = g * p.group; c < (g + 1) * p.group; ++c) {
      if (p.symmetric()) {
        out[c] = d * static_cast<float>(static_cast<int>(packed_code(p, panel, lane, c)) - 128);
      } else {
        out[c] = d * static_cast<float>(packed_code(p, panel, lane, c)) + m;
      }
    }
  }
}

// ---- matvec / matmul ------------------------------------------------------------------------------------------

namespace {

// The int8 activations of n rows of `cols` columns in the calling thread's MatmulScratch.
struct ActivationScratch {
  int8_t* q;
  float* dx;
  int32_t* isum;
  float* xsum;
  QuantizedRow* rows;
};

ActivationScratch activation_scratch(const MatmulScratch::Sizes& need) {
  MatmulScratch& s = MatmulScratch::current();
  return {static_cast<int8_t*>(s.region(MatmulScratch::act_values, need[MatmulScratch::act_values])),
          static_cast<float*>(s.region(MatmulScratch::act_scales, need[MatmulScratch::act_scales])),
          static_cast<int32_t*>(s.region(MatmulScratch::act_int_sums, need[MatmulScratch::act_int_sums])),
          static_cast<float*>(s.region(MatmulScratch::act_sums, need[MatmulScratch::act_sums])),
          static_cast<QuantizedRow*>(s.region(MatmulScratch::act_rows, need[MatmulScratch::act_rows]))};
}

float* scratch_floats(MatmulScratch::Region r, const MatmulScratch::Sizes& need) {
  return static_cast<float*>(MatmulScratch::current().region(r, need[size_t(r)]));
}

struct PackedMatvecJob {
  const KernelTable* kernels;
  PackedView w;
  QuantizedRow x;
  float* y;
};

struct DenseMatvecJob {
  const KernelTable* kernels;
  const WeightView* w;
  const float* x;
  float* y;
};

struct QuantizeJob {
  const KernelTable* kernels;
  const float* x;
  int64_t cols;
  const ActivationScratch* scratch;
};

struct PackedMatmulJob {
  const KernelTable* kernels;
  PackedView w;
  const QuantizedRow* x;
  int64_t n;
  float* y;
};
struct AmxJob {
  PackedView w;
  const float* x;
  uint16_t* xb;
  int64_t n;
  float* y;
};

struct DenseSmallBatchJob {
  const KernelTable* kernels;
  const WeightView* w;
  const float* x;
  int64_t n;
  float* y;
};

struct DenseGemmJob : DenseSmallBatchJob {
  int64_t groups;      // activation rows are split into this many groups
  int64_t group_rows;  // rows per group (the last may be short)
};

struct AffineF32Job {
  AffineF32Kernel kernel;
  PackedView w;
  const float* x;
  const float* gsum;
  int64_t n;
  float* y;
};

struct DenseTileJob {
  const KernelTable* kernels;
  const WeightView* w;
  int64_t r0;
  float* out;
};

struct Mxfp4Job {
  const WeightView* w;
  const float* x;
  int64_t n;
  float* y;
  bool avx512;
};

// MXFP4: units of 16 weight rows, each decoded once for all n activation rows.

void mxfp4_multiply(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool) {
  const bool avx512 = active_isa() == Isa::avx512;
  if (avx512) {  // the AVX-512 kernel reads each block's inputs as [16 even | 16 odd]
    float* split = scratch_floats(MatmulScratch::mxfp4_split, matmul_scratch_sizes(w, n));
    mxfp4_split_activations(x, n, w.cols, split);
    x = split;
  }
  Mxfp4Job job{&w, x, n, y, avx512};
  pool.parallel_for((w.rows + kPanelRows - 1) / kPanelRows, [](void* ctx, int64_t b, int64_t e, int) {
    auto* j = static_cast<Mxfp4Job*>(ctx);
    const auto* blocks = static_cast<const uint8_t*>(j->w->data);
    const auto* scales = static_cast<const uint8_t*>(j->w->scales);
    const int64_t r0 = b * kPanelRows, r1 = std::min(e * kPanelRows, j->w->rows);
    (j->avx512 ? mxfp4_rows_avx512 : mxfp4_rows_scalar)(blocks, scales, j->w->cols, r0, r1, j->x, j->n, j->y,
                                                        j->w->rows);
  }, &job);
}

// MLX weights with f32 activations (affine_f32.h), unless a bench forced MLX onto the int8-activation kernels.
bool takes_f32_activations(WeightFormat format) {
  return (format == WeightFormat::mlx_q4 || format == WeightFormat::mlx_q8) && mlx_activations() == MlxActivations::f32;
}
bool takes_f32_activations(const WeightView& w) { return takes_f32_activations(w.format); }

void affine_f32_multiply(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool) {
  const int64_t groups = w.cols / w.group_size;
  float* gsum = scratch_floats(MatmulScratch::group_sums, matmul_scratch_sizes(w, n));
  for (int64_t i = 0; i < n; ++i) group_sums(x + i * w.cols, w.cols, w.group_size, gsum + i * groups);
  AffineF32Job job{affine_f32_kernel(), packed_view(w), x, gsum, n, y};
  pool.parallel_for(job.w.panels, [](void* ctx, int64_t b, int64_t e, int) {
    auto* j = static_cast<AffineF32Job*>(ctx);
    j->kernel(j->w, j->x, j->gsum, j->n, j->y, j->w.rows, b, e);
  }, &job);
}

}  // namespace

void matvec(const WeightView& w, const float* x, float* y, ThreadPool& pool) {
  if (w.format == WeightFormat::mxfp4) return mxfp4_multiply(w, x, 1, y, pool);
  if (takes_f32_activations(w)) return affine_f32_multiply(w, x, 1, y, pool);
  const KernelTable& k = active_kernels();
  if (is_dense(w.format)) {
    DenseMatvecJob job{&k, &w, x, y};
    const int64_t units = (w.rows + kPanelRows - 1) / kPanelRows;
    pool.parallel_for(units, [](void* ctx, int64_t b, int64_t e, int) {
      auto* j = static_cast<DenseMatvecJob*>(ctx);
      j->kernels->dense_matvec(j->w->format, j->w->data, j->w->cols, j->x, j->y, b * kPanelRows,
                               std::min(e * kPanelRows, j->w->rows));
    }, &job);
    return;
  }
  const ActivationScratch s = activation_scratch(matmul_scratch_sizes(w, 1));
  k.quantize_row(x, w.cols, s.q, s.dx, s.isum, s.xsum);
  PackedMatvecJob job{&k, packed_view(w), {s.q, s.dx, s.isum, s.xsum}, y};
  pool.parallel_for(job.w.panels, [](void* ctx, int64_t b, int64_t e, int) {
    auto* j = static_cast<PackedMatvecJob*>(ctx);
    j->kernels->packed_matvec(j->w, j->x, j->y, b, e);
  }, &job);
}

bool matvec_batch_supported(WeightFormat format) { return format != WeightFormat::mxfp4; }

namespace {

struct MatvecBatchJob {
  const KernelTable* kernels;
  AffineF32Kernel affine;
  std::span<const MatvecTask> tasks;
  const int64_t* first;  // first[t]: task t's first unit; first[tasks.size()]: every unit
  const QuantizedRow* rows;  // packed formats: task t's quantized x
  const float* gsum;     // MLX affine: task t's group sums at t * groups
  int64_t groups;
};

// Units [b, e) of a MatvecBatchJob: each task's share of them, with matvec's kernel.
void matvec_batch_units(void* ctx, int64_t b, int64_t e, int) {
  const auto* j = static_cast<const MatvecBatchJob*>(ctx);
  size_t t = size_t(std::upper_bound(j->first, j->first + j->tasks.size() + 1, b) - j->first) - 1;
  for (; b < e; ++t) {
    const int64_t end = std::min(e, j->first[t + 1]);
    const int64_t p0 = b - j->first[t], p1 = end - j->first[t];
    const MatvecTask& task = j->tasks[t];
    const WeightView& w = *task.w;
    if (is_dense(w.format)) {
      j->kernels->dense_matvec(w.format, w.data, w.cols, task.x, task.y, p0 * kPanelRows,
                               std::min(p1 * kPanelRows, w.rows));
    } else if (j->affine) {
      j->affine(packed_view(w), task.x, j->gsum + int64_t(t) * j->groups, 1, task.y, w.rows, p0, p1);
    } else {
      j->kernels->packed_matvec(packed_view(w), j->rows[t], task.y, p0, p1);
    }
    b = end;
  }
}

}  // namespace

void matvec_batch(std::span<const MatvecTask> tasks, ThreadPool& pool) {
  if (tasks.empty()) return;
  const WeightView& w0 = *tasks[0].w;
  for (const MatvecTask& t : tasks)
    if (t.w->format != w0.format || t.w->cols != w0.cols || t.w->group_size != w0.group_size)
      throw std::invalid_argument("matvec_batch: tasks of different formats or shapes");
  if (!matvec_batch_supported(w0.format))
    throw std::invalid_argument(std::string("matvec_batch: no batched matvec for ") + format_name(w0.format));
  const KernelTable& k = active_kernels();
  const int64_t n = int64_t(tasks.size());
  // Each task's first unit, on the stack for a decode step's experts (no allocation per step), else on the heap.
  int64_t small[33];
  std::vector<int64_t> large;
  if (tasks.size() >= std::size(small)) large.resize(tasks.size() + 1);
  int64_t* first = large.empty() ? small : large.data();
  first[0] = 0;
  for (size_t t = 0; t < tasks.size(); ++t) {
    const WeightView& w = *tasks[t].w;
    first[t + 1] = first[t] + (is_dense(w.format) ? (w.rows + kPanelRows - 1) / kPanelRows : packed_view(w).panels);
  }
  MatvecBatchJob job{&k, nullptr, tasks, first, nullptr, nullptr, 0};
  if (takes_f32_activations(w0)) {
    job.affine = affine_f32_kernel();
    job.groups = w0.cols / w0.group_size;
    float* gsum = scratch_floats(MatmulScratch::group_sums, matmul_scratch_sizes(w0, n));
    for (int64_t t = 0; t < n; ++t) group_sums(tasks[size_t(t)].x, w0.cols, w0.group_size, gsum + t * job.groups);
    job.gsum = gsum;
  } else if (!is_dense(w0.format)) {
    const ActivationScratch s = activation_scratch(matmul_scratch_sizes(w0, n));
    const int64_t blocks = w0.cols / kActBlock;
    for (int64_t t = 0; t < n; ++t) {
      k.quantize_row(tasks[size_t(t)].x, w0.cols, s.q + t * w0.cols, s.dx + t * blocks, s.isum + t * blocks,
                     s.xsum + t * blocks);
      s.rows[t] = {s.q + t * w0.cols, s.dx + t * blocks, s.isum + t * blocks, s.xsum + t * blocks};
    }
    job.rows = s.rows;
  }
  pool.parallel_for(first[tasks.size()], matvec_batch_units, &job);
}

// Up to this many activation rows, dense matmul runs the matvec kernel per row on cache-resident blocks (f32 too,
// where the backend has the GEMM kernel).
constexpr int64_t kSmallDenseBatch = 16;
// Weight rows per unit of work of the dense GEMM kernel (a multiple of its packed block).
constexpr int64_t kDenseGemmRows = 64;

// Rows of a dense matrix widened to f32 at a time when there is no GEMM kernel: about 4 MiB of f32.
int64_t dense_tile_rows(int64_t cols) {
  return std::max<int64_t>(kPanelRows, (int64_t{1} << 20) / cols / kPanelRows * kPanelRows);
}

MatmulScratch::Sizes matmul_scratch_sizes(WeightFormat format, int64_t rows, int64_t cols, int group_size, int64_t n) {
  MatmulScratch::Sizes s{};
  if (n <= 0 || rows <= 0 || cols <= 0) return s;
  const size_t values = size_t(n * cols);
  if (format == WeightFormat::mxfp4) {
    if (active_isa() == Isa::avx512) s[MatmulScratch::mxfp4_split] = values * sizeof(float);
    return s;
  }
  if (takes_f32_activations(format)) {
    s[MatmulScratch::group_sums] = size_t(n * (cols / group_size)) * sizeof(float);
    return s;
  }
  if (is_dense(format)) {
    if (n > kSmallDenseBatch && format != WeightFormat::f32 && active_kernels().dense_matmul == nullptr)
      s[MatmulScratch::dense_tile] = size_t(std::min(dense_tile_rows(cols), rows) * cols) * sizeof(float);
    return s;
  }
  // Where the CPU has AMX, matmul of kAmxMinRows rows or more multiplies a bf16 copy of its whole tiles of 16 rows
  // (the rest take the int8 regions); it is counted at every n, beside the int8 regions, so that the scratch stays
  // linear in n with no fixed part (the planner measures it at 1 and 2 rows) and what n rows reserve covers fewer.
  if (amx_enabled()) s[MatmulScratch::act_bf16] = size_t(n * cols) * sizeof(uint16_t);
  const size_t blocks = size_t(n * (cols / kActBlock));
  s[MatmulScratch::act_values] = values;
  s[MatmulScratch::act_scales] = blocks * sizeof(float);
  s[MatmulScratch::act_int_sums] = blocks * sizeof(int32_t);
  s[MatmulScratch::act_sums] = blocks * sizeof(float);
  s[MatmulScratch::act_rows] = size_t(n) * sizeof(QuantizedRow);
  return s;
}

bool matmul_uses_amx() { return amx_enabled(); }

bool matmul_uses_blas(WeightFormat format, int64_t n) {
  if (n <= 1 || !is_dense(format) || active_kernels().dense_matmul != nullptr) return false;
  return format == WeightFormat::f32 || n > kSmallDenseBatch;
}

void matmul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool) {
  if (n <= 0) return;
  if (w.format == WeightFormat::mxfp4) return mxfp4_multiply(w, x, n, y, pool);
  const KernelTable& k = active_kernels();
  if (n == 1) return matvec(w, x, y, pool);
  if (takes_f32_activations(w)) return affine_f32_multiply(w, x, n, y, pool);
  if (is_dense(w.format)) {
    if (w.format == WeightFormat::f32 && k.dense_matmul == nullptr) {  // a backend without the GEMM kernel
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(n), static_cast<blasint>(w.rows),
                  static_cast<blasint>(w.cols), 1.0f, x, static_cast<blasint>(w.cols),
                  static_cast<const float*>(w.data), static_cast<blasint>(w.cols), 0.0f, y,
                  static_cast<blasint>(w.rows));
      return;
    }
    if (n <= kSmallDenseBatch) {
      // A few rows (batched decode): widening the whole matrix to f32 for sgemm would cost more than it saves.
      // Instead each 16-row block is multiplied against every activation row while it is still in L1/L2, so the
      // weights are read from memory once for the whole batch.
      DenseSmallBatchJob job{&k, &w, x, n, y};
      pool.parallel_for((w.rows + kPanelRows - 1) / kPanelRows, [](void* ctx, int64_t b, int64_t e, int) {
        auto* j = static_cast<DenseSmallBatchJob*>(ctx);
        for (int64_t block = b; block < e; ++block) {
          const int64_t r0 = block * kPanelRows, r1 = std::min(r0 + kPanelRows, j->w->rows);
          for (int64_t t = 0; t < j->n; ++t)
            j->kernels->dense_matvec(j->w->format, j->w->data, j->w->cols, j->x + t * j->w->cols,
                                     j->y + t * j->w->rows, r0, r1);
        }
      }, &job);
      return;
    }
    if (k.dense_matmul != nullptr) {
      // Units are (block of kDenseGemmRows weight rows, group of activation rows); activation rows are split only
      // when there are too few weight blocks to keep every thread busy, since each group repacks its blocks.
      const int64_t blocks = (w.rows + kDenseGemmRows - 1) / kDenseGemmRows;
      const int64_t groups =
          std::clamp<int64_t>((2 * pool.size() + blocks - 1) / blocks, 1, std::max<int64_t>(1, n / 48));
      DenseGemmJob job{{&k, &w, x, n, y}, groups, (n + groups - 1) / groups};
      pool.parallel_for(blocks * groups, [](void* ctx, int64_t b, int64_t e, int) {
        auto* j = static_cast<DenseGemmJob*>(ctx);
        const WeightView& w = *j->w;
        if (j->groups == 1) {  // one call over the thread's whole run of blocks
          j->kernels->dense_matmul(w.format, w.data, w.rows, w.cols, j->x, 0, j->n, j->y, w.rows, b * kDenseGemmRows,
                                   std::min(e * kDenseGemmRows, w.rows));
          return;
        }
        for (int64_t u = b; u < e; ++u) {
          const int64_t block = u / j->groups, group = u % j->groups;
          const int64_t i0 = group * j->group_rows, i1 = std::min(j->n, i0 + j->group_rows);
          if (i0 >= i1) continue;
          j->kernels->dense_matmul(w.format, w.data, w.rows, w.cols, j->x, i0, i1, j->y, w.rows,
                                   block * kDenseGemmRows, std::min((block + 1) * kDenseGemmRows, w.rows));
        }
      }, &job);
      return;
    }
    // f16/bf16 without a GEMM kernel: widen a tile of rows (about 4 MiB of f32) at a time, then one sgemm per tile.
    const int64_t tile_rows = dense_tile_rows(w.cols);
    float* tile = scratch_floats(MatmulScratch::dense_tile, matmul_scratch_sizes(w, n));
    for (int64_t r0 = 0; r0 < w.rows; r0 += tile_rows) {
      const int64_t r1 = std::min(w.rows, r0 + tile_rows);
      DenseTileJob job{&k, &w, r0, tile};
      pool.parallel_for((r1 - r0 + kPanelRows - 1) / kPanelRows, [](void* ctx, int64_t b, int64_t e, int) {
        auto* j = static_cast<DenseTileJob*>(ctx);
        const int64_t a = j->r0 + b * kPanelRows;
        const int64_t z = std::min(j->r0 + e * kPanelRows, j->w->rows);
        j->kernels->dense_to_f32(j->w->format, j->w->data, j->w->cols, a, z, j->out + (a - j->r0) * j->w->cols);
      }, &job);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(n), static_cast<blasint>(r1 - r0),
                  static_cast<blasint>(w.cols), 1.0f, x, static_cast<blasint>(w.cols), tile,
                  static_cast<blasint>(w.cols), 0.0f, y + r0, static_cast<blasint>(w.rows));
    }
    return;
  }
  if (n >= kAmxMinRows && amx_enabled()) {
    // AMX: the whole tiles of 16 rows once as bf16, then the panels on the tiles; the last n % 16 rows below, on the
    // int8 kernels.
    const int64_t tiled = n / 16 * 16;
    const MatmulScratch::Sizes need = matmul_scratch_sizes(w, n);
    auto* xb = static_cast<uint16_t*>(MatmulScratch::current().region(MatmulScratch::act_bf16,
                                                                        need[MatmulScratch::act_bf16]));
    AmxJob job{packed_view(w), x, xb, tiled, y};
    pool.parallel_for(tiled / 16, [](void* ctx, int64_t b, int64_t e, int) {
      auto* j = static_cast<AmxJob*>(ctx);
      activations_to_bf16_amx(j->x, j->w.cols, b * 16, e * 16, j->xb);
    }, &job);
    pool.parallel_for(job.w.panels, [](void* ctx, int64_t b, int64_t e, int) {
      auto* j = static_cast<AmxJob*>(ctx);
      packed_matmul_bf16_amx(j->w, j->xb, j->n, j->y, j->w.rows, b, e);
    }, &job);
    if (tiled == n) return;
    x += tiled * w.cols;
    y += tiled * w.rows;
    n -= tiled;
  }
  const ActivationScratch s = activation_scratch(matmul_scratch_sizes(w, n));
  const int64_t blocks = w.cols / kActBlock;
  for (int64_t i = 0; i < n; ++i)
    s.rows[i] = {s.q + i * w.cols, s.dx + i * blocks, s.isum + i * blocks, s.xsum + i * blocks};
  QuantizeJob qjob{&k, x, w.cols, &s};
  pool.parallel_for(n, [](void* ctx, int64_t b, int64_t e, int) {
    auto* j = static_cast<QuantizeJob*>(ctx);
    const int64_t blocks = j->cols / kActBlock;
    for (int64_t i = b; i < e; ++i) {
      j->kernels->quantize_row(j->x + i * j->cols, j->cols, j->scratch->q + i * j->cols, j->scratch->dx + i * blocks,
                               j->scratch->isum + i * blocks, j->scratch->xsum + i * blocks);
    }
  }, &qjob);
  PackedMatmulJob job{&k, packed_view(w), s.rows, n, y};
  pool.parallel_for(job.w.panels, [](void* ctx, int64_t b, int64_t e, int) {
    auto* j = static_cast<PackedMatmulJob*>(ctx);
    j->kernels->packed_matmul(j->w, j->x, j->n, j->y, j->w.rows, b, e);
  }, &job);
}

}  // namespace tierlm::kernels
