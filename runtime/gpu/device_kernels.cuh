// runtime/gpu/device_kernels.cuh — internal: launchers of the CUDA kernels (device_kernels.cu), in plain types so
// the orchestration (gpu_layers.cpp) compiles with the host compiler. Every launcher enqueues on `stream` and
// returns; none allocates or synchronizes. Never: included outside runtime/gpu.
//
// Weights keep the host layouts (runtime/kernels/weights.cpp) byte for byte, so an expert block copies from the
// host cache to VRAM unchanged: dense formats row-major; q8_0 / q4 / mlx_q4 / mlx_q8 in the 16-row panel layout of
// kernel_isa.h (a warp reads 512 contiguous bytes of a panel per step: 16 bytes a lane, fully coalesced).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tierlm::gpu::device {

// Programmatic dependent launch (Hopper): every kernel is launched so that it may start while the previous one in
// the stream finishes; it first pulls its own weights toward the SM (registers / L2: they depend on nothing), then
// waits for the previous kernel's results (griddepcontrol.wait) before reading or writing activations. This keeps
// HBM busy across kernel boundaries and prologues, which otherwise cost a decode step several microseconds per
// kernel. On by default; off makes every launch a plain one (for A/B measurements).
void set_programmatic_launch(bool on);
// Rows per block of the f16/bf16 decode matvec: 0 chooses (8 where that still gives every SM a block, else 4).
void set_dense_rows_per_block(int rows);
// Diagnostics (gpu::probe_attention only): attention phases to skip, 1 merge, 4 key loads, 8 value loads,
// 16 the L2 prefetch, 32 the fused bias/norm/RoPE/KV store, 2048 the decode K/V staging in shared memory.
void set_attention_debug(int mask);

// A weight as the kernels see it (mirrors kernels::WeightView; format codes as kernels::WeightFormat).
struct MatrixRef {
  int format = 0;          // 0 f32, 1 f16, 2 bf16, 3 q8_0, 4 q4, 5 mlx_q4, 6 mlx_q8, 7 mxfp4 (row-major blocks)
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;
  const void* scales = nullptr;
  const void* biases = nullptr;  // null for q8_0 (symmetric)
  int scale_type = 1;      // 0 f32, 1 f16, 2 bf16
  int group_size = 0, bits = 0;
};

// y[i*ldy + r] (+= when accumulate) = W[r,:] · x[i*ldx + :] for i < n (n <= kMaxMatvecRows).
inline constexpr int kMaxMatvecRows = 4;
void matvec(const MatrixRef& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy, bool accumulate,
            cudaStream_t stream);
// The decode path (n == 1) with the input transform fused: f16/bf16 weights up to 16384 columns (dense_fusable),
// and the packed formats (q8_0, q4, MLX) up to 40960 columns (decode_fusable covers both). matvec_normed:
// y (+)= W · rms_norm(x) (x one row of w.cols, norm weight w.cols floats); matvec_gated: y (+)= W · (silu(gate) *
// up) of one [gate | up] row of 2 * w.cols floats.
bool dense_fusable(const MatrixRef& w);
bool decode_fusable(const MatrixRef& w);
void matvec_normed(const MatrixRef& w, const float* x, const float* norm_weight, float eps, float* y,
                   bool accumulate, cudaStream_t stream);
void matvec_gated(const MatrixRef& w, const float* gate_up, float* y, bool accumulate, cudaStream_t stream);
// The decode matvec of packed weights (one x row) on the tensor cores (packed_decode.cu): xmode 0 plain, 1 normed,
// 2 gated, as matvec / matvec_normed / matvec_gated, which use it wherever packed_mma_takes(w): 8- or 4-bit, a
// power-of-two group of at least 32 columns, at most 40960 columns, and (unless every_size) at least 6144 rows (8-bit:
// or at least 8192 columns), where it measured faster than the CUDA-core kernel. set_packed_mma(false) (or
// TIERLM_GPU_PACKED_MMA=0) keeps every matrix on the CUDA-core kernel, set_packed_mma(true, true) (or
// TIERLM_GPU_PACKED_MMA=all) puts every one it can take on the tensor cores (tests, A/B runs).
void set_packed_mma(bool on, bool every_size = false);
bool packed_mma_takes(const MatrixRef& w);
void packed_mma_matvec(const MatrixRef& w, const float* x, int xmode, const float* norm_weight, float eps, float* y,
                       bool accumulate, cudaStream_t stream);
