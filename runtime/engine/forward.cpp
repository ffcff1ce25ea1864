#include "runtime/engine/forward.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "runtime/engine/gated_deltanet.h"
#include "runtime/engine/sampler.h"
#include "runtime/gpu/gpu_layers.h"

namespace tierlm::engine {

using kernels::WeightView;

namespace {

// Dot product with independent partial sums so the compiler can vectorize without reassociation flags.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// hidden += x (+ bias on every row, when the layer has one); x and hidden: n rows of H.
void add_residual(const float* x, const std::vector<float>& bias, int64_t n, int64_t H, float* hidden) {
  for (int64_t j = 0; j < n * H; ++j) hidden[j] += x[j];
  if (bias.empty()) return;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < H; ++j) hidden[i * H + j] += bias[size_t(j)];
}

tiering::LedgerBuffer scratch(tiering::Ledger& ledger, int64_t floats) {
  return tiering::LedgerBuffer(ledger, tiering::accounts::scratch, size_t(floats) * sizeof(float));
}

// Gated attention (qwen3_5): q_proj's rows hold [query | gate] per head. Moves the queries together at the start of
// the row (where the attention reads them) and the gates out to `gate`.
void split_query_gate(float* row, int64_t heads, int64_t head_dim, float* gate) {
  for (int64_t h = 0; h < heads; ++h) {
    std::memcpy(gate + h * head_dim, row + (2 * h + 1) * head_dim, size_t(head_dim) * sizeof(float));
    std::memmove(row + h * head_dim, row + 2 * h * head_dim, size_t(head_dim) * sizeof(float));
  }
}

}  // namespace

Forward::Forward(const model::ModelWeights& w, kernels::ThreadPool& pool, tiering::Ledger& ledger, int64_t max_chunk,
                 int64_t max_context)
    : w_(w), pool_(pool), max_chunk_(max_chunk), max_context_(max_context), rope_(w.config.rope, w.config.head_dim),
      ledger_(ledger), row_cache_(size_t(max_chunk)), row_pos_(size_t(max_chunk)) {
  if (max_chunk <= 0 || max_context <= 0) throw std::invalid_argument("forward: chunk and context must be positive");
  const auto& c = w.config;
  const int64_t q_rows = c.num_heads * c.head_dim;
  qkv_stride_ = c.attention_input_rows();
  hidden_ = scratch(ledger, max_chunk * c.hidden_size);
  normed_ = scratch(ledger, max_chunk * c.hidden_size);
  qkv_ = scratch(ledger, max_chunk * qkv_stride_);
  attn_ = scratch(ledger, max_chunk * q_rows);
  if (c.arch.attention_output_gate) gate_ = scratch(ledger, max_chunk * q_rows);
  // One mixer unit per kind the layers use besides attention.
  if (c.any_recurrent()) deltanet_ = std::make_unique<GatedDeltaNet>(w, pool, ledger, max_chunk);
  // One MLP unit per kind the layers use: the MoE block for sparse layers, dense scratch for dense ones.
  if (c.sparse_layers() > 0) moe_ = std::make_unique<MoeBlock>(w, pool, ledger, max_chunk);
  if (c.sparse_layers() < c.num_layers) {
    ffn_ = scratch(ledger, max_chunk * 2 * c.intermediate_size);
    ffn_act_ = scratch(ledger, max_chunk * c.intermediate_size);
  }
}

static void multiply(const WeightView& w, const float* x, int64_t n, float* y, kernels::ThreadPool& pool) {
  if (n == 1)
    kernels::matvec(w, x, y, pool);
  else
    kernels::matmul(w, x, n, y, pool);
}

