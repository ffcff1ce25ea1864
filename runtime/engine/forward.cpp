#include "runtime/engine/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "runtime/engine/gated_deltanet.h"
#include "runtime/engine/row_ops.h"
#include "runtime/engine/sampler.h"
#include "runtime/gpu/gpu_layers.h"

namespace tierlm::engine {

using kernels::WeightView;

namespace {

// One row of the residual stream: hidden += x, then + bias (an element's two adds in that order).
void add_residual(const float* x, const std::vector<float>& bias, int64_t H, float* hidden) {
  for (int64_t j = 0; j < H; ++j) hidden[j] += x[j];
  if (bias.empty()) return;
  for (int64_t j = 0; j < H; ++j) hidden[j] += bias[size_t(j)];
}

// Gated attention (qwen3_5): q_proj's rows hold [query | gate] per head. Moves the queries together at the start of
// the row (where the attention reads them) and the gates out to `gate`.
void split_query_gate(float* row, int64_t heads, int64_t head_dim, float* gate) {
  for (int64_t h = 0; h < heads; ++h) {
    std::memcpy(gate + h * head_dim, row + (2 * h + 1) * head_dim, size_t(head_dim) * sizeof(float));
    std::memmove(row + h * head_dim, row + 2 * h * head_dim, size_t(head_dim) * sizeof(float));
  }
}

// What matvec/matmul of up to `rows` activation rows take from the MatmulScratch for every weight the forward pass
// multiplies: each layer's projections, the routed experts in the tier's slot format, the output head.
kernels::MatmulScratch::Sizes matmul_scratch_needs(const model::ModelWeights& w, int64_t rows) {
  kernels::MatmulScratch::Sizes need{};
  auto add = [&](const kernels::MatmulScratch::Sizes& s) {
    for (size_t r = 0; r < need.size(); ++r) need[r] = std::max(need[r], s[r]);
  };
  auto weight = [&](const kernels::Weight& m) {
    if (m.view.rows > 0) add(kernels::matmul_scratch_sizes(m.view, rows));
  };
  for (const model::LayerWeights& L : w.layers) {
    for (const kernels::Weight* m : {&L.qkv, &L.o, &L.linear_in, &L.mla_in, &L.q_b, &L.gate_up, &L.down, &L.router,
                                     &L.shared_gate_up, &L.shared_down, &L.per_layer_input_gate,
                                     &L.per_layer_projection})
      weight(*m);
  }
  weight(w.per_layer_model_projection);
  if (w.output().rows > 0) add(kernels::matmul_scratch_sizes(w.output(), 1));  // the head: one row at a time
  if (w.experts) {
    const tiering::ExpertLayout& e = w.experts->store().layout();
    add(kernels::matmul_scratch_sizes(e.format, 2 * e.intermediate, e.hidden, e.group_size, rows));
    add(kernels::matmul_scratch_sizes(e.format, e.hidden, e.intermediate, e.group_size, rows));
  }
  return need;
}

}  // namespace

Forward::Forward(const model::ModelWeights& w, kernels::ThreadPool& pool, tiering::Ledger& ledger, int64_t max_chunk,
                 int64_t max_context)
    : w_(w), pool_(pool), max_chunk_(max_chunk), max_context_(max_context), ledger_(ledger), matmul_scratch_(ledger),
      row_cache_(size_t(max_chunk)), row_pos_(size_t(max_chunk)) {
  if (max_chunk <= 0 || max_context <= 0) throw std::invalid_argument("forward: chunk and context must be positive");
  const auto& c = w.config;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    specs_.push_back(c.layer(i));
    ropes_.emplace_back(c.rope_of(i), specs_.back().head_dim);
  }
  const int64_t q_rows = c.max_q_rows(), kv_rows = c.max_kv_rows(), H = c.hidden_size;
  // The widest fused attention projection of any layer (its query rows doubled with qwen3_5's output gate).
  qkv_stride_ = std::max(c.attention_input_rows(), q_rows + 2 * kv_rows);
  matmul_scratch_.reserve(matmul_scratch_needs(w, max_chunk));
  hidden_ = scratch_floats(ledger, max_chunk * H);
  normed_ = scratch_floats(ledger, max_chunk * H);
  qkv_ = scratch_floats(ledger, max_chunk * qkv_stride_);
  attn_ = scratch_floats(ledger, max_chunk * q_rows);
  if (c.arch.attention_output_gate) gate_ = scratch_floats(ledger, max_chunk * q_rows);
  // One mixer unit per kind the layers use besides attention.
  if (c.any_recurrent()) deltanet_ = std::make_unique<GatedDeltaNet>(w, pool, ledger, max_chunk);
  if (c.any_mla()) mla_ = std::make_unique<MlaAttention>(w, pool, ledger, max_chunk);
  // One MLP unit per kind the layers use: the MoE block for sparse layers, dense scratch for dense ones.
  if (c.sparse_layers() > 0) moe_ = std::make_unique<MoeBlock>(w, pool, ledger, max_chunk);
  if (const int64_t I = c.max_intermediate(); I > 0) {
    ffn_ = scratch_floats(ledger, max_chunk * 2 * I);
    ffn_act_ = scratch_floats(ledger, max_chunk * I);
  }
  if (c.arch.gemma4) {
    values_ = scratch_floats(ledger, max_chunk * kv_rows);
    mlp_out_ = scratch_floats(ledger, max_chunk * H);
    if (c.sparse_layers() > 0) {
      moe_out_ = scratch_floats(ledger, max_chunk * H);
      router_in_ = scratch_floats(ledger, max_chunk * H);
    }
    if (const int64_t P = c.per_layer_input_size; P > 0) {
      ple_ = scratch_floats(ledger, max_chunk * c.num_layers * P);
      ple_tokens_ = scratch_floats(ledger, max_chunk * c.num_layers * P);
      ple_gate_ = scratch_floats(ledger, max_chunk * P);
    }
  }
}

