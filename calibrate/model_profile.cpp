// calibrate/model_profile.cpp — weight-class sizes from a config, the model fingerprint, frequencies from traces,
// and ModelProfile's JSON form.
#include "calibrate/model_profile.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "calibrate/device_profile.h"
#include "calibrate/json_fields.h"
#include "runtime/kv/codec.h"
#include "tiering/expert_layout.h"

namespace tierlm::calibrate {

namespace bj = boost::json;
namespace fs = std::filesystem;

uint64_t ModelProfile::dense_bytes() const {
  uint64_t b = 0;
  for (auto& c : classes)
    if (c.name != "experts") b += c.bytes;
  return b;
}

std::vector<GemmShape> ModelProfile::dense_gemm_shapes() const {
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  std::vector<GemmShape> shapes{{"qkv", q + 2 * kv, hidden}, {"o", hidden, q}};
  if (moe()) {
    shapes.push_back({"router", experts, hidden});
  } else {
    shapes.push_back({"gate_up", 2 * intermediate, hidden});
    shapes.push_back({"down", hidden, intermediate});
  }
  return shapes;
}

uint64_t ModelProfile::dense_read_per_token() const {
  uint64_t b = 0;
  for (auto& c : classes)
    if (c.name != "experts") b += c.read_per_token;
  return b;
}

uint64_t matrix_bytes(kernels::WeightFormat format, int64_t rows, int64_t cols) {
  using kernels::WeightFormat;
  const uint64_t r = uint64_t(rows), c = uint64_t(cols), padded = (r + 15) / 16 * 16, groups = (c + 31) / 32;
  switch (format) {
    case WeightFormat::f32: return r * c * 4;
    case WeightFormat::f16:
    case WeightFormat::bf16: return r * c * 2;
    case WeightFormat::q8_0: return padded * (c + groups * 2);         // u8 codes + f16 scale per 32
    case WeightFormat::q4: return padded * (c / 2 + groups * 4);       // nibbles + f16 (step, min) per 32
    case WeightFormat::mlx_q8: return padded * (c + (c / 64) * 4);     // group 64, f16 scales + biases
    case WeightFormat::mlx_q4: return padded * (c / 2 + (c / 64) * 4);
    case WeightFormat::mxfp4: return r * (c / 2 + c / 32);              // blocks + one E8M0 byte per 32
  }
  return r * c * 4;
}

ModelProfile model_profile_from_config(const model::ModelConfig& c, kernels::WeightFormat wf,
                                       kernels::WeightFormat ef) {
  ModelProfile p;
  p.name = c.model_type;
  p.model_type = c.model_type;
  p.weight_format = kernels::format_name(wf);
  p.layers = c.num_layers;
  p.hidden = c.hidden_size;
  p.intermediate = c.intermediate_size;
  p.heads = c.num_heads;
  p.kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.vocab = c.vocab_size;
  p.max_context = c.max_position_embeddings;
  if (c.any_windowed())
    for (int64_t l = 0; l < c.num_layers; ++l) p.layer_windows.push_back(c.layer(l).window);
  if (c.any_recurrent())
    for (int64_t l = 0; l < c.num_layers; ++l) p.layer_recurrent_bytes.push_back(c.state_spec(l).recurrent_bytes);
  if (c.any_mla())
    for (int64_t l = 0; l < c.num_layers; ++l) p.layer_latent_floats.push_back(c.state_spec(l).latent_floats);
  bool uniform = true;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const kv::StateSpec s = c.state_spec(l);
    if (!s.recurrent() && !s.latent() && (s.kv_heads != c.num_kv_heads || s.head_dim != c.head_dim)) uniform = false;
  }
  if (!uniform)
    for (int64_t l = 0; l < c.num_layers; ++l) {
      p.layer_kv_heads.push_back(c.state_spec(l).kv_heads);
      p.layer_head_dims.push_back(c.state_spec(l).head_dim);
    }
  const int64_t H = c.hidden_size, q = c.num_heads * c.head_dim;
  // Load-time staging (runtime/model/model.cpp): each dense matrix is gathered in f32 (MLX: its packed words,
  // scales and biases) before conversion; the largest one is the peak.
  auto staging = [&](int64_t rows, int64_t cols) -> uint64_t {
    if (c.quantization && c.quantization->group_size > 0)
      return uint64_t(rows) * (uint64_t(cols) * uint64_t(c.quantization->bits) / 8 +
                               uint64_t(cols / c.quantization->group_size) * 2 * 4);
    return uint64_t(rows) * uint64_t(cols) * 4;
  };
  p.load_scratch_bytes = std::max({staging(c.vocab_size, H), staging(c.attention_input_rows(), H), staging(H, q),
                                   staging(c.deltanet.conv_dim() + c.deltanet.value_dim() +
                                           2 * c.deltanet.value_heads, H)});
  if (c.arch.moe && c.num_experts > 0) {
    p.load_scratch_bytes = std::max(p.load_scratch_bytes, staging(c.num_experts, H));
    if (c.shared_expert_intermediate_size > 0)
      p.load_scratch_bytes = std::max(p.load_scratch_bytes, staging(2 * c.shared_expert_intermediate_size, H));
  } else {
    p.load_scratch_bytes = std::max(p.load_scratch_bytes, staging(2 * c.intermediate_size, H));
  }
  const uint64_t embed = matrix_bytes(wf, c.vocab_size, H);
  p.classes.push_back({"embedding", embed, c.tie_word_embeddings ? embed : matrix_bytes(wf, 1, H)});
  if (!c.tie_word_embeddings) p.classes.push_back({"output", embed, embed});
  // The mixers' projections, per layer kind: attention's [q (| gate) | k | v] and o; a Gated DeltaNet's fused
  // [qkv | z | b | a] and out_proj.
  uint64_t attention = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const model::DeltaNetConfig& d = c.deltanet;
    if (c.layer(l).mixer == model::Mixer::mla) {
      // MLA (runtime/model/mla_weights.h): [q_a | kv_a] (or [q | kv_a]), q_b, o_proj, and kv_b_proj kept in f32.
      const model::MlaConfig& m = c.mla;
      const int64_t heads = c.num_heads, first = m.q_lora_rank > 0 ? m.q_lora_rank : heads * m.qk_head_dim();
      attention += matrix_bytes(wf, first + m.latent_floats(), H) + matrix_bytes(wf, H, heads * m.v_head_dim) +
                   (m.q_lora_rank > 0 ? matrix_bytes(wf, heads * m.qk_head_dim(), m.q_lora_rank) : 0) +
                   uint64_t(heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank) * 4;
      continue;
    }
    attention += c.layer(l).mixer == model::Mixer::gated_deltanet
                     ? matrix_bytes(wf, d.conv_dim() + d.value_dim() + 2 * d.value_heads, H) +
                           matrix_bytes(wf, H, d.value_dim())
                     : matrix_bytes(wf, c.attention_input_rows(), H) + matrix_bytes(wf, H, q);
  }
  p.classes.push_back({"attention", attention, attention});
  uint64_t norms = uint64_t(c.num_layers) * 2 * H * 4 + H * 4;
  if (c.arch.qk_norm) norms += uint64_t(c.num_layers) * 2 * c.head_dim * 4;
  p.classes.push_back({"norms", norms, norms});
  if (c.arch.moe && c.num_experts > 0) {
    p.expert_format = kernels::format_name(ef);
    p.experts = c.num_experts;
    p.top_k = c.num_experts_per_tok;
    p.moe_layers = c.sparse_layers();
    p.moe_intermediate = c.moe_intermediate_size;
    p.shared_intermediate = c.shared_expert_intermediate_size;
    // MLX experts keep the file's group size and bits (the layout cannot guess them: group 0 divides by zero).
    const bool mlx = ef == kernels::WeightFormat::mlx_q4 || ef == kernels::WeightFormat::mlx_q8;
    const int group = mlx ? (c.quantization && c.quantization->group_size > 0 ? c.quantization->group_size : 64) : 0;
    const int bits = mlx ? (ef == kernels::WeightFormat::mlx_q8 ? 8 : 4) : 0;
    // gpt-oss experts carry their output biases (f32) in the slot; MXFP4 ones keep blocks + scales as stored.
    const auto layout = tiering::ExpertLayout::make(ef, H, c.moe_intermediate_size, group, bits,
                                                    kernels::SourceType::f16, c.arch.gpt_oss);
    p.expert_bytes = layout.bytes;
    p.expert_payload_bytes = layout.payload_bytes();
    p.expert_read_bytes = layout.bytes;  // a packed file: one aligned block per expert
    p.packed_experts = true;
    const uint64_t router = uint64_t(p.moe_layers) * matrix_bytes(wf, c.num_experts, H);
    p.classes.push_back({"router", router, router});
    if (c.shared_expert_intermediate_size > 0) {
      const int64_t S = c.shared_expert_intermediate_size;
      const uint64_t shared = uint64_t(p.moe_layers) * (matrix_bytes(wf, 2 * S, H) + matrix_bytes(wf, H, S) + H * 4);
      p.classes.push_back({"shared_expert", shared, shared});
    }
    p.classes.push_back({"experts", p.total_expert_bytes(), uint64_t(p.moe_layers * p.top_k) * p.expert_payload_bytes});
    p.expert_frequency.assign(size_t(p.moe_layers),
                              std::vector<double>(size_t(p.experts), double(p.top_k) / double(p.experts)));
    p.frequency_source = "uniform (from config.json; no router traces)";
  }
  if (const int64_t dense_layers = c.num_layers - c.sparse_layers(); dense_layers > 0) {
    const uint64_t mlp = uint64_t(dense_layers) * (matrix_bytes(wf, 2 * c.intermediate_size, H) +
                                                   matrix_bytes(wf, H, c.intermediate_size));
    p.classes.push_back({"dense_mlp", mlp, mlp});
  }
  return p;
}