// out[r*cols + c] = W[r0 + r, c] as f16, for rows [r0, r0 + count) (the GEMM path of packed/f32/bf16 weights;
// prefill_kernels.cu).
void dequantize_f16(const MatrixRef& w, int64_t r0, int64_t count, void* out, cudaStream_t stream);
// The same rows of a packed weight (format >= 3, not MXFP4) as f32, with weight_element's arithmetic: the exact
// configuration's GEMM of MLX weights (f32 activations, MLX's semantics; see GpuLayers' multiply).
void dequantize_f32(const MatrixRef& w, int64_t r0, int64_t count, float* out, cudaStream_t stream);
// out[i*cols + c] = W[tokens[i], c] as f32 (the embedding lookup; same arithmetic as kernels::dequantize_row).
void embed_rows(const MatrixRef& w, const int32_t* tokens, int64_t rows, float* out, cudaStream_t stream);
// out[i] = index of the largest of logits[i*vocab .. +vocab) (first on ties, NaN skipped, 0 if all are NaN: as
// engine::argmax), rows <= max_rows. scratch: argmax_scratch_bytes(max_rows), zeroed before the first call (each
// call leaves its counters zero again), the same max_rows in every call.
int64_t argmax_scratch_bytes(int64_t max_rows);
void argmax_rows(const float* logits, int64_t rows, int64_t vocab, void* scratch, int64_t max_rows, int32_t* out,
                 cudaStream_t stream);
// Dense f32 -> f16 (activations for the GEMM path; prefill_kernels.cu).
void to_f16(const float* x, int64_t count, void* out, cudaStream_t stream);

// out[i] = x[i] * rsqrt(mean(x^2) + eps) * weight, per row of `width` (rows * (cols/width) groups).
void rms_norm(const float* x, int64_t ldx, const float* weight, int64_t rows, int64_t cols, int64_t width, float eps,
              float* out, int64_t ldout, cudaStream_t stream);
// qkv rows: bias, optional q/k norm (norm width qn/kn), RoPE (rotate_half) at positions[i], then the K/V of row i
// are written into its sequence's pages of the layer's device KV pool at positions[i] (f16 or q8; see KvRef).
// q8 is the CPU KV codec's arithmetic (runtime/kv/block_codec.cpp): per block of q8_block dims (32, or 16 when
// head_dim is not a multiple of 32), scale = max|x| / 127 rounded to f16, codes round(x / scale) in [-127, 127];
// the scale is kept as the f32 value of that f16, so the CPU with a q8 cache is an exact-math oracle.
inline __host__ __device__ int q8_block(int64_t head_dim) { return head_dim % 32 == 0 ? 32 : 16; }
// The device KV is paged: a layer's pool holds pages of kKvPage positions; a sequence's page table (shared by all
// layers) maps position t to page table[t / kKvPage]. Attention splits positions into chunks of whole pages.
inline constexpr int64_t kKvPage = 64;
struct KvRef {
  void* keys = nullptr;    // [pages][kKvPage][kv_heads][head_dim] in the codec
  void* values = nullptr;
  float* key_scales = nullptr;    // q8: [pages][kKvPage][kv_heads][head_dim / q8_block]
  float* value_scales = nullptr;
  int codec = 0;           // 0 f16, 1 q8, 2 f32 (exact: the CPU's f32 KV, for checks against transformers)
};
// Bytes of one K or V row of head_dim values in a codec (q8's scales apart).
inline __host__ __device__ int64_t kv_row_bytes(int codec, int64_t head_dim) {
  return head_dim * (codec == 0 ? 2 : codec == 2 ? 4 : 1);
}
// Page tables of the batch's sequences: pages[s * stride + t / kKvPage]; seq_of_row[i]: row i's sequence s.
struct PageTables {
  const int32_t* pages = nullptr;
  int64_t stride = 0;
  const int32_t* seq_of_row = nullptr;
};
struct QkvParams {
  int64_t heads, kv_heads, head_dim;
  const float* bias;       // null or q_rows + 2 kv_rows
  const float* q_norm;     // null or qn floats
  const float* k_norm;
  int64_t qn, kn;
  float eps;
  const float* inv_freq;   // head_dim/2 floats (the host Rope's table: default, linear, llama3 or YaRN frequencies);
                           // null in qkv_rope_store: the rows are turned already (Gemma 4), only K/V are stored
  float rope_scale = 1.0f; // cos and sin times this (YaRN's attention factor, as engine::Rope), else 1
  int64_t window = 0;      // sliding-window layer: a query at position p sees [p - window + 1, p]; 0: every position
  const float* sinks = nullptr;  // per q head (heads floats): a logit joining the softmax denominator (gpt-oss)
  int64_t rotary_dim = 0;  // partial rotary: RoPE turns dims [0, rotary_dim) of each head (pairs j, j + rotary_dim / 2),
                           // the rest pass through (engine::Rope); 0: head_dim
};
void qkv_rope_store(float* qkv, int64_t rows, const QkvParams& p, const int32_t* positions, const KvRef& kv,
                    const PageTables& tables, cudaStream_t stream);