void Forward::attention(int64_t layer, int64_t n) {
  // One work item per (row, kv head): the heads of a GQA group share every key/value the cache decodes.
  const auto& c = w_.config;
  const int64_t hd = c.head_dim, kv_heads = c.num_kv_heads, group = c.num_heads / c.num_kv_heads;
  const int64_t q_rows = c.num_heads * hd, qkv_stride = qkv_stride_;
  const float* qkv = qkv_.as<float>();
  float* out = attn_.as<float>();
  pool_.parallel_for(n * kv_heads, [&](int64_t begin, int64_t end, int) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / kv_heads, g = item % kv_heads;
      const int64_t len = row_pos_[size_t(i)] + 1;  // causal: this row sees its own position and all before it
      row_cache_[size_t(i)]->attend(layer, g, qkv + i * qkv_stride + g * group * hd, group, len,
                                    out + i * q_rows + g * group * hd);
    }
  });
}

void Forward::use_gpu(std::shared_ptr<gpu::GpuLayers> gpu) {
  gpu_ = std::move(gpu);
  gpu_keys_.reserve(size_t(max_chunk_));
  gpu_head_rows_.reserve(size_t(max_chunk_));
  gpu_head_out_.reserve(size_t(max_chunk_));
  gpu_head_ids_.reserve(size_t(max_chunk_));
}

void Forward::run(std::span<const int32_t> tokens, int64_t pos, KVCache& cache, float* logits, bool all_logits) {
  BatchItem item{tokens, pos, &cache, logits, all_logits};
  run_batch(std::span(&item, 1));
}