std::vector<fs::path> model_weight_files(const fs::path& dir) {
  std::vector<fs::path> weights;
  std::error_code ec;
  for (auto& entry : fs::directory_iterator(dir, ec)) {
    const auto ext = entry.path().extension().string();
    if (ext == ".safetensors" || ext == ".tierlm") weights.push_back(entry.path());
  }
  std::sort(weights.begin(), weights.end());
  return weights;
}

std::string model_fingerprint(const fs::path& dir, const std::string& formats) {
  std::ostringstream text;
  auto add_file = [&](const fs::path& f, size_t limit) {
    std::ifstream in(f, std::ios::binary);
    std::string head(limit, '\0');
    in.read(head.data(), std::streamsize(limit));
    head.resize(size_t(in.gcount()));
    std::error_code ec;
    text << f.filename().string() << ':' << fs::file_size(f, ec) << ':' << head << '\n';
  };
  add_file(dir / "config.json", 1 << 20);
  for (auto& f : model_weight_files(dir)) add_file(f, 64 << 10);
  text << formats;
  return fingerprint_hash(text.str());
}

std::vector<std::vector<double>> frequencies(const RouterTrace& t, int64_t first, int64_t last) {
  std::vector<std::vector<double>> f(size_t(t.layers), std::vector<double>(size_t(t.experts), 0.0));
  if (last < 0 || last > t.tokens()) last = t.tokens();
  first = std::clamp<int64_t>(first, 0, last);
  const int64_t tokens = last - first;
  if (tokens == 0) return f;
  for (int64_t i = first; i < last; ++i)
    for (int64_t l = 0; l < t.layers; ++l)
      for (int64_t j = 0; j < t.top_k; ++j)
        f[size_t(l)][size_t(t.selections[size_t((i * t.layers + l) * t.top_k + j)])] += 1.0 / double(tokens);
  return f;
}

