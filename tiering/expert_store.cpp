#include "tiering/expert_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "runtime/kernels/fp8.h"
#include "runtime/kernels/kernel_isa.h"
#include "runtime/kernels/mlx_repack.h"
#include "runtime/kernels/thread_pool.h"

namespace tierlm::tiering {

namespace json = boost::json;
using kernels::SourceType;
using kernels::WeightFormat;

namespace {

size_t element_size(SourceType t) { return t == SourceType::f32 ? 4 : 2; }

// Where extent i's bytes land in the staging block, and the aligned range read for it.
struct StagedExtent {
  uint64_t read_offset, read_length, staging_offset, data_offset;
};

std::vector<StagedExtent> stage(std::span<const Extent> extents) {
  std::vector<StagedExtent> out;
  uint64_t pos = 0;
  for (const Extent& e : extents) {
    const uint64_t begin = align_down(e.offset, kIoAlignment), end = align_up(e.offset + e.length, kIoAlignment);
    out.push_back({begin, end - begin, pos, pos + (e.offset - begin)});
    pos += end - begin;
  }
  return out;
}

const char* source_name(SourceType t) {
  return t == SourceType::f32 ? "f32" : t == SourceType::f16 ? "f16" : "bf16";
}
SourceType parse_source(const std::string& s) {
  if (s == "f32") return SourceType::f32;
  if (s == "f16") return SourceType::f16;
  if (s == "bf16") return SourceType::bf16;
  throw ReaderError("packed expert file: unknown scale type '" + s + "'");
}
WeightFormat parse_slot_format(const std::string& s) {
  for (WeightFormat f : {WeightFormat::f32, WeightFormat::f16, WeightFormat::bf16, WeightFormat::q8_0, WeightFormat::q4,
                         WeightFormat::mlx_q4, WeightFormat::mlx_q8, WeightFormat::mxfp4})
    if (s == kernels::format_name(f)) return f;
  throw ReaderError("packed expert file: unknown format '" + s + "'");
}

}  // namespace

ExpertStore::ExpertStore(std::vector<std::string> files, int64_t layers, int64_t experts, ExpertEncoding encoding,
                         SourceType source_type, ExpertLayout slot, std::vector<std::vector<Extent>> extents)
    : files_(std::move(files)), layers_(layers), experts_(experts), encoding_(encoding), source_type_(source_type),
      slot_(slot), extents_(std::move(extents)) {
  if (layers_ <= 0 || experts_ <= 0) throw std::invalid_argument("expert store: no experts");
  if (int64_t(extents_.size()) != layers_ * experts_)
    throw std::invalid_argument("expert store: extents do not cover every expert");
  const size_t want = encoding_ == ExpertEncoding::packed       ? 1
                      : encoding_ == ExpertEncoding::dense      ? 3
                      : encoding_ == ExpertEncoding::transposed ? 4
                      : encoding_ == ExpertEncoding::mxfp4      ? 6
                      : encoding_ == ExpertEncoding::fp8_blocks ? 6
                      : encoding_ == ExpertEncoding::mlx_gpt_oss
                          ? (slot_.format == kernels::WeightFormat::mxfp4 ? 9 : 12)
                          : 9;
  for (auto& e : extents_) {
    if (e.size() != want) throw std::invalid_argument("expert store: wrong number of extents for the encoding");
    for (const Extent& x : e)
      if (x.file < 0 || size_t(x.file) >= files_.size()) throw std::invalid_argument("expert store: bad file index");
    if (encoding_ != ExpertEncoding::packed) {
      const auto staged = stage(e);
      staging_bytes_ = std::max(staging_bytes_, staged.back().staging_offset + staged.back().read_length);
    }
  }
}

std::span<const Extent> ExpertStore::extents(int64_t layer, int64_t expert) const {
  return extents_.at(size_t(layer * experts_ + expert));
}

uint64_t ExpertStore::conversion_bytes() const {
  if (encoding_ == ExpertEncoding::packed) return 0;
  // Contiguous copies of the sources plus the converted weights before they are copied into the slot.
  // transposed: also the transposed copies (as large as the sources) and the two f32 bias rows.
  if (encoding_ == ExpertEncoding::transposed) return 2 * staging_bytes_ + slot_.bytes + 8 * 64;
  // mxfp4 into an mxfp4 slot: the blocks and scales are copied from staging straight into the slot (finish_mxfp4),
  // so only store_biases' temporaries remain: the two bias extents gathered, then as f32 rows. Into another slot
  // format: the copies, the weights (widened to f32 rows and converted), the bias rows.
  if (encoding_ == ExpertEncoding::mxfp4) {
    const uint64_t bias_values = uint64_t(2 * slot_.intermediate + slot_.hidden);
    const uint64_t biases = bias_values * (element_size(source_type_) + sizeof(float));
    if (slot_.format == kernels::WeightFormat::mxfp4) return biases;
    return 2 * staging_bytes_ + slot_.bytes + uint64_t(3 * slot_.hidden * slot_.intermediate) * 4 + 12 * 64;
  }
  if (encoding_ == ExpertEncoding::mlx) return 0;  // repacked from staging straight into the slot
  if (encoding_ == ExpertEncoding::mlx_gpt_oss) {
    // The three bias extents gathered and widened to f32, the interleaved gate/up bias row; affine: gate and up's
    // words, scales and biases interleaved row by row before they are repacked (mxfp4 rows go straight in).
    const uint64_t bias_values = uint64_t(2 * slot_.intermediate + slot_.hidden);
    uint64_t bytes = bias_values * (element_size(source_type_) + sizeof(float)) +
                     uint64_t(2 * slot_.intermediate) * sizeof(float) + 8 * 64;
    if (slot_.format != kernels::WeightFormat::mxfp4)
      bytes += uint64_t(2 * slot_.intermediate) *
                   (uint64_t(slot_.hidden * slot_.bits / 8) +
                    2 * uint64_t(slot_.hidden / slot_.group_size) * element_size(source_type_)) +
               3 * 64;
    return bytes;
  }
  return staging_bytes_ + slot_.bytes + 6 * 64;
}

uint64_t ExpertStore::read_bytes(int64_t layer, int64_t expert) const {
  uint64_t total = 0;
  for (uint64_t length : read_lengths(layer, expert)) total += length;
  return total;
}

std::vector<uint64_t> ExpertStore::read_lengths(int64_t layer, int64_t expert) const {
  if (encoding_ == ExpertEncoding::packed) return {slot_.bytes};
  std::vector<uint64_t> lengths;
  for (const StagedExtent& s : stage(extents(layer, expert))) lengths.push_back(s.read_length);
  return lengths;
}

std::vector<ReadRequest> ExpertStore::plan(int64_t layer, int64_t expert, void* slot, void* staging) const {
  std::vector<ReadRequest> reads;
  const auto ext = extents(layer, expert);
  if (encoding_ == ExpertEncoding::packed) {
    reads.push_back({ext[0].file, ext[0].offset, slot_.bytes, slot});
    return reads;
  }
  const auto staged = stage(ext);
  for (size_t i = 0; i < ext.size(); ++i)
    reads.push_back({ext[i].file, staged[i].read_offset, staged[i].read_length,
                     static_cast<std::byte*>(staging) + staged[i].staging_offset});
  return reads;
}

void ExpertStore::finish(int64_t layer, int64_t expert, const void* staging, void* slot, Ledger& ledger,
                         kernels::ThreadPool* pool) const {
  if (encoding_ == ExpertEncoding::packed) return;
  const auto ext = extents(layer, expert);
  const auto staged = stage(ext);
  const auto* base = static_cast<const std::byte*>(staging);
  const int64_t H = slot_.hidden, I = slot_.intermediate;
  // Gathers extents [first, first + count) (one row block each) contiguously into a fresh scratch buffer.
  auto gather = [&](std::initializer_list<size_t> which) {
    uint64_t bytes = 0;
    for (size_t i : which) bytes += ext[i].length;
    LedgerBuffer buf(ledger, accounts::scratch, bytes);
    uint64_t pos = 0;
    for (size_t i : which) {
      std::memcpy(buf.as<std::byte>() + pos, base + staged[i].data_offset, ext[i].length);
      pos += ext[i].length;
    }
    return buf;
  };
  if (encoding_ == ExpertEncoding::dense) {
    const uint64_t es = element_size(source_type_);
    if (ext[0].length != uint64_t(I * H) * es || ext[1].length != ext[0].length || ext[2].length != ext[0].length)
      throw ReaderError(fmt::format("expert {}.{}: tensor sizes do not match the expert shape", layer, expert));
    LedgerBuffer gate_up = gather({0, 1}), down = gather({2});
    kernels::Weight gu = kernels::make_weight(gate_up.data(), source_type_, 2 * I, H, slot_.format, ledger,
                                              accounts::scratch);
    kernels::Weight d = kernels::make_weight(down.data(), source_type_, H, I, slot_.format, ledger, accounts::scratch);
    slot_.store(gu, d, slot);
    return;
  }
  if (encoding_ == ExpertEncoding::fp8_blocks) {
    // [gate, gate scale_inv, up, up scale_inv, down, down scale_inv]: each dequantized into f32, then the slot's
    // format.
    auto dequantize = [&](size_t weight, int64_t rows, int64_t cols, float* out) {
      const int64_t grid = ((rows + 127) / 128) * ((cols + 127) / 128);
      if (ext[weight].length != uint64_t(rows * cols) || ext[weight + 1].length != uint64_t(grid) * sizeof(float))
        throw ReaderError(fmt::format("expert {}.{}: FP8 tensor sizes do not match the expert shape", layer, expert));
      LedgerBuffer q = gather({weight}), scale = gather({weight + 1});
      kernels::dequantize_fp8_blocks(q.as<uint8_t>(), scale.as<float>(), rows, cols, out);
    };
    LedgerBuffer gate_up(ledger, accounts::scratch, size_t(2 * I * H) * sizeof(float));
    LedgerBuffer down(ledger, accounts::scratch, size_t(H * I) * sizeof(float));
    dequantize(0, I, H, gate_up.as<float>());
    dequantize(2, I, H, gate_up.as<float>() + I * H);
    dequantize(4, H, I, down.as<float>());
    kernels::Weight gu = kernels::make_weight(gate_up.data(), kernels::SourceType::f32, 2 * I, H, slot_.format, ledger,
                                              accounts::scratch);
    kernels::Weight d = kernels::make_weight(down.data(), kernels::SourceType::f32, H, I, slot_.format, ledger,
                                             accounts::scratch);
    slot_.store(gu, d, slot);
    return;
  }
  if (encoding_ == ExpertEncoding::mxfp4) {
    finish_mxfp4(layer, expert, ext, [&](size_t i) { return base + staged[i].data_offset; },
                 [&](size_t i) { return gather({i}); }, slot, ledger);
    return;
  }
  if (encoding_ == ExpertEncoding::mlx_gpt_oss) {
    finish_mlx_gpt_oss(layer, expert, ext, [&](size_t i) { return base + staged[i].data_offset; },
                       [&](size_t i) { return gather({i}); }, slot, ledger);
    return;
  }
  if (encoding_ == ExpertEncoding::transposed) {
    finish_transposed(layer, expert, ext, gather({0}), gather({1}), gather({2}), gather({3}), slot, ledger);
    return;
  }
  // MLX: the nine extents are repacked from the staging block straight into the slot (no scratch, no copies):
  // gate then up into gate_up's panels (I is a multiple of the group size, so of the 16-row panel), down into down's.
  const int bits = slot_.bits, group = slot_.group_size;
  const uint64_t scale_bytes = source_type_ == SourceType::f32 ? 4 : 2;
  const uint64_t gate_words = uint64_t(I * H * bits / 8), gate_scales = uint64_t(I * (H / group)) * scale_bytes;
  const uint64_t down_words = uint64_t(H * I * bits / 8), down_scales = uint64_t(H * (I / group)) * scale_bytes;
  const uint64_t want[9] = {gate_words, gate_scales, gate_scales, gate_words,  gate_scales,
                            gate_scales, down_words, down_scales, down_scales};
  for (size_t i = 0; i < 9; ++i)
    if (ext[i].length != want[i])
      throw ReaderError(fmt::format("expert {}.{}: MLX tensor sizes do not match the expert shape", layer, expert));
  auto source = [&](size_t i) { return base + staged[i].data_offset; };
  auto part = [&](int i) { return static_cast<std::byte*>(slot) + slot_.parts[i].offset; };
  struct Piece {
    const std::byte *words, *scales, *biases;
    int64_t rows, cols;
    kernels::MlxPackTarget target;
  };
  const Piece pieces[3] = {{source(0), source(1), source(2), I, H, {part(0), part(1), part(2), 2 * I, 0}},
                           {source(3), source(4), source(5), I, H, {part(0), part(1), part(2), 2 * I, I}},
                           {source(6), source(7), source(8), H, I, {part(3), part(4), part(5), H, 0}}};
  // Rows [r0, r1) of a piece (r0 on a panel; r1 on one or the piece's end): independent of every other range.
  auto pack = [&](const Piece& p, int64_t r0, int64_t r1) {
    const uint64_t group_bytes = uint64_t(p.cols / group) * scale_bytes;
    kernels::MlxPackTarget t = p.target;
    t.first_row += r0;
    kernels::pack_mlx_rows(p.words + uint64_t(r0 * p.cols * bits / 8), p.scales + uint64_t(r0) * group_bytes,
                           p.biases + uint64_t(r0) * group_bytes, source_type_, r1 - r0, p.cols, group, bits, t);
  };
  constexpr int64_t P = kernels::kPanelRows;
  if (!pool || pool->size() <= 1 || I % P != 0 || slot_.bytes < kSplitConversionBytes) {
    for (const Piece& p : pieces) pack(p, 0, p.rows);
    return;
  }
  // The three pieces' panels numbered one after another, split over the pool: a 2.7 MB Qwen3-30B-A3B expert took
  // ~1.5 ms on one core, the whole decode step's stall at 8 GiB when 30 experts a token miss.
  const int64_t panels[3] = {I / P, I / P, (H + P - 1) / P};
  pool->parallel_for(panels[0] + panels[1] + panels[2], [&](int64_t begin, int64_t end, int) {
    int64_t first = 0;
    for (int i = 0; i < 3; ++i) {
      const int64_t b = std::max(begin, first), e = std::min(end, first + panels[i]);
      if (b < e) pack(pieces[i], (b - first) * P, std::min((e - first) * P, pieces[i].rows));
      first += panels[i];
    }
  });
}

void ExpertStore::finish_transposed(int64_t layer, int64_t expert, std::span<const Extent> ext,
                                    const LedgerBuffer& gate_up, const LedgerBuffer& down,
                                    const LedgerBuffer& gate_up_bias, const LedgerBuffer& down_bias, void* slot,
                                    Ledger& ledger) const {
  const int64_t H = slot_.hidden, I = slot_.intermediate;
  const uint64_t es = element_size(source_type_);
  if (ext[0].length != uint64_t(2 * I * H) * es || ext[1].length != uint64_t(I * H) * es ||
      ext[2].length != uint64_t(2 * I) * es || ext[3].length != uint64_t(H) * es)
    throw ReaderError(fmt::format("expert {}.{}: tensor sizes do not match the expert shape", layer, expert));
  // [rows, cols] of `x @ W` storage -> [cols, rows] row-major, element by element in the source type.
  auto transpose = [&](const LedgerBuffer& src, int64_t rows, int64_t cols) {
    LedgerBuffer out(ledger, accounts::scratch, src.size());
    const auto* from = src.as<std::byte>();
    auto* to = out.as<std::byte>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) std::memcpy(to + (c * rows + r) * es, from + (r * cols + c) * es, es);
    return out;
  };
  const LedgerBuffer gu_rows = transpose(gate_up, H, 2 * I), down_rows = transpose(down, I, H);
  kernels::Weight gu = kernels::make_weight(gu_rows.data(), source_type_, 2 * I, H, slot_.format, ledger,
                                            accounts::scratch);
  kernels::Weight d = kernels::make_weight(down_rows.data(), source_type_, H, I, slot_.format, ledger,
                                           accounts::scratch);
  slot_.store(gu, d, slot);
  store_biases(gate_up_bias, down_bias, slot, ledger);
}