void Forward::run_batch(std::span<const BatchItem> items) {
  const auto& c = w_.config;
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size, V = c.vocab_size;
  const int64_t q_rows = c.num_heads * hd, kv_rows = c.num_kv_heads * hd, qkv_stride = qkv_stride_;
  // Where k starts in a row of qkv: after the queries, or after the interleaved queries and gates.
  const int64_t q_width = qkv_stride - 2 * kv_rows;
  float* hidden = hidden_.as<float>();
  float* normed = normed_.as<float>();
  float* qkv = qkv_.as<float>();

  // Validate everything before touching any cache, so a bad request cannot corrupt another sequence.
  int64_t n = 0;
  for (const BatchItem& item : items) {
    const int64_t len = int64_t(item.tokens.size());
    if (len == 0) throw std::invalid_argument("forward: empty token chunk");
    if (!item.cache || !item.logits) throw std::invalid_argument("forward: batch item without cache or logits");
    if (n + len > max_chunk_)
      throw std::invalid_argument(fmt::format("forward: batch of {}+ tokens exceeds the chunk size {}", n + len,
                                              max_chunk_));
    if (len > item.cache->max_chunk())
      throw std::invalid_argument(fmt::format("forward: a chunk of {} tokens exceeds its KV cache's chunk limit {}",
                                              len, item.cache->max_chunk()));
    if (!item.cache->can_start_at(item.pos))
      throw std::invalid_argument(fmt::format("forward: a chunk at position {} on a sequence whose recurrent state "
                                              "holds {} positions (recurrent layers cannot skip or rewind)", item.pos,
                                              item.cache->recurrent_position()));
    const int64_t limit = std::min(item.cache->capacity(), max_context_);
    if (item.pos < 0 || item.pos + len > limit)
      throw std::out_of_range(fmt::format("context full: positions up to {} requested, capacity is {}",
                                          item.pos + len, limit));
    for (int32_t t : item.tokens)
      if (t < 0 || t >= V)
        throw std::out_of_range(fmt::format("token id {} is outside the vocabulary (size {})", t, V));
    n += len;
  }
  if (n == 0) throw std::invalid_argument("forward: empty batch");
  for (const BatchItem& item : items) {
    item.cache->will_write(item.pos + int64_t(item.tokens.size()));
    if (item.cache->has_recurrent()) item.cache->will_fold(item.pos + int64_t(item.tokens.size()));
  }
  // The embedding lookup: on the device when the GPU holds the table (its tied output head), else here.
  const bool device_embed = gpu_ && gpu_->embeds_on_device();
  step_tokens_.clear();
  {
    int64_t r = 0;
    for (const BatchItem& item : items)
      for (size_t i = 0; i < item.tokens.size(); ++i, ++r) {
        row_cache_[size_t(r)] = item.cache;
        row_pos_[size_t(r)] = item.pos + int64_t(i);
        if (device_embed)
          step_tokens_.push_back(item.tokens[i]);
        else
          kernels::dequantize_row(w_.embed.view, item.tokens[i], hidden + r * H);
      }
  }
  int64_t first_layer = 0;
  if (gpu_) {
    // Layers [0, gpu layers) on the GPU: the embedded rows (or their token ids) go up once; the hidden state comes
    // back once, or the logits do when the GPU also holds the output head, or only the greedy tokens when every
    // item is greedy.
    gpu_keys_.assign(row_cache_.begin(), row_cache_.begin() + n);
    gpu::GpuStep step;
    step.hidden = device_embed ? nullptr : hidden;
    step.rows = n;
    step.tokens = step_tokens_;
    step.sequence = gpu_keys_;
    step.positions = std::span(row_pos_.data(), size_t(n));
    if (gpu_->runs_head()) {
      gpu_head_rows_.clear();
      gpu_head_out_.clear();
      bool logits_wanted = false, greedy_wanted = false;
      for (const BatchItem& item : items) {
        logits_wanted |= item.all_logits || !item.greedy;
        greedy_wanted |= item.greedy != nullptr;
      }
      int64_t r = 0;
      for (const BatchItem& item : items) {
        const int64_t len = int64_t(item.tokens.size());
        for (int64_t i = item.all_logits ? 0 : len - 1; i < len; ++i) {
          gpu_head_rows_.push_back(int32_t(r + i));
          if (logits_wanted) gpu_head_out_.push_back(item.logits + (item.all_logits ? i * V : 0));
        }
        r += len;
      }
      gpu_head_ids_.resize(greedy_wanted ? gpu_head_rows_.size() : 0);
      step.head_rows = gpu_head_rows_;
      step.head_out = gpu_head_out_;
      step.head_argmax = gpu_head_ids_;
      gpu_->run(step);
      if (greedy_wanted) {
        size_t at = 0;
        for (const BatchItem& item : items) {
          at += item.all_logits ? item.tokens.size() : 1;
          if (item.greedy) *item.greedy = gpu_head_ids_[at - 1];  // the item's last head row
        }
      }
      return;
    }
    gpu_->run(step);  // the hidden state comes back for the CPU layers
    first_layer = gpu_->layers();
  }
  // Per-row elementwise work: split across the pool only when there is enough of it.
  auto per_row = [&](auto&& fn) {
    if (n == 1)
      fn(0);
    else
      pool_.parallel_for(n, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) fn(i);
      });
  };

  for (int64_t layer = first_layer; layer < c.num_layers; ++layer) {
    const model::LayerWeights& L = w_.layers[size_t(layer)];
    per_row([&](int64_t i) { rms_norm(hidden + i * H, L.input_norm.data(), H, c.rms_norm_eps, normed + i * H); });
    if (c.layer(layer).mixer == model::Mixer::gated_deltanet) {
      // out may alias the input: the mixer reads it only in its first projection.
      deltanet_->run(layer, normed, n, std::span(row_cache_.data(), size_t(n)), std::span(row_pos_.data(), size_t(n)),
                     normed);
      add_residual(normed, L.o_bias, n, H, hidden);
    } else {
      multiply(L.qkv.view, normed, n, qkv, pool_);
      per_row([&](int64_t i) {
        float* row = qkv + i * qkv_stride;
        if (!L.qkv_bias.empty())
          for (int64_t j = 0; j < qkv_stride; ++j) row[j] += L.qkv_bias[size_t(j)];
        if (gate_.size()) split_query_gate(row, c.num_heads, hd, gate_.as<float>() + i * q_rows);
        float* q = row;
        float* k = row + q_width;
        float* v = row + q_width + kv_rows;
        if (!L.q_norm.empty()) {
          // In units of the norm weights' width: one head (qwen3) or the whole projection (olmoe).
          const int64_t qn = int64_t(L.q_norm.size()), kn = int64_t(L.k_norm.size());
          for (int64_t o = 0; o < q_rows; o += qn) rms_norm(q + o, L.q_norm.data(), qn, c.rms_norm_eps, q + o);
          for (int64_t o = 0; o < kv_rows; o += kn) rms_norm(k + o, L.k_norm.data(), kn, c.rms_norm_eps, k + o);
        }
        const int64_t pos = row_pos_[size_t(i)];
        rope_.apply(q, c.num_heads, pos);
        rope_.apply(k, c.num_kv_heads, pos);
        row_cache_[size_t(i)]->store(layer, pos, k, v);  // rows of one sequence may share a page: stores are safe
      });
      attention(layer, n);
      if (gate_.size()) {
        // Output gate: attention output times sigmoid(gate), per element.
        float* out = attn_.as<float>();
        const float* gate = gate_.as<float>();
        for (int64_t j = 0; j < n * q_rows; ++j) out[j] *= 1.0f / (1.0f + std::exp(-gate[j]));
      }
      multiply(L.o.view, attn_.as<float>(), n, normed, pool_);
      add_residual(normed, L.o_bias, n, H, hidden);
    }

    per_row([&](int64_t i) {
      rms_norm(hidden + i * H, L.post_attention_norm.data(), H, c.rms_norm_eps, normed + i * H);
    });
    if (c.layer(layer).mlp == model::Mlp::moe) {
      moe_->accumulate(layer, normed, n, hidden);
      continue;
    }
    float* ffn = ffn_.as<float>();
    multiply(L.gate_up.view, normed, n, ffn, pool_);
    per_row([&](int64_t i) {
      if (!L.gate_up_bias.empty())
        for (int64_t j = 0; j < 2 * I; ++j) ffn[i * 2 * I + j] += L.gate_up_bias[size_t(j)];
      silu_gate(ffn + i * 2 * I, I, ffn_act_.as<float>() + i * I);
    });
    multiply(L.down.view, ffn_act_.as<float>(), n, normed, pool_);
    add_residual(normed, L.down_bias, n, H, hidden);
  }

  head(items);
  for (const BatchItem& item : items)
    if (item.greedy) {
      const int64_t last = item.all_logits ? int64_t(item.tokens.size()) - 1 : 0;
      *item.greedy = int32_t(argmax(std::span<const float>(item.logits + last * V, size_t(V))));
    }
}