bj::value to_json(const ModelProfile& p) {
  bj::object o;
  o["schema_version"] = ModelProfile::kSchemaVersion;
  o["path"] = p.path;
  o["name"] = p.name;
  o["model_type"] = p.model_type;
  o["fingerprint"] = p.fingerprint;
  o["weight_format"] = p.weight_format;
  o["expert_format"] = p.expert_format;
  o["shape"] = bj::object{{"layers", p.layers},   {"hidden", p.hidden},     {"intermediate", p.intermediate},
                          {"heads", p.heads},     {"kv_heads", p.kv_heads}, {"head_dim", p.head_dim},
                          {"vocab", p.vocab},     {"max_context", p.max_context}};
  o["moe"] = bj::object{{"experts", p.experts},
                        {"top_k", p.top_k},
                        {"moe_layers", p.moe_layers},
                        {"moe_intermediate", p.moe_intermediate},
                        {"expert_bytes", p.expert_bytes},
                        {"expert_payload_bytes", p.expert_payload_bytes},
                        {"expert_read_bytes", p.expert_read_bytes},
                        {"expert_staging_bytes", p.expert_staging_bytes},
                        {"expert_conversion_bytes", p.expert_conversion_bytes},
                        {"packed_experts", p.packed_experts},
                        {"shared_intermediate", p.shared_intermediate}};
  if (!p.expert_read_extents.empty()) o["moe"].as_object()["read_extents"] = bj::value_from(p.expert_read_extents);
  o["load_scratch_bytes"] = p.load_scratch_bytes;
  if (p.scratch_row_bytes > 0)
    o["runtime_scratch"] = bj::object{{"row_bytes", p.scratch_row_bytes}, {"fixed_bytes", p.scratch_fixed_bytes},
                                      {"lane_row_bytes", p.lane_row_bytes}, {"thread_bytes", p.scratch_thread_bytes}};
  if (!p.layer_windows.empty()) o["layer_windows"] = bj::value_from(p.layer_windows);
  if (!p.layer_recurrent_bytes.empty()) o["layer_recurrent_bytes"] = bj::value_from(p.layer_recurrent_bytes);
  if (!p.layer_kv_heads.empty()) o["layer_kv_heads"] = bj::value_from(p.layer_kv_heads);
  if (!p.layer_head_dims.empty()) o["layer_head_dims"] = bj::value_from(p.layer_head_dims);
  if (!p.layer_latent_floats.empty()) o["layer_latent_floats"] = bj::value_from(p.layer_latent_floats);
  bj::array timings;
  for (auto& t : p.timings)
    timings.push_back(bj::object{{"threads", t.threads},
                                 {"step_seconds", t.step_seconds},
                                 {"expert_seconds", t.expert_seconds},
                                 {"router_seconds", t.router_seconds},
                                 {"miss_seconds", t.miss_seconds},
                                 {"miss_batch_seconds", t.miss_batch_seconds}});
  o["timings"] = timings;
  if (!p.prefill.gemms.empty()) {
    bj::array gemms;
    for (auto& g : p.prefill.gemms)
      gemms.push_back(bj::object{{"kind", g.kind}, {"format", g.format}, {"out", g.out}, {"in", g.in},
                                 {"threads", g.threads}, {"rows", bj::value_from(g.rows)},
                                 {"gflops", bj::value_from(g.gflops)}});
    o["prefill_gemms"] = gemms;
  }
  if (p.prefill.gate_seconds > 0)
    o["prefill_row_seconds"] = bj::object{{"gate", p.prefill.gate_seconds}, {"row", p.prefill.row_seconds}};
  if (p.prefill.attention_seconds > 0)
    o["prefill_attention"] = bj::object{{"seconds", p.prefill.attention_seconds},
                                        {"threads", p.prefill.attention_threads},
                                        {"codec", p.prefill.attention_codec}};
  if (p.prefill.expert_gflops > 0)
    o["prefill_experts"] = bj::object{{"gflops", p.prefill.expert_gflops}, {"threads", p.prefill.expert_threads},
                                      {"rows", p.prefill.expert_rows}, {"format", p.prefill.expert_format}};
  bj::array classes;
  for (auto& c : p.classes) classes.push_back(bj::object{{"name", c.name}, {"bytes", c.bytes}, {"read_per_token", c.read_per_token}});
  o["weight_classes"] = classes;
  bj::array freq;
  for (auto& layer : p.expert_frequency) {
    bj::array row;
    for (double f : layer) row.push_back(f);
    freq.push_back(row);
  }
  o["expert_frequency"] = freq;
  o["frequency_source"] = p.frequency_source;
  o["traced_prompts"] = p.traced_prompts;
  o["traced_tokens"] = p.traced_tokens;
  if (!p.trace_selections.empty()) o["router_trace"] = bj::value_from(p.trace_selections);
  if (!p.kv_perplexity_increase.empty()) {
    bj::object q, revisions;
    for (auto& [codec, increase] : p.kv_perplexity_increase) {
      q[codec] = increase;
      revisions[codec] = kv::codec_revision(kv::parse_codec(codec));
    }
    o["kv_quality"] = bj::object{{"tokens", p.kv_quality_tokens}, {"perplexity_increase", q}, {"revisions", revisions}};
  }
  return o;
}

