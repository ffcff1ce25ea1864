// runtime/kv/attention.h — attention of a group of query heads (sharing one kv head) over compressed pages,
// computed block by block with an online softmax: scores straight from codes and norms, values accumulated in the
// codec's space (rotated for turbo, un-rotated once per head at the end). No position is ever decompressed.
// Owns: query preparation (scaling; for turbo the rotation and the QJL projection, once per head), the online
// softmax, and the per-ISA block kernels. Never: allocate (scratch is on the stack, sized by the layout limits).
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/kv/codec.h"

namespace tierlm::kv {

inline constexpr int kMaxGroup = 4;  // heads processed together; larger groups are split

// The softmax's exp(x - max) is 0 for x - max below this (exp(-87) = 1.6e-38, just above FLT_MIN), never a
// denormal: a model whose scores spread past 87 (random synthetic weights do) otherwise feeds the value accumulation
// denormal weights, and on Intel cores every FMA with a denormal operand takes a microcode assist (measured: a 16-thread
// Xeon's prefill chunk spent ~30 of its 130 ms there). The dropped terms are under 1.7e-38 of the largest weight.
inline constexpr float kSoftmaxExpFloor = -87.0f;
inline float softmax_exp(float x) { return x < kSoftmaxExpFloor ? 0.0f : std::exp(x); }

// Prepared queries for `heads` heads; each array is heads x head_dim.
struct QueryGroup {
  int heads = 0;
  const float* a = nullptr;      // f32/f16/q8: q * softmax scale; turbo: R q * scale / sqrt(d)
  const float* b = nullptr;      // turbo with QJL: S R q * scale * sqrt(pi/2) / d; else null
  const float* b_sum = nullptr;  // per head: sum of b
};

struct AttentionKernels {
  // scores[h * kBlockTokens + t] = q_h . key_t (softmax scale included) for t < tokens of one page's key region.
  void (*score)(const CodecLayout& layout, const uint8_t* keys, int tokens, const QueryGroup& q, float* scores);
  // acc[h * d + j] += sum_t weights[h * kBlockTokens + t] * value_t[j]; for turbo, value_t is the norm times the
  // N(0,1) centroids of its codes (still rotated, not yet divided by sqrt(d)).
  void (*accumulate)(const CodecLayout& layout, const uint8_t* values, int tokens, const float* weights, int heads,
                     float* acc);
  // x[i] = exp(x[i] - max) for i < n; returns their sum.
  float (*exp_sum)(float* x, int n, float max);
};

const AttentionKernels& scalar_attention_kernels();
const AttentionKernels& avx512_attention_kernels();  // only on CPUs with AVX-512F/BW/VL/DQ
// AVX-512 where the CPU has it, unless forced to the scalar reference (tests and benches).
const AttentionKernels& active_attention_kernels();
void force_scalar_attention(bool scalar);
bool avx512_attention_available();

// Attention over positions [start, len) of a layer. Absolute page p (positions [p*kBlockTokens, (p+1)*kBlockTokens))
// is pages[p % ring]: a full-attention layer passes all its pages (ring >= pages used), a windowed layer its ring,
// whose pages are reused once their positions left the window. This head's regions start at pages[i] + head_offset
// (keys) and + layout.key_bytes (values). Slots of the first page before `start` get weight 0, whatever they hold.
// q and out: heads x head_dim, out may not alias q. sinks (gpt-oss attention sinks): one logit per head joining each
// head's softmax denominator with no value; null: none.
void attend(const CodecLayout& layout, const uint8_t* const* pages, int64_t ring, size_t head_offset, int64_t start,
            int64_t len, const float* q, int heads, float* out, const float* sinks = nullptr);

}  // namespace tierlm::kv
