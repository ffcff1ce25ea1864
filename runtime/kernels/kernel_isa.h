// runtime/kernels/kernel_isa.h — internal: the packed quantized layout shared by every kernel backend, the
// quantized-activation scratch, and the per-ISA kernel tables chosen at run time.
// Owns: the contract between weights.cpp (packing, dispatch) and kernels_{scalar,avx2,avx512}.cpp (math).
// Never: included by code outside runtime/kernels and its tests.
#pragma once

#include <cstdint>
#include <cstring>

#include "runtime/kernels/weights.h"

namespace tierlm::kernels {

// ---- Instruction-set dispatch --------------------------------------------------------------------------------
enum class Isa : uint8_t { scalar, avx2, avx512 };
const char* isa_name(Isa isa);
// Best ISA this CPU supports (AVX-512 needs F/BW/VL/DQ/VNNI; AVX2 needs AVX2/FMA/F16C).
Isa detected_isa();
// ISA the kernels use now: detected_isa() unless forced. Forcing an unsupported ISA throws std::invalid_argument.
Isa active_isa();
// Test/bench hook: forces an ISA for all subsequent calls (process-wide). Pass detected_isa() to restore.
void set_isa_for_testing(Isa isa);

// AMX (AMX-TILE + AMX-BF16 with AVX512-BF16: Sapphire Rapids and later) for the packed prefill GEMM:
// amx_supported() when the CPU has them and the OS granted this process the tile state (arch_prctl, asked once);
// amx_enabled() when also AVX-512 is the active ISA and AMX is not switched off (TIERLM_AMX=0 at start, or
// set_amx_for_testing(false)). set_amx_for_testing(true) where !amx_supported() throws std::invalid_argument.
bool amx_supported();
bool amx_enabled();
void set_amx_for_testing(bool on);
// Activation rows from which matmul takes the AMX path (packed_matmul_amx.cpp) where it is enabled.
inline constexpr int64_t kAmxMinRows = 32;

// ---- Packed layout (q8_0, q4, mlx_q4, mlx_q8) -----------------------------------------------------------------
// Rows are grouped into panels of kPanelRows; the last panel is padded with zero rows (scale 0).
// Within a panel, columns are walked in "quads" of 4: one quad holds 16 rows x 4 consecutive columns = 64 bytes
// (row r at bytes [4r, 4r+4)). That is exactly what one vpdpbusd consumes against a broadcast 4-byte activation
// chunk, and it leaves one int32 lane per row, so a panel's 16 outputs need no horizontal reduction.
//   bits = 8: panel p is 16*cols bytes; quad k at offset k*64 (unsigned codes u in [0,255]).
//   bits = 4: panel p is 8*cols bytes; each 32-column block b is 256 bytes = 4 chunks of 64; chunk c holds quad
//             8b+c in the low nibbles and quad 8b+c+4 in the high nibbles.
// Scales: d[(p*groups + g)*16 + r] per row and group of `group` columns, element type `scale_type`
// (f16 for our own formats, the source type for MLX so its math is kept bit-exact).
// Value:  affine:    w = d*u + m, with m stored like d.
//         symmetric: w = d*(u - 128)   (q8_0: u = q + 128, q in [-127,127]); m is not stored.
inline constexpr int kPanelRows = 16;
inline constexpr int kActBlock = 32;  // activation quantization block (columns)

struct PackedView {
  const uint8_t* data = nullptr;
  const void* d = nullptr;
  const void* m = nullptr;  // null when symmetric
  SourceType scale_type = SourceType::f16;
  int bits = 8;
  int group = 32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t panels = 0;
  int64_t groups() const { return cols / group; }
  bool symmetric() const { return m == nullptr; }
  int64_t panel_bytes() const { return cols * kPanelRows * bits / 8; }
};

// An activation row quantized once per call: q[cols] int8 in [-127,127] per block of 32 with scale dx[b] and
// integer sum isum[b]; xsum[b] = dx[b]*isum[b] (the dequantized block sum, for the affine bias term).
struct QuantizedRow {
  const int8_t* q;
  const float* dx;
  const int32_t* isum;
  const float* xsum;
};

// ---- Scalar helpers -------------------------------------------------------------------------------------------
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round to nearest even, saturates to inf like hardware
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_bf16(float f);  // round to nearest even
inline float load_scale(const void* p, SourceType t, int64_t i) {
  switch (t) {
    case SourceType::f32: return static_cast<const float*>(p)[i];
    case SourceType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case SourceType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}

// ---- Kernel table ---------------------------------------------------------------------------------------------
struct KernelTable {
  // Quantizes x[cols] (cols % 32 == 0) into q/dx/isum/xsum (arrays sized cols and cols/32).
  void (*quantize_row)(const float* x, int64_t cols, int8_t* q, float* dx, int32_t* isum, float* xsum);
  // y[p*16 + r] for panels [p0, p1) of a packed weight; rows past w.rows are not written.
  void (*packed_matvec)(const PackedView& w, const QuantizedRow& x, float* y, int64_t p0, int64_t p1);
  // Y[i*ldy + row] for i in [0, n) and panels [p0, p1): reuses each weight quad across many activation rows.
  void (*packed_matmul)(const PackedView& w, const QuantizedRow* x, int64_t n, float* y, int64_t ldy, int64_t p0,
                        int64_t p1);
  // y[r] = W[r,:]·x for rows [r0, r1) of a dense f32/f16/bf16 row-major weight.
  void (*dense_matvec)(WeightFormat f, const void* w, int64_t cols, const float* x, float* y, int64_t r0, int64_t r1);
  // out[rows*cols] f32 from rows [r0, r1) of a dense f16/bf16 weight (f32 is never converted).
  void (*dense_to_f32)(WeightFormat f, const void* w, int64_t cols, int64_t r0, int64_t r1, float* out);
  // Y[i*ldy + r] = X[i,:]·W[r,:] for activation rows i in [i0, i1) and weight rows r in [r0, r1) of a dense
  // f32/f16/bf16 [rows x cols] weight, on the calling thread (prefill). Null where the backend has none (matmul then
  // calls sgemm, widening f16/bf16 tiles to f32 first).
  void (*dense_matmul)(WeightFormat f, const void* w, int64_t rows, int64_t cols, const float* x, int64_t i0,
                       int64_t i1, float* y, int64_t ldy, int64_t r0, int64_t r1);
};

void dense_matmul_avx512(WeightFormat f, const void* w, int64_t rows, int64_t cols, const float* x, int64_t i0,
                         int64_t i1, float* y, int64_t ldy, int64_t r0, int64_t r1);
// The AMX prefill GEMM (packed_matmul_amx.cpp; only where amx_enabled()). activations_to_bf16_amx: rows [r0, r1) of
// the bf16 copy of x (rows of cols f32). packed_matmul_bf16_amx: Y[i*ldy + row] for i in [0, n) (n a multiple of 16)
// and panels [p0, p1) from that copy, in f32 sums of bf16 products of the dequantized weights (not bit-equal to the
// int8 kernels: see the file).
void activations_to_bf16_amx(const float* x, int64_t cols, int64_t r0, int64_t r1, uint16_t* out);
void packed_matmul_bf16_amx(const PackedView& w, const uint16_t* xb, int64_t n, float* y, int64_t ldy, int64_t p0,
                            int64_t p1);

const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();
const KernelTable& active_kernels();

}  // namespace tierlm::kernels
