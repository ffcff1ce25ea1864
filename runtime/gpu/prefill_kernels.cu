// runtime/gpu/prefill_kernels.cu — the kernels only a multi-row step (prefill) runs: the packed weights dequantized
// to f16 for the tensor-core GEMM, and attention over a chunk's queries as tiles against the paged KV (see
// device_kernels.cuh for the contracts). Decode never comes here.
//
// Dequantization: a block takes one 16-row panel by 128 columns, each thread 8 columns of one row; a warp's lanes
// are the panel's 16 rows of two 8-column groups, so its loads are the panel's contiguous 64-byte column quads and
// its stores whole 32-byte sectors of 16 rows.
//
// Prefill attention (flash attention with the precision of f32 arithmetic, the decode kernel's): one block per (tile,
// KV head), a tile being up to 64 / group consecutive rows of one sequence, so the block's 64 query vectors are
// those rows x the KV head's group of q heads. The block walks the sequence's KV pages up to the tile's last
// position: each page's 64 keys and values are decoded into shared memory once for all 64 queries; two threads per
// query (kThreadsPerQuery) split the page's positions for the scores (online softmax, max and sum exchanged by
// shuffles) and the head dims for the weighted values. With the f16 KV (head_dim 64 or 128) the same tiles run on
// the tensor cores (prefill_attention_mma_kernel), q and the softmax weights split in hi + lo halves so that the
// products keep ~22 bits: on the H200 the CUDA-core kernel took 98 of the 145 ms of a 1,800-token Llama-3-8B
// prefill (gpu_bench --model with TIERLM_PEER_PROFILE=1).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/gpu/device_kernels.cuh"
#include "runtime/gpu/device_launch.cuh"