// Output head: items that want every row's logits write straight into their buffer; the last rows of the others
// are gathered so the head is read once for all of them.
void Forward::head(std::span<const BatchItem> items) {
  const auto& c = w_.config;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  float* hidden = hidden_.as<float>();
  float* normed = normed_.as<float>();
  int64_t r = 0, gathered = 0;
  for (const BatchItem& item : items) {
    const int64_t len = int64_t(item.tokens.size());
    if (item.all_logits) {
      for (int64_t i = 0; i < len; ++i)
        rms_norm(hidden + (r + i) * H, w_.final_norm.data(), H, c.rms_norm_eps, hidden + (r + i) * H);
      multiply(w_.output(), hidden + r * H, len, item.logits, pool_);
    } else {
      rms_norm(hidden + (r + len - 1) * H, w_.final_norm.data(), H, c.rms_norm_eps, normed + gathered * H);
      ++gathered;
    }
    r += len;
  }
  if (gathered == 0) return;
  if (gathered == 1) {
    for (const BatchItem& item : items)
      if (!item.all_logits) kernels::matvec(w_.output(), normed, item.logits, pool_);
    return;
  }
  if (logits_.size() < size_t(gathered * V) * sizeof(float))
    logits_ = scratch(ledger_, gathered * V);  // grows to the largest decode batch seen
  multiply(w_.output(), normed, gathered, logits_.as<float>(), pool_);
  int64_t g = 0;
  for (const BatchItem& item : items)
    if (!item.all_logits) {
      std::memcpy(item.logits, logits_.as<float>() + g * V, size_t(V) * sizeof(float));
      ++g;
    }
}

}  // namespace tierlm::engine