// Per-row elementwise work: split across the pool only when there is enough of it.
template <class Fn>
void Forward::per_row(int64_t n, Fn&& fn) {
  if (n == 1)
    fn(0);
  else
    pool_.parallel_for(n, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) fn(i);
    });
}

void Forward::attention(int64_t layer, int64_t n) {
  // One work item per (row, kv head): the heads of a GQA group share every key/value the cache decodes.
  const auto& c = w_.config;
  const model::LayerSpec& spec = specs_[size_t(layer)];
  const int64_t hd = spec.head_dim, kv_heads = spec.kv_heads, group = c.num_heads / kv_heads;
  const int64_t q_rows = c.num_heads * hd, qkv_stride = w_.layers[size_t(layer)].qkv.view.rows;
  const float* qkv = qkv_.as<float>();
  float* out = attn_.as<float>();
  const float* sinks = w_.layers[size_t(layer)].sinks.empty() ? nullptr : w_.layers[size_t(layer)].sinks.data();
  pool_.parallel_for(n * kv_heads, [&](int64_t begin, int64_t end, int) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / kv_heads, g = item % kv_heads;
      const int64_t len = row_pos_[size_t(i)] + 1;  // causal: this row sees its own position and all before it
      row_cache_[size_t(i)]->attend(layer, g, qkv + i * qkv_stride + g * group * hd, group, len,
                                    out + i * q_rows + g * group * hd, sinks ? sinks + g * group : nullptr);
    }
  });
}