namespace tierlm::gpu::device {

using namespace detail;

namespace {

__device__ __forceinline__ float scale_at(const void* p, int type, int64_t i) {
  if (type == 0) return static_cast<const float*>(p)[i];
  if (type == 1) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

// Columns [c0, c0 + 8) of row `row` (c0 a multiple of 8) of a packed weight (bits 8 or 4, the 16-row panel layout
// of kernel_isa.h) as floats, with the arithmetic of device_kernels.cu's weight_element.
__device__ __forceinline__ void packed8(const MatrixRef& w, int64_t row, int64_t c0, float* out) {
  const int64_t panel = row / 16, lane = row % 16, groups = w.cols / w.group_size;
  const uint8_t* p = static_cast<const uint8_t*>(w.data) + panel * w.cols * 16 * w.bits / 8;
  uint32_t words[2];
  bool high = false;
  if (w.bits == 8) {
    words[0] = *reinterpret_cast<const uint32_t*>(p + (c0 / 4) * 64 + lane * 4);
    words[1] = *reinterpret_cast<const uint32_t*>(p + (c0 / 4 + 1) * 64 + lane * 4);
  } else {
    const int64_t block = c0 / 32, quad = (c0 % 32) / 4;  // quads quad, quad + 1: both below 4 or both above
    high = quad >= 4;
    words[0] = *reinterpret_cast<const uint32_t*>(p + block * 256 + (quad % 4) * 64 + lane * 4);
    words[1] = *reinterpret_cast<const uint32_t*>(p + block * 256 + (quad % 4 + 1) * 64 + lane * 4);
  }
  const int64_t si = (panel * groups + c0 / w.group_size) * 16 + lane;
  const float d = scale_at(w.scales, w.scale_type, si);
  const float bias = w.biases ? scale_at(w.biases, w.scale_type, si) : 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t byte = (words[k / 4] >> (8 * (k % 4))) & 0xffu;
    const uint32_t code = w.bits == 8 ? byte : high ? byte >> 4 : byte & 0xfu;
    out[k] = w.biases ? d * float(code) + bias : d * (float(code) - 128.0f);
  }
}

__device__ __forceinline__ uint4 pack_half8(const float* v) {
  uint4 r;
  uint32_t* words = reinterpret_cast<uint32_t*>(&r);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const __half2 h = __halves2half2(__float2half(v[2 * k]), __float2half(v[2 * k + 1]));
    words[k] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return r;
}

constexpr int kDequantColumnGroups = 16;  // 8-column groups per block (128 columns)

// Packed formats: rows [r0, r0 + count) (r0 a multiple of 16) to f16 (or f32: dequantize_f32), grid (panels,
// column blocks).
template <class Out>
__global__ void __launch_bounds__(256) dequantize_panels_kernel(MatrixRef w, int64_t r0, int64_t count, Out* out) {
  kernel_entry();
  const int lane = threadIdx.x % 16, group = blockIdx.y * kDequantColumnGroups + threadIdx.x / 16;
  const int64_t local = int64_t(blockIdx.x) * 16 + lane;
  const int64_t c0 = int64_t(group) * 8;
  if (local >= count || c0 >= w.cols) return;
  float v[8];
  packed8(w, r0 + local, c0, v);
  if constexpr (sizeof(Out) == 2) {
    *reinterpret_cast<uint4*>(out + local * w.cols + c0) = pack_half8(v);
  } else {
    float4* o = reinterpret_cast<float4*>(out + local * w.cols + c0);
    o[0] = make_float4(v[0], v[1], v[2], v[3]);
    o[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

template <class Out>
void launch_dequantize_panels(const MatrixRef& w, int64_t r0, int64_t count, Out* out, cudaStream_t stream) {
  const unsigned panels = unsigned((count + 15) / 16);
  const unsigned column_blocks = unsigned((w.cols / 8 + kDequantColumnGroups - 1) / kDequantColumnGroups);
  launch(dequantize_panels_kernel<Out>, dim3(panels, column_blocks), 256, 0, stream, w, r0, count, out);
}

// Dense f32 / bf16 rows [r0, r0 + count) to f16, eight elements a thread (an element a thread where the columns
// are not a multiple of 8).
__global__ void dequantize_dense_kernel(MatrixRef w, int64_t r0, int64_t count, __half* out) {
  kernel_entry();
  if (w.cols % 8 != 0) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= count * w.cols) return;
    const int64_t at = r0 * w.cols + i;
    const uint16_t h = static_cast<const uint16_t*>(w.data)[at];
    out[i] = __float2half(w.format == 0 ? static_cast<const float*>(w.data)[at] : __uint_as_float(uint32_t(h) << 16));
    return;
  }
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (i >= count * w.cols) return;
  const int64_t at = r0 * w.cols + i;
  float v[8];
  if (w.format == 0) {
    const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(w.data) + at);
    const float4 b = *reinterpret_cast<const float4*>(static_cast<const float*>(w.data) + at + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(w.data) + at);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k)
      v[2 * k] = __uint_as_float(words[k] << 16), v[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
  }
  *reinterpret_cast<uint4*>(out + i) = pack_half8(v);
}

__global__ void to_f16_vector_kernel(const float* x, int64_t count, __half* out) {
  kernel_entry();
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (i >= count) return;
  if (i + 8 > count) {  // the tail of a count that is not a multiple of 8
    for (int64_t k = i; k < count; ++k) out[k] = __float2half(x[k]);
    return;
  }
  const float4 a = *reinterpret_cast<const float4*>(x + i), b = *reinterpret_cast<const float4*>(x + i + 4);
  const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  *reinterpret_cast<uint4*>(out + i) = pack_half8(v);
}

// The f16 KV's prefill attention on the tensor cores (prefill_attention_mma_kernel) or, when off, on the CUDA cores
// (prefill_attention_kernel): set_prefill_attention_mma (GpuOptions::prefill_attention_mma).
bool g_prefill_mma = true;

constexpr int kTileQueries = 64;    // query vectors per block
// Threads per query: each scores 1/kThreadsPerQuery of a page and sums 1/kThreadsPerQuery of the value dims. (4 was
// 1.8x slower than 2 on the H100: 1,387 vs 770 us for the 16 layers' attention of a 180-token prompt.)
constexpr int kThreadsPerQuery = 2;
constexpr int kTileThreads = kTileQueries * kThreadsPerQuery;
constexpr int kTileKeys = kKvPage;  // positions per step: one KV page

template <int HD>
constexpr size_t prefill_shared_bytes() {
  return size_t(kTileQueries * (HD + 4) + kTileKeys * (HD + 4) + kTileKeys * HD + kTileQueries * (kTileKeys + 1)) * 4;
}

// Block blockIdx.x's tile: (tile, KV head), its rows [first, first + rows) of the step; query vector i of the block is
// row i / group's q head kvh * group + i % group.
struct TileRef {
  int group, kvh, first, rows;
  int64_t stride;  // floats a qkv row
  __device__ TileRef(const QkvParams& p, const int32_t* tiles, int hd)
      : group(int(p.heads / p.kv_heads)), kvh(int(blockIdx.x % p.kv_heads)),
        first(tiles[2 * (blockIdx.x / p.kv_heads)]), rows(tiles[2 * (blockIdx.x / p.kv_heads) + 1]),
        stride((p.heads + 2 * p.kv_heads) * hd) {}
  // Query vector i's q in the qkv rows (unscaled), or null past the tile's rows.
  __device__ const float* query(const float* qkv, int i, int hd) const {
    const int r = i / group;
    if (r >= rows || r >= kTileQueries / group) return nullptr;
    return qkv + int64_t(first + r) * stride + int64_t(kvh * group + i % group) * hd;
  }
};

// A tile's query positions (query vector i = row i / group, head i % group; -1 past the tile's rows), its last
// position and, for a windowed layer, the page holding its earliest query's first visible position (pages before
// it are outside every query's window). The block's threads; __syncthreads() after it before reading them.
__device__ __forceinline__ void tile_positions(const QkvParams& p, const TileRef& tile, const int32_t* positions,
                                               int32_t* query_pos, int32_t& last_pos, int32_t& first_key) {
  const int first = tile.first, rows = tile.rows;
  if (threadIdx.x < kTileQueries) {
    const int r = threadIdx.x / tile.group;
    query_pos[threadIdx.x] = r < rows && r < kTileQueries / tile.group ? positions[first + r] : -1;
  }
  if (threadIdx.x == 0) {
    int32_t m = 0, lowest = positions[first];
    for (int r = 0; r < rows; ++r) m = max(m, positions[first + r]), lowest = min(lowest, positions[first + r]);
    last_pos = m;
    first_key = p.window > 0 ? int32_t(max(int64_t(0), int64_t(lowest) - p.window + 1) / kTileKeys * kTileKeys) : 0;
  }
}

// 1 / the softmax denominator of a query with running max m and exp-sum l; an attention sink (p.sinks, by q head)
// joins the denominator only: p_t = e^(s_t - m) / (l + e^(sink - m)), in the range-safe form of the CPU's attend
// (kv/attention.cpp).
__device__ __forceinline__ float softmax_inverse(const QkvParams& p, int64_t head, float m, float l) {
  if (!p.sinks) return 1.0f / l;
  const float sink = p.sinks[head];
  return sink <= m ? 1.0f / (l + __expf(sink - m)) : __expf(m - sink) / (l * __expf(m - sink) + 1.0f);
}

template <int HD>
__global__ void __launch_bounds__(kTileThreads) prefill_attention_kernel(const float* qkv, QkvParams p,
                                                                          const int32_t* positions, KvRef kv,
                                                                          PageTables tables, const int32_t* tiles,
                                                                          float* out) {
  kernel_entry();
  constexpr int QS = HD + 4;  // padded row stride of q and k (float4 loads of 16 query rows without conflicts)
  constexpr int PS = kTileKeys + 1;
  constexpr int PART = HD / kThreadsPerQuery;         // value dims of a thread
  constexpr int KEYS = kTileKeys / kThreadsPerQuery;  // positions of a page a thread scores
  extern __shared__ float dynamic[];
  float* qs = dynamic;                   // [kTileQueries][QS], scaled by 1/sqrt(hd)
  float* ks = qs + kTileQueries * QS;    // [kTileKeys][QS]
  float* vs = ks + kTileKeys * QS;       // [kTileKeys][HD]
  float* ps = vs + kTileKeys * HD;       // [kTileQueries][PS]
  __shared__ int32_t query_pos[kTileQueries];
  __shared__ int32_t last_pos, first_key;
  const TileRef tile(p, tiles, HD);
  const int group = tile.group, kvh = tile.kvh, first = tile.first;
  const float scale = rsqrtf(float(HD));
  for (int idx = threadIdx.x; idx < kTileQueries * (HD / 4); idx += kTileThreads) {
    const int i = idx / (HD / 4), d4 = idx % (HD / 4);
    const float* src = tile.query(qkv, i, HD);
    float4 v = src ? *reinterpret_cast<const float4*>(src + d4 * 4) : make_float4(0.f, 0.f, 0.f, 0.f);
    v.x *= scale, v.y *= scale, v.z *= scale, v.w *= scale;
    *reinterpret_cast<float4*>(qs + i * QS + d4 * 4) = v;
  }
  tile_positions(p, tile, positions, query_pos, last_pos, first_key);
  __syncthreads();
  const int q = threadIdx.x / kThreadsPerQuery, part = threadIdx.x % kThreadsPerQuery;
  const int32_t my_pos = query_pos[q];
  const int32_t* table = tables.pages + tables.seq_of_row[first] * tables.stride;
  float acc[PART];
#pragma unroll
  for (int d = 0; d < PART; ++d) acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int t0 = first_key; t0 <= last_pos; t0 += kTileKeys) {
    const int live = min(kTileKeys, last_pos - t0 + 1);
    __syncthreads();  // the previous page's keys, values and weights are used up
    const int64_t page_row = int64_t(table[t0 / kKvPage]) * kKvPage;
    for (int idx = threadIdx.x; idx < kTileKeys * (HD / 8); idx += kTileThreads) {
      const int t = idx / (HD / 8), j = (idx % (HD / 8)) * 8;
      float k8[8], v8[8];
      if (t < live) {
        const int64_t at = (page_row + t) * p.kv_heads + kvh;
        codec_load8(kv.keys, kv.key_scales, kv.codec, at, HD, j, k8);
        codec_load8(kv.values, kv.value_scales, kv.codec, at, HD, j, v8);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) k8[e] = 0.0f, v8[e] = 0.0f;  // unwritten positions: never NaN * 0
      }
      *reinterpret_cast<float4*>(ks + t * QS + j) = make_float4(k8[0], k8[1], k8[2], k8[3]);
      *reinterpret_cast<float4*>(ks + t * QS + j + 4) = make_float4(k8[4], k8[5], k8[6], k8[7]);
      *reinterpret_cast<float4*>(vs + t * HD + j) = make_float4(v8[0], v8[1], v8[2], v8[3]);
      *reinterpret_cast<float4*>(vs + t * HD + j + 4) = make_float4(v8[4], v8[5], v8[6], v8[7]);
    }
    __syncthreads();
    // Scores of this thread's positions.
    float s[KEYS];
#pragma unroll
    for (int k = 0; k < KEYS; ++k) s[k] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < HD; d += 4) {
      const float4 qv = *reinterpret_cast<const float4*>(qs + q * QS + d);
#pragma unroll
      for (int k = 0; k < KEYS; ++k) {
        const float4 kv4 = *reinterpret_cast<const float4*>(ks + (part * KEYS + k) * QS + d);
        s[k] += qv.x * kv4.x + qv.y * kv4.y + qv.z * kv4.z + qv.w * kv4.w;
      }
    }
    float page_max = -INFINITY;
#pragma unroll
    for (int k = 0; k < KEYS; ++k) {
      const int t = t0 + part * KEYS + k;
      if (t > my_pos || (p.window > 0 && t <= my_pos - p.window)) s[k] = -INFINITY;
      page_max = fmaxf(page_max, s[k]);
    }
#pragma unroll
    for (int o = 1; o < kThreadsPerQuery; o *= 2) page_max = fmaxf(page_max, __shfl_xor_sync(0xffffffffu, page_max, o));
    const float m_new = fmaxf(m, page_max);
    float sum = 0.0f;
    const float alpha = m_new == -INFINITY ? 1.0f : __expf(m - m_new);
#pragma unroll
    for (int k = 0; k < KEYS; ++k) {
      const float e = s[k] == -INFINITY ? 0.0f : __expf(s[k] - m_new);
      ps[q * PS + part * KEYS + k] = e;
      sum += e;
    }
#pragma unroll
    for (int o = 1; o < kThreadsPerQuery; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    l = l * alpha + sum;
    m = m_new;
#pragma unroll
    for (int d = 0; d < PART; ++d) acc[d] *= alpha;
    __syncwarp();  // the query's weights (its threads are in this warp) are in shared memory
    for (int t = 0; t < live; ++t) {
      const float wt = ps[q * PS + t];
      const float* v = vs + t * HD + part * PART;
#pragma unroll
      for (int d = 0; d < PART; d += 4) {
        const float4 v4 = *reinterpret_cast<const float4*>(v + d);
        acc[d] += wt * v4.x, acc[d + 1] += wt * v4.y, acc[d + 2] += wt * v4.z, acc[d + 3] += wt * v4.w;
      }
    }
  }
  if (my_pos < 0) return;
  const int r = q / group, h = q % group;
  float* o = out + (int64_t(first + r) * p.heads + kvh * group + h) * HD + part * PART;
  const float inv = softmax_inverse(p, kvh * group + h, m, l);
#pragma unroll
  for (int d = 0; d < PART; d += 4)
    *reinterpret_cast<float4*>(o + d) = make_float4(acc[d] * inv, acc[d + 1] * inv, acc[d + 2] * inv, acc[d + 3] * inv);
}

