// tiering/expert_store.h — where every expert's bytes live on disk and how they become a cache slot.
// Three encodings:
//   packed  a `tierlm pack` file: each expert is one 4 KiB aligned block already in the slot layout (one read,
//           no conversion);
//   dense   per-expert f32/f16/bf16 tensors in the model's safetensors (gate, up, down: three extents);
//   mlx     MLX affine tensors (weight/scales/biases of gate, up, down: nine extents), per expert or sliced out of
//           MLX's stacked switch_mlp tensors [experts, rows, ...] (each expert's slice is contiguous).
//   transposed  gpt-oss's f32/f16/bf16 experts: gate_up [H, 2I] and down [I, H] as `x @ W` stores them, then the
//           gate_up and down output biases (four extents); finish() transposes into the slot's row-major matrices
//           (gate/up rows stay interleaved) and keeps the biases in f32 (ExpertLayout::row_biases).
//   mxfp4   gpt-oss's MXFP4 experts: gate_up blocks, scales, down blocks, scales, then the two output biases (six
//           extents; per expert slices of *_blocks [E, rows, cols/32, 16] and *_scales [E, rows, cols/32]); the
//           blocks and scales land in an mxfp4 slot unchanged (4.25 bits per weight), or are widened for another
//           slot format.
//   mlx_gpt_oss  gpt-oss experts as mlx-lm writes them (its sanitize splits gate_up's interleaved rows apart):
//           gate, up and down as MLX modules sliced out of mlp.experts.{gate,up,down}_proj [E, rows, ...], mxfp4
//           (weight, scales: six extents) or affine (weight, scales, biases: nine), then their float output biases
//           gate.bias, up.bias, down.bias; finish() interleaves gate and up rows again (even rows gate, the gpt-oss
//           forward's order) into an mxfp4 or mlx_q4/mlx_q8 slot and keeps the biases in f32.
// For dense and mlx the reads cover 4 KiB aligned ranges into a staging block, then finish() converts them into the
// slot format: dense through kernels::make_weight, mlx repacked straight into the slot by kernels::pack_mlx_rows.
// Owns: extents, file list, slot layout. Never: read files itself (ExpertReader does), or allocate slots.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "tiering/expert_layout.h"
#include "tiering/expert_reader.h"
#include "tiering/ledger.h"

namespace tierlm::kernels {
class ThreadPool;
}

namespace tierlm::tiering {

// dense: per projection one extent of source_type elements; mlx: weight, scales, biases per projection; fp8_blocks:
// float8_e4m3fn weight and its f32 weight_scale_inv (one per 128x128 block) per projection, dequantized at a miss.
enum class ExpertEncoding : uint8_t { packed, dense, mlx, transposed, mxfp4, fp8_blocks, mlx_gpt_oss };

struct Extent {
  int32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

class ExpertStore {
 public:
  // A store over safetensors (dense or mlx). extents[layer * experts + expert] lists, in order, gate, up, down
  // (dense) or gate.{weight,scales,biases}, up.{...}, down.{...} (mlx). source_type is the dense element type, or
  // the MLX scale type. slot is the in-memory layout the cache holds.
  ExpertStore(std::vector<std::string> files, int64_t layers, int64_t experts, ExpertEncoding encoding,
              kernels::SourceType source_type, ExpertLayout slot, std::vector<std::vector<Extent>> extents);
  // Opens a packed expert file written by write_packed_experts.
  static ExpertStore open_packed(const std::filesystem::path& path);

  int64_t layers() const { return layers_; }
  int64_t experts() const { return experts_; }
  ExpertEncoding encoding() const { return encoding_; }
  const ExpertLayout& layout() const { return slot_; }
  const std::vector<std::string>& files() const { return files_; }
  std::span<const Extent> extents(int64_t layer, int64_t expert) const;

  // Staging bytes one in-flight fill needs (0 for packed: the read lands in the slot).
  uint64_t staging_bytes() const { return staging_bytes_; }
  // Scratch bytes finish() allocates while converting (charged by the cache as a reservation).
  uint64_t conversion_bytes() const;
  // Bytes one fill reads from disk (aligned), and the length of each of its reads in order (before the reader splits
  // them into blocks).
  uint64_t read_bytes(int64_t layer, int64_t expert) const;
  std::vector<uint64_t> read_lengths(int64_t layer, int64_t expert) const;
  // The reads that fill `slot` (packed) or `staging` (others).
  std::vector<ReadRequest> plan(int64_t layer, int64_t expert, void* slot, void* staging) const;
  // After the reads: converts staging into the slot; no-op for packed. Temporaries go through `scratch_ledger`.
  // `pool`: the calling thread's compute pool, idle meanwhile (not inside its parallel_for): the MLX repack is split
  // over it by panels (the same bytes as alone). Other encodings convert on the calling thread.
  void finish(int64_t layer, int64_t expert, const void* staging, void* slot, Ledger& scratch_ledger,
              kernels::ThreadPool* pool = nullptr) const;
  // Below this slot size the repack stays on the calling thread (fork/join would cost more than it saves).
  static constexpr uint64_t kSplitConversionBytes = 1 << 20;

 private:
  std::vector<std::string> files_;
  int64_t layers_ = 0, experts_ = 0;
  ExpertEncoding encoding_ = ExpertEncoding::packed;
  kernels::SourceType source_type_ = kernels::SourceType::f32;
  ExpertLayout slot_;
  void finish_transposed(int64_t layer, int64_t expert, std::span<const Extent> ext, const LedgerBuffer& gate_up,
                         const LedgerBuffer& down, const LedgerBuffer& gate_up_bias, const LedgerBuffer& down_bias,
                         void* slot, Ledger& ledger) const;
  void finish_mxfp4(int64_t layer, int64_t expert, std::span<const Extent> ext,
                    const std::function<const std::byte*(size_t)>& staged_at,
                    const std::function<LedgerBuffer(size_t)>& gather, void* slot, Ledger& ledger) const;
  void finish_mlx_gpt_oss(int64_t layer, int64_t expert, std::span<const Extent> ext,
                          const std::function<const std::byte*(size_t)>& staged_at,
                          const std::function<LedgerBuffer(size_t)>& gather, void* slot, Ledger& ledger) const;
  void store_biases(const LedgerBuffer& gate_up_bias, const LedgerBuffer& down_bias, void* slot,
                    Ledger& ledger) const;

  std::vector<std::vector<Extent>> extents_;
  uint64_t staging_bytes_ = 0;
};

// The packed file: a 4 KiB header ("TIERLMX1", u32 JSON length, JSON describing shape and format), then
// layers * experts blocks of layout.bytes, expert (l, e) at header + (l * experts + e) * layout.bytes.
struct PackedHeader {
  int64_t layers = 0, experts = 0;
  ExpertLayout layout;
};
inline constexpr uint64_t kPackedHeaderBytes = 4096;
// Writes the file; fill(layer, expert, block) writes one expert's block (layout.bytes, zeroed beforehand).
// progress(done, total) after each expert.
void write_packed_experts(const std::filesystem::path& path, const PackedHeader& header,
                          const std::function<void(int64_t, int64_t, void*)>& fill,
                          const std::function<void(size_t, size_t)>& progress = {});
PackedHeader read_packed_header(const std::filesystem::path& path);

}  // namespace tierlm::tiering