// out[i] = softmax(q·K/sqrt(hd)) V over positions [0, positions[i]] of the row's sequence (GQA groups share K/V),
// or over the last p.window of them; with p.sinks, exp(sink of the head) joins each softmax's denominator. A windowed
// layer's device KV keeps every position (the pool's pages are per sequence, shared by the layers); the window is an
// exact mask: positions before it are neither read nor weighted.
// Split over positions (flash-decoding): partial = attention_scratch_floats(rows, p, max_len) floats of scratch;
// the last block of each (row, KV head) to finish merges the chunks.
// head_dim: a multiple of 8, at most kMaxHeadDim (Gemma 4's full layers: global_head_dim 512). Shared memory grows
// with group * head_dim (the group's queries); decode stages the chunk's K/V only where that fits (see attention()).
inline constexpr int64_t kMaxHeadDim = 512;
int64_t attention_scratch_floats(int64_t rows, const QkvParams& p, int64_t max_len);
// fused: the rows' qkv are as the qkv matvec left them, and no two rows share a sequence (decode); attention then
// does qkv_rope_store's work itself (bias, per-head q/k norm of width head_dim, RoPE, K/V into the cache), so
// qkv_rope_store is not called. Otherwise qkv_rope_store must have run on the rows first.
inline bool attention_can_fuse(const QkvParams& p) {
  return (!p.q_norm || p.qn == p.head_dim) && (!p.k_norm || p.kn == p.head_dim);
}
// arrivals: rows x kv_heads int32 counters, zero before the first call (each call leaves them zero).
void attention(const float* qkv, int64_t rows, const QkvParams& p, const int32_t* positions, const KvRef& kv,
               const PageTables& tables, int64_t max_len, bool fused, float* partial, int32_t* arrivals, float* out,
               cudaStream_t stream);
// Prefill attention (prefill_kernels.cu): the same result as attention() for rows that share sequences, computed
// by tiles of up to prefill_tile_rows(p) consecutive rows of one sequence against its paged KV (qkv_rope_store must
// have run on the rows). tile_rows: `tiles` pairs (first row, rows) in device memory. Supported: head_dim 16, 32,
// 64 or 128, a GQA group of at most 64 heads.
bool prefill_attention_supported(const QkvParams& p);
// The f16 KV's tiles on the tensor cores (default) or on the CUDA cores (the kernel every other codec uses), as
// GpuOptions::prefill_attention_mma says.
void set_prefill_attention_mma(bool on);
int64_t prefill_tile_rows(const QkvParams& p);
void prefill_attention(const float* qkv, int64_t tiles, const int32_t* tile_rows, const QkvParams& p,
                       const int32_t* positions, const KvRef& kv, const PageTables& tables, float* out,
                       cudaStream_t stream);