ModelProfile model_profile_from_json(const bj::value& v) {
  using namespace json;
  const std::string what = "model profile";
  const auto& o = object(v, what);
  if (integer(o, "schema_version", what) != ModelProfile::kSchemaVersion)
    throw std::runtime_error(what + ": unsupported schema_version (re-run tierlm calibrate)");
  ModelProfile p;
  p.path = string_or(o, "path", "");
  p.name = string_or(o, "name", "");
  p.model_type = string_or(o, "model_type", "");
  p.fingerprint = string(o, "fingerprint", what);
  p.weight_format = string_or(o, "weight_format", "");
  p.expert_format = string_or(o, "expert_format", "");
  const auto& s = object(field(o, "shape", what), what + ".shape");
  p.layers = integer(s, "layers", what);
  p.hidden = integer(s, "hidden", what);
  p.intermediate = integer(s, "intermediate", what);
  p.heads = integer(s, "heads", what);
  p.kv_heads = integer(s, "kv_heads", what);
  p.head_dim = integer(s, "head_dim", what);
  p.vocab = integer(s, "vocab", what);
  p.max_context = integer(s, "max_context", what);
  const auto& m = object(field(o, "moe", what), what + ".moe");
  p.experts = integer(m, "experts", what);
  p.top_k = integer(m, "top_k", what);
  p.moe_layers = integer(m, "moe_layers", what);
  p.moe_intermediate = integer(m, "moe_intermediate", what);
  p.expert_bytes = unsigned_integer(m, "expert_bytes", what);
  p.expert_payload_bytes = unsigned_integer(m, "expert_payload_bytes", what);
  p.expert_read_bytes = unsigned_integer(m, "expert_read_bytes", what);
  p.expert_staging_bytes = unsigned_integer(m, "expert_staging_bytes", what);
  p.expert_conversion_bytes = unsigned_integer(m, "expert_conversion_bytes", what);
  p.packed_experts = boolean(m, "packed_experts", what);
  if (m.contains("shared_intermediate")) p.shared_intermediate = integer(m, "shared_intermediate", what);
  if (m.contains("read_extents")) {
    const auto* values = m.at("read_extents").if_array();
    if (!values) throw std::runtime_error(what + ".moe.read_extents: must be an array of byte counts");
    for (auto& v : *values) {
      const int64_t* n = v.if_int64();
      const uint64_t* u = v.if_uint64();
      const uint64_t bytes = u ? *u : n && *n > 0 ? uint64_t(*n) : 0;
      if (bytes == 0) throw std::runtime_error(what + ".moe.read_extents: values must be integers > 0");
      p.expert_read_extents.push_back(bytes);
    }
  }
  if (o.contains("load_scratch_bytes")) p.load_scratch_bytes = unsigned_integer(o, "load_scratch_bytes", what);
  if (o.contains("runtime_scratch")) {
    const auto& r = object(field(o, "runtime_scratch", what), what + ".runtime_scratch");
    // A MoE model measured before the prefill lanes (no lane_row_bytes) left their outputs out of its row bytes:
    // that measurement is dropped, and the planner estimates the scratch from the shape instead.
    if (r.contains("lane_row_bytes") || !p.moe()) {
      p.scratch_row_bytes = unsigned_integer(r, "row_bytes", what);
      p.scratch_fixed_bytes = unsigned_integer(r, "fixed_bytes", what);
      if (r.contains("lane_row_bytes")) p.lane_row_bytes = unsigned_integer(r, "lane_row_bytes", what);
      if (r.contains("thread_bytes")) p.scratch_thread_bytes = unsigned_integer(r, "thread_bytes", what);
    }
  }
  // Optional per-layer lists of integers >= 0, one entry per layer.
  auto per_layer = [&](const char* key, std::vector<int64_t>& out) {
    if (!o.contains(key)) return;
    const auto* values = o.at(key).if_array();
    if (!values || int64_t(values->size()) != p.layers)
      throw std::runtime_error(what + "." + key + ": must list one value per layer");
    for (auto& v : *values) {
      const auto* n = v.if_int64();
      if (!n || *n < 0) throw std::runtime_error(what + "." + key + ": values must be integers >= 0");
      out.push_back(*n);
    }
  };
  per_layer("layer_windows", p.layer_windows);
  per_layer("layer_kv_heads", p.layer_kv_heads);
  per_layer("layer_head_dims", p.layer_head_dims);
  per_layer("layer_latent_floats", p.layer_latent_floats);
  if (o.contains("layer_recurrent_bytes")) {
    const auto* bytes = o.at("layer_recurrent_bytes").if_array();
    if (!bytes || int64_t(bytes->size()) != p.layers)
      throw std::runtime_error(what + ".layer_recurrent_bytes: must list one size per layer");
    for (auto& b : *bytes) {
      if (const auto* u = b.if_uint64()) {
        p.layer_recurrent_bytes.push_back(*u);
        continue;
      }
      const auto* n = b.if_int64();
      if (!n || *n < 0) throw std::runtime_error(what + ".layer_recurrent_bytes: sizes must be integers >= 0");
      p.layer_recurrent_bytes.push_back(uint64_t(*n));
    }
  }
  if (o.contains("kv_quality")) {
    const auto& q = object(field(o, "kv_quality", what), what + ".kv_quality");
    p.kv_quality_tokens = integer(q, "tokens", what + ".kv_quality");
    // Revision 1 where none is stored (profiles written before codecs had revisions).
    const bj::object* revisions =
        q.contains("revisions") ? &object(q.at("revisions"), what + ".kv_quality.revisions") : nullptr;
    for (auto& [codec, increase] : object(field(q, "perplexity_increase", what), what + ".kv_quality.perplexity_increase")) {
      const kv::Codec c = kv::parse_codec(std::string(codec));  // throws on an unknown codec name
      const double* d = increase.if_double();
      const int64_t* i = increase.if_int64();
      if (!d && !i) throw std::runtime_error(what + ".kv_quality.perplexity_increase: values must be numbers");
      const std::string name(codec);
      const int64_t revision =
          revisions && revisions->contains(name) ? integer(*revisions, name.c_str(), what + ".kv_quality.revisions") : 1;
      if (revision != kv::codec_revision(c)) continue;  // measured on other numerics: as if not measured
      p.kv_perplexity_increase[std::string(codec)] = d ? *d : double(*i);
    }
  }
  if (o.contains("timings"))
    for (auto& t : array(o, "timings", what)) {
      const auto& to = object(t, what + ".timings[]");
      ModelTiming x;
      x.threads = int(integer(to, "threads", what));
      x.step_seconds = number(to, "step_seconds", what);
      x.expert_seconds = number(to, "expert_seconds", what);
      x.router_seconds = number(to, "router_seconds", what);
      x.miss_seconds = number(to, "miss_seconds", what);
      x.miss_batch_seconds = number(to, "miss_batch_seconds", what);
      p.timings.push_back(x);
    }
  if (o.contains("prefill_gemms"))  // optional: profiles written before the shape probe lack it
    for (auto& g : array(o, "prefill_gemms", what)) {
      const std::string at = what + ".prefill_gemms[]";
      const auto& go = object(g, at);
      PrefillGemm x;
      x.kind = string(go, "kind", at);
      x.format = string(go, "format", at);
      x.out = integer(go, "out", at);
      x.in = integer(go, "in", at);
      x.threads = int(integer(go, "threads", at));
      for (auto& r : array(go, "rows", at)) x.rows.push_back(integer_value(r, at + ".rows"));
      for (auto& f : array(go, "gflops", at)) x.gflops.push_back(number_value(f, at + ".gflops"));
      if (x.rows.size() != x.gflops.size() || x.rows.empty())
        throw std::runtime_error(at + ": rows and gflops must be non-empty and of one length");
      p.prefill.gemms.push_back(std::move(x));
    }
  if (o.contains("prefill_row_seconds")) {  // optional, as prefill_gemms
    const auto& r = object(field(o, "prefill_row_seconds", what), what + ".prefill_row_seconds");
    p.prefill.gate_seconds = number(r, "gate", what + ".prefill_row_seconds");
    p.prefill.row_seconds = number(r, "row", what + ".prefill_row_seconds");
  }
  if (o.contains("prefill_attention")) {  // optional, as prefill_gemms
    const std::string at = what + ".prefill_attention";
    const auto& r = object(field(o, "prefill_attention", what), at);
    p.prefill.attention_seconds = number(r, "seconds", at);
    p.prefill.attention_threads = int(integer(r, "threads", at));
    p.prefill.attention_codec = string(r, "codec", at);
    if (!(p.prefill.attention_seconds > 0) || p.prefill.attention_threads <= 0)
      throw std::runtime_error(at + ": seconds and threads must be positive");
  }
  if (o.contains("prefill_experts")) {  // optional, as prefill_gemms
    const std::string at = what + ".prefill_experts";
    const auto& r = object(field(o, "prefill_experts", what), at);
    p.prefill.expert_gflops = number(r, "gflops", at);
    p.prefill.expert_threads = int(integer(r, "threads", at));
    p.prefill.expert_rows = integer(r, "rows", at);
    p.prefill.expert_format = string(r, "format", at);
    if (!(p.prefill.expert_gflops > 0) || p.prefill.expert_threads <= 0 || p.prefill.expert_rows <= 0)
      throw std::runtime_error(at + ": gflops, threads and rows must be positive");
  }
  for (auto& c : array(o, "weight_classes", what)) {
    const auto& co = object(c, what + ".weight_classes[]");
    p.classes.push_back({string(co, "name", what), unsigned_integer(co, "bytes", what),
                         unsigned_integer(co, "read_per_token", what)});
  }
  for (auto& row : array(o, "expert_frequency", what)) {
    if (!row.is_array()) throw std::runtime_error(what + ": expert_frequency rows must be arrays");
    std::vector<double> r;
    for (auto& f : row.get_array()) r.push_back(f.is_double() ? f.get_double() : f.is_int64() ? double(f.get_int64()) : 0.0);
    if (int64_t(r.size()) != p.experts) throw std::runtime_error(what + ": expert_frequency row length != experts");
    p.expert_frequency.push_back(std::move(r));
  }
  if (p.moe() && int64_t(p.expert_frequency.size()) != p.moe_layers)
    throw std::runtime_error(what + ": expert_frequency must have one row per MoE layer");
  p.frequency_source = string_or(o, "frequency_source", "");
  p.traced_prompts = integer(o, "traced_prompts", what);
  p.traced_tokens = integer(o, "traced_tokens", what);
  if (o.contains("router_trace")) {
    const auto* ids = o.at("router_trace").if_array();
    const int64_t per_token = p.moe_layers * p.top_k;
    if (!ids || per_token <= 0 || int64_t(ids->size()) % per_token != 0)
      throw std::runtime_error(what + ".router_trace: must hold moe_layers x top_k expert ids per token");
    for (auto& v : *ids) {
      const int64_t* e = v.if_int64();
      if (!e || *e < 0 || *e >= p.experts) throw std::runtime_error(what + ".router_trace: expert ids out of range");
      p.trace_selections.push_back(int32_t(*e));
    }
  }
  return p;
}

}  // namespace tierlm::calibrate