// The same attention for the f16 KV on the tensor cores (mma.m16n8k16, f32 accumulation), FlashAttention-2's
// split: warp w owns query vectors [16w, 16w + 16) of the block's 64 and keeps their scores, softmax state and
// output in registers (the fragment layout of mma16816: lane (g, t) holds rows g and g + 8). A page's keys sit in
// shared memory as the pool holds them ([position][dim]), its values transposed ([dim][position]), so every B
// fragment is one 32-bit load; the score fragments of 16 positions are the next mma's A fragment for the values.
// The f32 kernel's precision is kept where f16 would round: q and the softmax weights go through the mma as hi +
// lo halves (lo = f16(x - hi)), two mmas each, so a product's error is ~2^-22 of it instead of f16's 2^-11; the
// keys and values are the cache's f16 values exactly.
template <int HD>
struct MmaTile {
  static constexpr int QLD = HD + 8;         // halves a row of q (hi, lo) and of k: fragment loads hit 32 banks
  static constexpr int VLD = kTileKeys + 8;  // halves a row of the transposed values
  static constexpr size_t bytes = size_t(2 * kTileQueries * QLD + kTileKeys * QLD + HD * VLD) * sizeof(__half);
};

// Two floats as hi + lo half2 words (hi = f16(x), lo = f16(x - hi)).
__device__ __forceinline__ void split_half2(float x, float y, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x, y);
  const float2 back = __half22float2(h);
  const __half2 l = __floats2half2_rn(x - back.x, y - back.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

__device__ __forceinline__ uint32_t half2_word(const __half* p) { return *reinterpret_cast<const uint32_t*>(p); }

template <int HD>
__global__ void __launch_bounds__(kTileThreads) prefill_attention_mma_kernel(const float* qkv, QkvParams p,
                                                                              const int32_t* positions, KvRef kv,
                                                                              PageTables tables,
                                                                              const int32_t* tiles, float* out) {
  static_assert(HD % 16 == 0 && kTileThreads == 2 * kTileQueries && kTileKeys == 64, "4 warps of 16 queries");
  using L = MmaTile<HD>;
  kernel_entry();
  extern __shared__ __align__(16) unsigned char mma_tile_shared[];
  __half* q_hi = reinterpret_cast<__half*>(mma_tile_shared);  // [kTileQueries][QLD], scaled by 1/sqrt(hd)
  __half* q_lo = q_hi + kTileQueries * L::QLD;
  __half* ks = q_lo + kTileQueries * L::QLD;  // [kTileKeys][QLD]
  __half* vt = ks + kTileKeys * L::QLD;       // [HD][VLD]
  __shared__ int32_t query_pos[kTileQueries];
  __shared__ int32_t last_pos, first_key;
  const TileRef tile(p, tiles, HD);
  const int group = tile.group, kvh = tile.kvh, first = tile.first;
  const float scale = rsqrtf(float(HD));
  for (int idx = threadIdx.x; idx < kTileQueries * (HD / 2); idx += kTileThreads) {
    const int i = idx / (HD / 2), d = (idx % (HD / 2)) * 2;
    const float* src = tile.query(qkv, i, HD);
    const float2 v = src ? *reinterpret_cast<const float2*>(src + d) : make_float2(0.f, 0.f);
    uint32_t hi, lo;
    split_half2(v.x * scale, v.y * scale, hi, lo);
    *reinterpret_cast<uint32_t*>(q_hi + i * L::QLD + d) = hi;
    *reinterpret_cast<uint32_t*>(q_lo + i * L::QLD + d) = lo;
  }
  tile_positions(p, tile, positions, query_pos, last_pos, first_key);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row0 = warp * 16 + g;  // the lane's query vectors: row0 and row0 + 8
  const int32_t pos[2] = {query_pos[row0], query_pos[row0 + 8]};
  const int32_t* table = tables.pages + tables.seq_of_row[first] * tables.stride;
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const __half* qa_hi = q_hi + row0 * L::QLD + 2 * t;
  const __half* qa_lo = q_lo + row0 * L::QLD + 2 * t;
  for (int t0 = first_key; t0 <= last_pos; t0 += kTileKeys) {
    const int live = min(kTileKeys, last_pos - t0 + 1);
    __syncthreads();  // the previous page's keys and values are used up
    const int64_t page_row = int64_t(table[t0 / kKvPage]) * kKvPage;
    for (int idx = threadIdx.x; idx < kTileKeys * (HD / 8); idx += kTileThreads) {
      const int key = idx % kTileKeys, j = (idx / kTileKeys) * 8;
      uint4 kw = make_uint4(0, 0, 0, 0), vw = make_uint4(0, 0, 0, 0);  // unwritten positions: zeros, never NaN * 0
      if (key < live) {
        const int64_t at = (page_row + key) * p.kv_heads + kvh;
        kw = *reinterpret_cast<const uint4*>(static_cast<const __half*>(kv.keys) + at * HD + j);
        vw = *reinterpret_cast<const uint4*>(static_cast<const __half*>(kv.values) + at * HD + j);
      }
      *reinterpret_cast<uint4*>(ks + key * L::QLD + j) = kw;
      const __half* vh = reinterpret_cast<const __half*>(&vw);
#pragma unroll
      for (int e = 0; e < 8; ++e) vt[(j + e) * L::VLD + key] = vh[e];
    }
    __syncthreads();
    // Scores: s[n] is the 16 x 8 block of positions [8n, 8n + 8).
    float s[kTileKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kTileKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int d = 0; d < HD; d += 16) {
      const uint32_t ah[4] = {half2_word(qa_hi + d), half2_word(qa_hi + 8 * L::QLD + d), half2_word(qa_hi + d + 8),
                              half2_word(qa_hi + 8 * L::QLD + d + 8)};
      const uint32_t al[4] = {half2_word(qa_lo + d), half2_word(qa_lo + 8 * L::QLD + d), half2_word(qa_lo + d + 8),
                              half2_word(qa_lo + 8 * L::QLD + d + 8)};
#pragma unroll
      for (int n = 0; n < kTileKeys / 8; ++n) {
        const __half* kb = ks + (8 * n + g) * L::QLD + d + 2 * t;
        const uint32_t b0 = half2_word(kb), b1 = half2_word(kb + 8);
        mma16816(s[n], ah, b0, b1);
        mma16816(s[n], al, b0, b1);
      }
    }
    // Online softmax per query vector (a row's 64 scores are spread over the 4 lanes of its quad).
    float page_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kTileKeys / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int key = t0 + 8 * n + 2 * t + (c & 1), q = c >> 1;
        if (key > pos[q] || (p.window > 0 && key <= pos[q] - p.window)) s[n][c] = -INFINITY;
        page_max[q] = fmaxf(page_max[q], s[n][c]);
      }
    float alpha[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      page_max[q] = fmaxf(page_max[q], __shfl_xor_sync(0xffffffffu, page_max[q], 1));
      page_max[q] = fmaxf(page_max[q], __shfl_xor_sync(0xffffffffu, page_max[q], 2));
      const float m_new = fmaxf(m[q], page_max[q]);
      alpha[q] = m_new == -INFINITY ? 1.0f : __expf(m[q] - m_new);
      m[q] = m_new;
      l[q] *= alpha[q];
    }
#pragma unroll
    for (int n = 0; n < kTileKeys / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int q = c >> 1;
        const float e = s[n][c] == -INFINITY ? 0.0f : __expf(s[n][c] - m[q]);
        s[n][c] = e;
        l[q] += e;
      }
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    // Values: positions [16k, 16k + 16) as the A fragment (score blocks 2k and 2k + 1).
#pragma unroll
    for (int k = 0; k < kTileKeys / 16; ++k) {
      uint32_t ph[4], pl[4];
      split_half2(s[2 * k][0], s[2 * k][1], ph[0], pl[0]);
      split_half2(s[2 * k][2], s[2 * k][3], ph[1], pl[1]);
      split_half2(s[2 * k + 1][0], s[2 * k + 1][1], ph[2], pl[2]);
      split_half2(s[2 * k + 1][2], s[2 * k + 1][3], ph[3], pl[3]);
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        const __half* vb = vt + (8 * n + g) * L::VLD + 16 * k + 2 * t;
        const uint32_t b0 = half2_word(vb), b1 = half2_word(vb + 8);
        mma16816(o[n], ph, b0, b1);
        mma16816(o[n], pl, b0, b1);
      }
    }
  }
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    l[q] += __shfl_xor_sync(0xffffffffu, l[q], 1);
    l[q] += __shfl_xor_sync(0xffffffffu, l[q], 2);
  }
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    if (pos[q] < 0) continue;
    const int i = row0 + 8 * q, r = i / group, h = i % group;
    const float inv = softmax_inverse(p, kvh * group + h, m[q], l[q]);
    float* dst = out + (int64_t(first + r) * p.heads + kvh * group + h) * HD + 2 * t;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
      *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[n][2 * q] * inv, o[n][2 * q + 1] * inv);
  }
}

}  // namespace