void ExpertStore::finish_mxfp4(int64_t layer, int64_t expert, std::span<const Extent> ext,
                               const std::function<const std::byte*(size_t)>& staged_at,
                               const std::function<LedgerBuffer(size_t)>& gather, void* slot, Ledger& ledger) const {
  const int64_t H = slot_.hidden, I = slot_.intermediate;
  const uint64_t es = element_size(source_type_);
  if (ext[0].length != uint64_t(2 * I * H / 2) || ext[1].length != uint64_t(2 * I * H / 32) ||
      ext[2].length != uint64_t(H * I / 2) || ext[3].length != uint64_t(H * I / 32) ||
      ext[4].length != uint64_t(2 * I) * es || ext[5].length != uint64_t(H) * es)
    throw ReaderError(fmt::format("expert {}.{}: MXFP4 tensor sizes do not match the expert shape", layer, expert));
  if (slot_.format == kernels::WeightFormat::mxfp4) {
    // The slot keeps the blocks and scales as stored (ExpertLayout's mxfp4 parts), so the staged bytes go straight
    // into it: no gathered copies, no fresh scratch buffers per miss (bench/results/gptoss20b.md: those copies were
    // 17% of a gpt-oss-20b decode's CPU).
    const size_t part_of[4] = {0, 1, 3, 4};  // gate_up data, gate_up scales, down data, down scales
    for (size_t i = 0; i < 4; ++i) {
      const ExpertLayout::Part& part = slot_.parts[part_of[i]];
      if (part.bytes != ext[i].length)
        throw std::logic_error(fmt::format("expert {}.{}: MXFP4 slot part {} holds {} bytes, the tensor {}", layer,
                                           expert, part_of[i], part.bytes, ext[i].length));
      std::memcpy(static_cast<std::byte*>(slot) + part.offset, staged_at(i), part.bytes);
    }
    store_biases(gather(4), gather(5), slot, ledger);
    return;
  }
  // Another slot format (asked for by --expert-format or pack): widen to f32 rows, then convert.
  const LedgerBuffer gu_blocks = gather(0), gu_scales = gather(1), d_blocks = gather(2), d_scales = gather(3);
  kernels::Weight gu = kernels::make_mxfp4_weight(gu_blocks.data(), gu_scales.data(), 2 * I, H, ledger,
                                                  accounts::scratch);
  kernels::Weight d = kernels::make_mxfp4_weight(d_blocks.data(), d_scales.data(), H, I, ledger, accounts::scratch);
  auto widen = [&](const kernels::Weight& w) {
    LedgerBuffer rows(ledger, accounts::scratch, size_t(w.view.rows * w.view.cols) * sizeof(float));
    for (int64_t r = 0; r < w.view.rows; ++r) kernels::dequantize_row(w.view, r, rows.as<float>() + r * w.view.cols);
    return kernels::make_weight(rows.data(), SourceType::f32, w.view.rows, w.view.cols, slot_.format, ledger,
                                accounts::scratch);
  };
  slot_.store(widen(gu), widen(d), slot);
  store_biases(gather(4), gather(5), slot, ledger);
}