// ---- MoE routing on the device (decode: one row, every expert of the layer resident in VRAM) ----
// A packed expert matrix as a shape plus byte offsets into an expert's VRAM block (tiering::ExpertLayout parts).
struct ExpertMatrixRef {
  MatrixRef shape;          // format, rows, cols, scale type, group size, bits (its pointers unused)
  uint64_t data = 0, scales = 0, biases = 0;
  bool has_biases = false;
};
// True when routed_experts can run these (packed formats the fused decode kernels take, at most 512 experts and
// k <= 32).
bool experts_routable(const ExpertMatrixRef& gate_up, const ExpertMatrixRef& down, int64_t experts, int64_t k);
// Per row r < rows: ids[r*k + j], weights[r*k + j] (j < k): the k most probable experts of softmax(logits[r*experts
// ..+experts)), first index on ties, weights renormalized to sum 1 when asked (the host's top_k).
void route_topk(const float* logits, int64_t rows, int64_t experts, int64_t k, bool renormalize, int32_t* ids,
                float* weights, cudaStream_t stream);
// hidden[r] += sum_j weights[r*k + j] * down_j(silu(gate_j x[r]) * up_j x[r]) over each row's k routed experts,
// whose VRAM blocks are blocks[ids[r*k + j]] (a null block: that choice adds nothing here, for the CPU to run);
// gate_up_out: rows*k x 2I floats and down_out: rows*k x H floats of scratch. x and hidden: rows x H.
void routed_experts(const ExpertMatrixRef& gate_up, const ExpertMatrixRef& down, const void* const* blocks,
                    const int32_t* ids, const float* weights, int64_t rows, int64_t k, const float* x,
                    float* gate_up_out, float* down_out, float* hidden, cudaStream_t stream);
// ---- MXFP4 (mxfp4_kernels.cu): gpt-oss's experts as stored (runtime/kernels/mxfp4.h: per row cols/32 blocks of
// 16 code bytes, E2M1 nibbles, and one E8M0 scale byte each), read packed ----
inline constexpr int kMxfp4Format = 7;
// y[i*ldy + r] (+= when accumulate) = W[r,:] · x[i*ldx + :] for any n, in f32 with the CPU kernel's arithmetic per
// block (sum of code * x over the block, then times the block's scale), blocks summed per lane then across the warp.
void mxfp4_matvec(const MatrixRef& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy, bool accumulate,
                  cudaStream_t stream);

// ---- biases and gpt-oss's gate (elementwise_kernels.cu) ----
// y[r*ldy + j] += bias[j] for r < rows, j < width.
void add_bias_rows(float* y, int64_t rows, int64_t width, int64_t ldy, const float* bias, cudaStream_t stream);
// gpt-oss's clamped SwiGLU over interleaved [gate, up] pairs (engine::clamped_swiglu_interleaved): per row of 2I,
// g = min(gu[2i], 7), u = clamp(gu[2i + 1], -7, 7), out[i] = (u + 1) * g * sigmoid(1.702 g).
void clamped_swiglu(const float* gate_up, int64_t rows, int64_t intermediate, float* out, cudaStream_t stream);
// out[i][j] = silu(gu[i][j]) * gu[i][I + j]
void silu_gate(const float* gate_up, int64_t rows, int64_t intermediate, float* out, cudaStream_t stream);
// y[i] += x[i]
void add(float* y, const float* x, int64_t count, cudaStream_t stream);
// Gated attention (qwen3_5): rows of `from` (stride 2 q_rows + 2 kv_rows) hold [query | gate] per head, then k and v.
// qkv (stride q_rows + 2 kv_rows) gets the queries, keys and values, gate (stride q_rows) the gates
// (engine's split_query_gate).
void split_query_gate(const float* from, int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim, float* qkv,
                      float* gate, cudaStream_t stream);
// out[i] *= sigmoid(gate[i]) (the attention output's gate, per element).
void sigmoid_gate(float* out, const float* gate, int64_t count, cudaStream_t stream);
// dst[r] = src[index[r]] (rows of `width` floats)
void gather_rows(const float* src, const int32_t* index, int64_t rows, int64_t width, float* dst, cudaStream_t stream);
// dst[index[r]] += weight[r] * src[r]
void scatter_add_rows(const float* src, const int32_t* index, const float* weight, int64_t rows, int64_t width,
                      float* dst, cudaStream_t stream);
// hidden[i] += sigmoid(gate · x[i]) * y[i]  (qwen2_moe's shared expert)
void sigmoid_gate_add(const float* x, const float* gate, const float* y, int64_t rows, int64_t width, float* hidden,
                      cudaStream_t stream);

}  // namespace tierlm::gpu::device