void dequantize_f16(const MatrixRef& w, int64_t r0, int64_t count, void* out, cudaStream_t stream) {
  if (count <= 0) return;
  __half* o = static_cast<__half*>(out);
  if (w.format >= 3) {
    launch_dequantize_panels(w, r0, count, o, stream);
    return;
  }
  const int64_t total = w.cols % 8 == 0 ? count * w.cols / 8 : count * w.cols;
  launch(dequantize_dense_kernel, unsigned((total + 255) / 256), 256, 0, stream, w, r0, count, o);
}

void dequantize_f32(const MatrixRef& w, int64_t r0, int64_t count, float* out, cudaStream_t stream) {
  if (count > 0) launch_dequantize_panels(w, r0, count, out, stream);
}

void to_f16(const float* x, int64_t count, void* out, cudaStream_t stream) {
  if (count <= 0) return;
  launch(to_f16_vector_kernel, unsigned(((count + 7) / 8 + 255) / 256), 256, 0, stream, x, count, static_cast<__half*>(out));
}

void set_prefill_attention_mma(bool on) { g_prefill_mma = on; }

bool prefill_attention_supported(const QkvParams& p) {
  return (p.head_dim == 16 || p.head_dim == 32 || p.head_dim == 64 || p.head_dim == 128) && p.kv_heads > 0 && p.heads % p.kv_heads == 0 &&
         p.heads / p.kv_heads <= kTileQueries;
}