void ExpertStore::finish_mlx_gpt_oss(int64_t layer, int64_t expert, std::span<const Extent> ext,
                                     const std::function<const std::byte*(size_t)>& staged_at,
                                     const std::function<LedgerBuffer(size_t)>& gather, void* slot,
                                     Ledger& ledger) const {
  const int64_t H = slot_.hidden, I = slot_.intermediate;
  const bool fp4 = slot_.format == WeightFormat::mxfp4;
  const size_t per = fp4 ? 2 : 3;  // extents per projection; the biases follow the three projections
  const uint64_t es = element_size(source_type_);
  // Bytes of one row of each part, for a row of `cols` inputs: words, scales (and affine biases).
  auto row_bytes = [&](int64_t cols) {
    return fp4 ? std::vector<uint64_t>{uint64_t(cols / 2), uint64_t(cols / 32)}
               : std::vector<uint64_t>{uint64_t(cols * slot_.bits / 8), uint64_t(cols / slot_.group_size) * es,
                                       uint64_t(cols / slot_.group_size) * es};
  };
  const std::vector<uint64_t> gate_row = row_bytes(H), down_row = row_bytes(I);
  bool sizes_ok = ext[3 * per].length == uint64_t(I) * es && ext[3 * per + 1].length == uint64_t(I) * es &&
                  ext[3 * per + 2].length == uint64_t(H) * es;
  for (size_t k = 0; k < per; ++k)
    sizes_ok = sizes_ok && ext[k].length == uint64_t(I) * gate_row[k] && ext[per + k].length == ext[k].length &&
               ext[2 * per + k].length == uint64_t(H) * down_row[k];
  if (!sizes_ok)
    throw ReaderError(fmt::format("expert {}.{}: MLX gpt-oss tensor sizes do not match the expert shape", layer,
                                  expert));
  // Gate row j and up row j of part k, one after the other (the gate_up matrix's rows 2j and 2j + 1), into `to`.
  auto interleave = [&](size_t k, std::byte* to) {
    const std::byte* gate = staged_at(k);
    const std::byte* up = staged_at(per + k);
    const uint64_t n = gate_row[k];
    for (int64_t j = 0; j < I; ++j) {
      std::memcpy(to + uint64_t(2 * j) * n, gate + uint64_t(j) * n, n);
      std::memcpy(to + uint64_t(2 * j + 1) * n, up + uint64_t(j) * n, n);
    }
  };
  auto part = [&](int i) { return static_cast<std::byte*>(slot) + slot_.parts[i].offset; };
  if (fp4) {
    // The slot's mxfp4 parts hold the codes and exponents as stored (ExpertLayout), gate_up's rows interleaved.
    interleave(0, part(0));
    interleave(1, part(1));
    std::memcpy(part(3), staged_at(2 * per), ext[2 * per].length);
    std::memcpy(part(4), staged_at(2 * per + 1), ext[2 * per + 1].length);
  } else {
    LedgerBuffer words(ledger, accounts::scratch, 2 * ext[0].length);
    LedgerBuffer scales(ledger, accounts::scratch, 2 * ext[1].length);
    LedgerBuffer biases(ledger, accounts::scratch, 2 * ext[2].length);
    interleave(0, words.as<std::byte>());
    interleave(1, scales.as<std::byte>());
    interleave(2, biases.as<std::byte>());
    kernels::pack_mlx_rows(words.data(), scales.data(), biases.data(), source_type_, 2 * I, H, slot_.group_size,
                           slot_.bits, {part(0), part(1), part(2), 2 * I, 0});
    kernels::pack_mlx_rows(staged_at(2 * per), staged_at(2 * per + 1), staged_at(2 * per + 2), source_type_, H, I,
                           slot_.group_size, slot_.bits, {part(3), part(4), part(5), H, 0});
  }
  // Output biases: gate's and up's interleaved like their rows, in f32.
  const LedgerBuffer gate_bias = gather(3 * per), up_bias = gather(3 * per + 1), down_bias = gather(3 * per + 2);
  auto widen = [&](const LedgerBuffer& b, int64_t n) {
    return kernels::make_weight(b.data(), source_type_, 1, n, WeightFormat::f32, ledger, accounts::scratch);
  };
  const kernels::Weight g = widen(gate_bias, I), u = widen(up_bias, I), d = widen(down_bias, H);
  LedgerBuffer gate_up(ledger, accounts::scratch, size_t(2 * I) * sizeof(float));
  for (int64_t j = 0; j < I; ++j) {
    gate_up.as<float>()[2 * j] = g.data.as<float>()[j];
    gate_up.as<float>()[2 * j + 1] = u.data.as<float>()[j];
  }
  slot_.store_row_biases(gate_up.as<float>(), d.data.as<float>(), slot);
}