void Forward::use_gpu(std::shared_ptr<gpu::GpuLayers> gpu) {
  gpu_ = std::move(gpu);
  if (gpu_) gpu_->set_host_experts(moe_.get());  // hybrid MoE placement: GPU layers' experts on the CPU
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
  kernels::MatmulScratch::Scope scratch_scope(matmul_scratch_);
  const auto& c = w_.config;
  const int64_t H = c.hidden_size, V = c.vocab_size;
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
  if (!device_embed && c.embedding_scale != 1.0) {  // Gemma: embeddings scaled by sqrt(hidden_size)
    const float scale = float(c.embedding_scale);
    for (int64_t j = 0; j < n * H; ++j) hidden[j] *= scale;
  }
  if (c.per_layer_input_size > 0) per_layer_inputs(items, n);  // from the scaled embeddings, before any layer
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
    if (c.per_layer_input_size > 0)  // Gemma 4's per-layer inputs, computed above, go up with the step
      step.per_layer_inputs =
          std::span<const float>(ple_.as<float>(), size_t(n * c.num_layers * c.per_layer_input_size));
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
  for (int64_t layer = first_layer; layer < c.num_layers; ++layer) {
    const model::LayerWeights& L = w_.layers[size_t(layer)];
    const model::LayerSpec& spec = specs_[size_t(layer)];
    const int64_t hd = spec.head_dim, kv_heads = spec.kv_heads;
    const int64_t q_rows = c.num_heads * hd, kv_rows = kv_heads * hd, qkv_stride = L.qkv.view.rows;
    // Where k starts in a row of qkv: after the queries, or after the interleaved queries and gates.
    const int64_t q_width = c.arch.attention_output_gate ? 2 * q_rows : q_rows;
    const bool own_kv = spec.kv_source < 0;
    const Rope& rope = ropes_[size_t(layer)];
    // Gemma 4 scales scores by attention_scale (1.0) where the cache's attention scales by 1/sqrt(head_dim).
    const float q_scale = c.attention_scale > 0 ? float(c.attention_scale * std::sqrt(double(hd))) : 1.0f;
    per_row(n, [&](int64_t i) { rms_norm(hidden + i * H, L.input_norm.data(), H, c.rms_norm_eps, normed + i * H); });
    if (spec.mixer == model::Mixer::gated_deltanet) {
      // out may alias the input: the mixer reads it only in its first projection.
      deltanet_->run(layer, normed, n, std::span(row_cache_.data(), size_t(n)), std::span(row_pos_.data(), size_t(n)),
                     normed);
    } else if (spec.mixer == model::Mixer::mla) {
      mla_->run(layer, normed, n, std::span(row_cache_.data(), size_t(n)), std::span(row_pos_.data(), size_t(n)),
                normed);
    } else {
      multiply(L.qkv.view, normed, n, qkv, pool_);
      per_row(n, [&](int64_t i) {
        float* row = qkv + i * qkv_stride;
        if (!L.qkv_bias.empty())
          for (int64_t j = 0; j < qkv_stride; ++j) row[j] += L.qkv_bias[size_t(j)];
        if (gate_.size()) split_query_gate(row, c.num_heads, hd, gate_.as<float>() + i * q_rows);
        float* q = row;
        float* k = row + q_width;
        float* v = row + q_width + kv_rows;
        if (own_kv && spec.k_eq_v) {  // values are the keys' projection, taken before the key norm and RoPE
          v = values_.as<float>() + i * kv_rows;
          std::memcpy(v, k, size_t(kv_rows) * sizeof(float));
        }
        if (!L.q_norm.empty()) {
          // In units of the norm weights' width: one head (qwen3) or the whole projection (olmoe).
          const int64_t qn = int64_t(L.q_norm.size());
          for (int64_t o = 0; o < q_rows; o += qn) rms_norm(q + o, L.q_norm.data(), qn, c.rms_norm_eps, q + o);
        }
        if (own_kv && !L.k_norm.empty()) {
          const int64_t kn = int64_t(L.k_norm.size());
          for (int64_t o = 0; o < kv_rows; o += kn) rms_norm(k + o, L.k_norm.data(), kn, c.rms_norm_eps, k + o);
        }
        if (own_kv && c.arch.gemma4)  // Gemma 4's v_norm: RMS over each head, no weight
          for (int64_t o = 0; o < kv_rows; o += hd) rms_norm_unscaled(v + o, hd, c.rms_norm_eps, v + o);
        const int64_t pos = row_pos_[size_t(i)];
        rope.apply(q, c.num_heads, pos);
        if (q_scale != 1.0f)
          for (int64_t j = 0; j < q_rows; ++j) q[j] *= q_scale;
        if (!own_kv) return;  // a KV-shared layer attends over its source layer's keys and values
        rope.apply(k, kv_heads, pos);
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
      if (c.arch.gemma4) {  // sandwich norm: the attention output is normed before the residual add
        per_row(n, [&](int64_t i) {
          rms_norm(normed + i * H, L.post_attention_norm.data(), H, c.rms_norm_eps, normed + i * H);
        });
        per_row(n, [&](int64_t i) { add_residual(normed + i * H, {}, H, hidden + i * H); });
        feed_forward_gemma4(layer, n);
        if (c.per_layer_input_size > 0) per_layer_input(layer, n);
        if (L.layer_scalar != 1.0f)
          for (int64_t j = 0; j < n * H; ++j) hidden[j] *= L.layer_scalar;
        continue;
      }
    }

    // The mixer's output (in normed) joins the residual stream, and the MLP's input is normed from it, row by row on
    // the pool: one pass where the add ran on the calling thread before (0.6-0.7 ms of a 128-row chunk's ~28 ms on
    // the device's 16 cores, fit_accuracy_bench's MoE).
    per_row(n, [&](int64_t i) {
      add_residual(normed + i * H, L.o_bias, H, hidden + i * H);
      rms_norm(hidden + i * H, L.post_attention_norm.data(), H, c.rms_norm_eps, normed + i * H);
    });
    if (spec.mlp == model::Mlp::moe) {
      moe_->accumulate(layer, normed, n, hidden);
      continue;
    }
    feed_forward(layer, n);
    per_row(n, [&](int64_t i) { add_residual(normed + i * H, L.down_bias, H, hidden + i * H); });
  }

  head(items);
  for (const BatchItem& item : items)
    if (item.greedy) {
      const int64_t last = item.all_logits ? int64_t(item.tokens.size()) - 1 : 0;
      *item.greedy = int32_t(argmax(std::span<const float>(item.logits + last * V, size_t(V))));
    }
}

// The dense MLP of `layer` on normed (n rows), output in normed; biases on gate/up only (down's is the caller's).
void Forward::feed_forward(int64_t layer, int64_t n) {
  const model::LayerWeights& L = w_.layers[size_t(layer)];
  const int64_t I = specs_[size_t(layer)].intermediate;
  const GateFn gate = gate_for(w_.config.hidden_act);
  float* ffn = ffn_.as<float>();
  float* normed = normed_.as<float>();
  multiply(L.gate_up.view, normed, n, ffn, pool_);
  per_row(n, [&](int64_t i) {
    if (!L.gate_up_bias.empty())
      for (int64_t j = 0; j < 2 * I; ++j) ffn[i * 2 * I + j] += L.gate_up_bias[size_t(j)];
    gate(ffn + i * 2 * I, I, ffn_act_.as<float>() + i * I);
  });
  multiply(L.down.view, ffn_act_.as<float>(), n, normed, pool_);
}

// Gemma 4's feed-forward: hidden += post_ffn_norm(post_ffn_norm_1(MLP(pre_ffn_norm(h))) + post_ffn_norm_2(MoE)),
// where the MoE's experts see pre_ffn_norm_2(h) and its router rms_norm(h) * router_scale / sqrt(hidden); without
// experts, hidden += post_ffn_norm(MLP(pre_ffn_norm(h))).
void Forward::feed_forward_gemma4(int64_t layer, int64_t n) {
  const auto& c = w_.config;
  const model::LayerWeights& L = w_.layers[size_t(layer)];
  const int64_t H = c.hidden_size;
  const double eps = c.rms_norm_eps;
  float* hidden = hidden_.as<float>();
  float* normed = normed_.as<float>();
  float* mlp = mlp_out_.as<float>();
  per_row(n, [&](int64_t i) { rms_norm(hidden + i * H, L.pre_feedforward_norm.data(), H, eps, normed + i * H); });
  feed_forward(layer, n);
  std::memcpy(mlp, normed, size_t(n * H) * sizeof(float));
  if (specs_[size_t(layer)].mlp == model::Mlp::moe) {
    float* moe = moe_out_.as<float>();
    float* router = router_in_.as<float>();
    const float root = float(1.0 / std::sqrt(double(H)));
    per_row(n, [&](int64_t i) {
      rms_norm(mlp + i * H, L.post_feedforward_norm_1.data(), H, eps, mlp + i * H);
      rms_norm_unscaled(hidden + i * H, H, eps, router + i * H);
      for (int64_t j = 0; j < H; ++j) router[i * H + j] = router[i * H + j] * L.router_scale[size_t(j)] * root;
      rms_norm(hidden + i * H, L.pre_feedforward_norm_2.data(), H, eps, normed + i * H);
    });
    std::memset(moe, 0, size_t(n * H) * sizeof(float));
    moe_->accumulate(layer, normed, n, moe, router);
    per_row(n, [&](int64_t i) {
      rms_norm(moe + i * H, L.post_feedforward_norm_2.data(), H, eps, moe + i * H);
      for (int64_t j = 0; j < H; ++j) mlp[i * H + j] += moe[i * H + j];
    });
  }
  per_row(n, [&](int64_t i) {
    rms_norm(mlp + i * H, L.post_feedforward_norm.data(), H, eps, mlp + i * H);
    for (int64_t j = 0; j < H; ++j) hidden[i * H + j] += mlp[i * H + j];
  });
}

// Gemma 4 per-layer inputs (PLE): per row and layer, (rms_norm(projection(embedding) / sqrt(hidden)) +
// embed_per_layer[token] * sqrt(P)) / sqrt(2), with `hidden` still holding the scaled embeddings.
void Forward::per_layer_inputs(std::span<const BatchItem> items, int64_t n) {
  const auto& c = w_.config;
  const int64_t P = c.per_layer_input_size, LP = c.num_layers * P;
  float* ple = ple_.as<float>();
  float* tokens = ple_tokens_.as<float>();
  {
    int64_t r = 0;
    for (const BatchItem& item : items)
      for (int32_t t : item.tokens) {
        if (t >= c.per_layer_vocab_size)
          throw std::out_of_range(fmt::format("token id {} is outside the per-layer input vocabulary (size {})", t,
                                              c.per_layer_vocab_size));
        kernels::dequantize_row(w_.embed_per_layer.view, t, tokens + (r++) * LP);
      }
  }
  multiply(w_.per_layer_model_projection.view, hidden_.as<float>(), n, ple, pool_);
  const float projection_scale = float(1.0 / std::sqrt(double(c.hidden_size)));
  const float token_scale = float(std::sqrt(double(P)));
  const float input_scale = float(1.0 / std::sqrt(2.0));
  per_row(n, [&](int64_t i) {
    float* row = ple + i * LP;
    const float* tok = tokens + i * LP;
    for (int64_t j = 0; j < LP; ++j) row[j] *= projection_scale;
    for (int64_t l = 0; l < c.num_layers; ++l)
      rms_norm(row + l * P, w_.per_layer_projection_norm.data(), P, c.rms_norm_eps, row + l * P);
    for (int64_t j = 0; j < LP; ++j) row[j] = (row[j] + tok[j] * token_scale) * input_scale;
  });
}

// hidden += rms_norm(projection(gelu(gate(hidden)) * per_layer_input)), Gemma 4's per-layer input of `layer`.
void Forward::per_layer_input(int64_t layer, int64_t n) {
  const auto& c = w_.config;
  const model::LayerWeights& L = w_.layers[size_t(layer)];
  const int64_t H = c.hidden_size, P = c.per_layer_input_size, LP = c.num_layers * P;
  float* hidden = hidden_.as<float>();
  float* normed = normed_.as<float>();
  float* gate = ple_gate_.as<float>();
  const float* ple = ple_.as<float>();
  multiply(L.per_layer_input_gate.view, hidden, n, gate, pool_);
  per_row(n, [&](int64_t i) {
    for (int64_t j = 0; j < P; ++j) gate[i * P + j] = gelu_tanh(gate[i * P + j]) * ple[i * LP + layer * P + j];
  });
  multiply(L.per_layer_projection.view, gate, n, normed, pool_);
  per_row(n, [&](int64_t i) {
    rms_norm(normed + i * H, L.post_per_layer_input_norm.data(), H, c.rms_norm_eps, normed + i * H);
    for (int64_t j = 0; j < H; ++j) hidden[i * H + j] += normed[i * H + j];
  });
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
      if (c.final_logit_softcapping > 0) soft_cap(item.logits, len * V, c.final_logit_softcapping);
    } else {
      rms_norm(hidden + (r + len - 1) * H, w_.final_norm.data(), H, c.rms_norm_eps, normed + gathered * H);
      ++gathered;
    }
    r += len;
  }
  if (gathered == 0) return;
  if (gathered == 1) {
    for (const BatchItem& item : items)
      if (!item.all_logits) {
        kernels::matvec(w_.output(), normed, item.logits, pool_);
        if (c.final_logit_softcapping > 0) soft_cap(item.logits, V, c.final_logit_softcapping);
      }
    return;
  }
  if (logits_.size() < size_t(gathered * V) * sizeof(float))
    logits_ = scratch_floats(ledger_, gathered * V);  // grows to the largest decode batch seen
  multiply(w_.output(), normed, gathered, logits_.as<float>(), pool_);
  if (c.final_logit_softcapping > 0) soft_cap(logits_.as<float>(), gathered * V, c.final_logit_softcapping);
  int64_t g = 0;
  for (const BatchItem& item : items)
    if (!item.all_logits) {
      std::memcpy(item.logits, logits_.as<float>() + g * V, size_t(V) * sizeof(float));
      ++g;
    }
}

}  // namespace tierlm::engine