int64_t prefill_tile_rows(const QkvParams& p) { return kTileQueries / (p.heads / p.kv_heads); }

void prefill_attention(const float* qkv, int64_t tiles, const int32_t* tile_rows, const QkvParams& p,
                       const int32_t* positions, const KvRef& kv, const PageTables& tables, float* out,
                       cudaStream_t stream) {
  if (tiles <= 0) return;
  const unsigned grid = unsigned(tiles * p.kv_heads);
  auto run = [&](auto kernel, size_t shared) {
    launch(kernel, grid, kTileThreads, shared, stream, qkv, p, positions, kv, tables, tile_rows, out);
  };
  if (g_prefill_mma && kv.codec == 0 && (p.head_dim == 64 || p.head_dim == 128)) {
    if (p.head_dim == 64)
      run(prefill_attention_mma_kernel<64>, MmaTile<64>::bytes);
    else
      run(prefill_attention_mma_kernel<128>, MmaTile<128>::bytes);
    return;
  }
  switch (p.head_dim) {
    case 16: run(prefill_attention_kernel<16>, prefill_shared_bytes<16>()); break;
    case 32: run(prefill_attention_kernel<32>, prefill_shared_bytes<32>()); break;
    case 64: run(prefill_attention_kernel<64>, prefill_shared_bytes<64>()); break;
    default: run(prefill_attention_kernel<128>, prefill_shared_bytes<128>()); break;
  }
}

}  // namespace tierlm::gpu::device