// The experts' output biases as f32 (a one-row f32 weight is its values) into the slot's row-bias parts.
void ExpertStore::store_biases(const LedgerBuffer& gate_up_bias, const LedgerBuffer& down_bias, void* slot,
                               Ledger& ledger) const {
  const int64_t H = slot_.hidden, I = slot_.intermediate;
  const kernels::Weight gb = kernels::make_weight(gate_up_bias.data(), source_type_, 1, 2 * I,
                                                  kernels::WeightFormat::f32, ledger, accounts::scratch);
  const kernels::Weight db = kernels::make_weight(down_bias.data(), source_type_, 1, H, kernels::WeightFormat::f32,
                                                  ledger, accounts::scratch);
  slot_.store_row_biases(gb.data.as<float>(), db.data.as<float>(), slot);
}

// ---- packed file --------------------------------------------------------------------------------------------------

void write_packed_experts(const std::filesystem::path& path, const PackedHeader& h,
                          const std::function<void(int64_t, int64_t, void*)>& fill,
                          const std::function<void(size_t, size_t)>& progress) {
  const ExpertLayout& l = h.layout;
  json::object o;
  o["layers"] = h.layers;
  o["experts"] = h.experts;
  o["format"] = kernels::format_name(l.format);
  o["hidden"] = l.hidden;
  o["intermediate"] = l.intermediate;
  o["group_size"] = l.group_size;
  o["bits"] = l.bits;
  o["scale_type"] = source_name(l.scale_type);
  o["expert_bytes"] = l.bytes;
  if (l.row_biases) o["row_biases"] = true;
  const std::string text = json::serialize(o);
  if (text.size() + 12 > kPackedHeaderBytes) throw ReaderError("packed expert header too large");
  std::vector<char> header(kPackedHeaderBytes, 0);
  std::memcpy(header.data(), "TIERLMX1", 8);
  const uint32_t n = uint32_t(text.size());
  std::memcpy(header.data() + 8, &n, 4);
  std::memcpy(header.data() + 12, text.data(), text.size());

  const std::string tmp = path.string() + ".partial";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) throw ReaderError(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
  out.write(header.data(), std::streamsize(header.size()));
  // The block is plain heap memory: packing runs before any budget applies (it is an offline tool).
  std::vector<char> block(l.bytes);
  const size_t total = size_t(h.layers * h.experts);
  size_t done = 0;
  for (int64_t layer = 0; layer < h.layers; ++layer)
    for (int64_t e = 0; e < h.experts; ++e) {
      std::fill(block.begin(), block.end(), 0);
      fill(layer, e, block.data());
      out.write(block.data(), std::streamsize(block.size()));
      if (!out) throw ReaderError(fmt::format("{}: write failed (disk full?)", tmp));
      if (progress) progress(++done, total);
    }
  out.close();
  if (!out) throw ReaderError(fmt::format("{}: write failed", tmp));
  std::filesystem::rename(tmp, path);
}

