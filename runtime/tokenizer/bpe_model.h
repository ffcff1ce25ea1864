// BpeModel: HF's BPE model (vocab + ranked merges, byte_fallback <0xNN> tokens, unk with fuse_unk, ignore_merges,
// continuing_subword_prefix / end_of_word_suffix). Encodes one pre-tokenized piece at a time with a priority queue
// of candidate merges (lowest rank, then leftmost, first, as HF does) and caches piece -> ids.
#pragma once

#include <boost/json/fwd.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tierlm::tok::detail {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// Gaps allowed in the id numbering of a vocabulary (or of the added tokens after it) beyond its own size: tables are
// indexed by id, so a file must not make a few bytes claim billions of ids.
inline constexpr int64_t kMaxIdHoles = 1 << 16;

class BpeModel {
 public:
  // Builds from tokenizer.json's "model" object; throws TokenizerError naming `where`.
  BpeModel(const boost::json::value& json, const std::string& where);

  // Appends the ids of one piece to `out`.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when out of range
  int32_t size() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void merge_word(std::string_view piece, std::vector<int32_t>& out) const;
  std::optional<int32_t> symbol_id(std::string_view text) const;

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  std::array<int32_t, 256> byte_fallback_ids_{};
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;

  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace tierlm::tok::detail