PackedHeader read_packed_header(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ReaderError(fmt::format("{}: cannot open packed expert file", path.string()));
  std::vector<char> header(kPackedHeaderBytes, 0);
  in.read(header.data(), std::streamsize(header.size()));
  uint32_t n = 0;
  std::memcpy(&n, header.data() + 8, 4);
  if (in.gcount() != std::streamsize(header.size()) || std::memcmp(header.data(), "TIERLMX1", 8) != 0 ||
      n > kPackedHeaderBytes - 12)
    throw ReaderError(fmt::format("{}: not a tierlm packed expert file", path.string()));
  boost::system::error_code ec;
  json::value v = json::parse(std::string_view(header.data() + 12, n), ec);
  if (ec || !v.is_object()) throw ReaderError(fmt::format("{}: corrupt packed expert header", path.string()));
  try {
    const json::object& o = v.as_object();
    PackedHeader h;
    h.layers = o.at("layers").to_number<int64_t>();
    h.experts = o.at("experts").to_number<int64_t>();
    h.layout = ExpertLayout::make(parse_slot_format(std::string(o.at("format").as_string())),
                                  o.at("hidden").to_number<int64_t>(), o.at("intermediate").to_number<int64_t>(),
                                  o.at("group_size").to_number<int>(), o.at("bits").to_number<int>(),
                                  parse_source(std::string(o.at("scale_type").as_string())),
                                  o.contains("row_biases") && o.at("row_biases").as_bool());
    if (h.layout.bytes != o.at("expert_bytes").to_number<uint64_t>())
      throw ReaderError("expert block size disagrees with this build's layout");
    const uint64_t want = kPackedHeaderBytes + uint64_t(h.layers * h.experts) * h.layout.bytes;
    if (std::filesystem::file_size(path) < want)
      throw ReaderError(fmt::format("truncated: {} bytes, expected {}", std::filesystem::file_size(path), want));
    return h;
  } catch (const ReaderError& e) {
    throw ReaderError(fmt::format("{}: {}", path.string(), e.what()));
  } catch (const std::exception& e) {
    throw ReaderError(fmt::format("{}: bad packed expert header ({})", path.string(), e.what()));
  }
}

ExpertStore ExpertStore::open_packed(const std::filesystem::path& path) {
  const PackedHeader h = read_packed_header(path);
  std::vector<std::vector<Extent>> extents;
  for (int64_t i = 0; i < h.layers * h.experts; ++i)
    extents.push_back({{0, kPackedHeaderBytes + uint64_t(i) * h.layout.bytes, h.layout.bytes}});
  return ExpertStore({path.string()}, h.layers, h.experts, ExpertEncoding::packed, h.layout.scale_type, h.layout,
                     std::move(extents));
}

}  // namespace tierlm::tiering
