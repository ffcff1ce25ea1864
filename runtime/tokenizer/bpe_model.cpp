#include "runtime/tokenizer/bpe_model.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <queue>

#include "runtime/tokenizer/json_util.h"
#include "runtime/tokenizer/utf8.h"

namespace tierlm::tok::detail {

namespace {

// Pieces longer than this are encoded every time: they are rare and would only bloat the cache.
constexpr std::size_t kCacheMaxPieceBytes = 256;
constexpr std::size_t kCacheMaxEntries = 100000;

}  // namespace

BpeModel::BpeModel(const boost::json::value& json, const std::string& where) {
  const auto& o = json_object(json, where);
  if (const auto type = json_optional_string(o, "type", where); type && *type != "BPE")
    json_fail(where + ".type", "unsupported model type '" + *type + "' (only BPE)");
  if (const auto* dropout = json_find(o, "dropout"); dropout != nullptr && !(dropout->is_number() && dropout->to_number<double>() == 0.0))
    json_fail(where + ".dropout", "BPE dropout is not supported");

  const auto* vocab = json_find(o, "vocab");
  if (vocab == nullptr) json_fail(where, "missing 'vocab'");
  const auto& vocab_object = json_object(*vocab, where + ".vocab");
  vocab_.reserve(vocab_object.size());
  int64_t max_id = -1;
  for (const auto& entry : vocab_object) {
    const long long id = json_integer(entry.value(), where + ".vocab[\"" + std::string(entry.key()) + "\"]");
    if (id < 0 || id > INT32_MAX) json_fail(where + ".vocab", "id out of range for '" + std::string(entry.key()) + "'");
    vocab_.emplace(std::string(entry.key()), static_cast<int32_t>(id));
    max_id = std::max<int64_t>(max_id, id);
  }
  // Ids index a table, so they must be dense enough: real vocabularies number 0..N-1 (holes are rare and few).
  // Without this bound one entry with id 2^31-1 would allocate 64 GiB of empty names.
  const int64_t id_limit = 2 * static_cast<int64_t>(vocab_object.size()) + kMaxIdHoles;
  if (max_id >= id_limit)
    json_fail(where + ".vocab", "id " + std::to_string(max_id) + " is far beyond the vocabulary's " +
                                    std::to_string(vocab_object.size()) + " entries (ids must be below " +
                                    std::to_string(id_limit) + ")");
  id_to_token_.resize(static_cast<std::size_t>(max_id + 1));
  for (const auto& [token, id] : vocab_) id_to_token_[static_cast<std::size_t>(id)] = token;

  continuing_subword_prefix_ = json_optional_string(o, "continuing_subword_prefix", where).value_or("");
  end_of_word_suffix_ = json_optional_string(o, "end_of_word_suffix", where).value_or("");
  byte_fallback_ = json_bool(o, "byte_fallback", false, where);
  fuse_unk_ = json_bool(o, "fuse_unk", false, where);
  ignore_merges_ = json_bool(o, "ignore_merges", false, where);
  if (const auto unk = json_optional_string(o, "unk_token", where)) {
    const auto it = vocab_.find(*unk);
    if (it == vocab_.end()) json_fail(where + ".unk_token", "'" + *unk + "' is not in the vocab");
    unk_id_ = it->second;
  }
  byte_fallback_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (const auto it = vocab_.find(std::string_view(name)); it != vocab_.end()) byte_fallback_ids_[b] = it->second;
  }

  const auto* merges = json_find(o, "merges");
  if (merges == nullptr) json_fail(where, "missing 'merges'");
  const auto& merge_array = json_array(*merges, where + ".merges");
  merges_.reserve(merge_array.size());
  for (std::size_t rank = 0; rank < merge_array.size(); ++rank) {
    const std::string at = where + ".merges[" + std::to_string(rank) + "]";
    std::string left, right;
    if (merge_array[rank].is_string()) {
      const std::string_view line = merge_array[rank].get_string();
      const auto space = line.find(' ');
      if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
        json_fail(at, "expected \"left right\"");
      left = std::string(line.substr(0, space));
      right = std::string(line.substr(space + 1));
    } else {
      const auto& pair = json_array(merge_array[rank], at);
      if (pair.size() != 2) json_fail(at, "expected [left, right]");
      left = json_string(pair[0], at + "[0]");
      right = json_string(pair[1], at + "[1]");
    }
    const auto left_it = vocab_.find(left), right_it = vocab_.find(right);
    if (left_it == vocab_.end() || right_it == vocab_.end()) json_fail(at, "merge of a token not in the vocab");
    std::string merged = left;
    merged.append(right, std::min(continuing_subword_prefix_.size(), right.size()), std::string::npos);
    const auto merged_it = vocab_.find(merged);
    if (merged_it == vocab_.end()) json_fail(at, "merged token '" + merged + "' is not in the vocab");
    merges_.emplace(pair_key(left_it->second, right_it->second),
                    Merge{static_cast<int32_t>(rank), merged_it->second});
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= id_to_token_.size()) return nullptr;
  return &id_to_token_[static_cast<std::size_t>(id)];
}

std::optional<int32_t> BpeModel::symbol_id(std::string_view text) const {
  const auto it = vocab_.find(text);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (const auto id = symbol_id(piece)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = piece.size() <= kCacheMaxPieceBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    if (const auto it = cache_.find(piece); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheMaxEntries) cache_.emplace(std::string(piece), std::move(ids));
  }
}

void BpeModel::merge_word(std::string_view piece, std::vector<int32_t>& out) const {
  // Initial symbols: one per character (with HF's prefix/suffix rules), byte tokens or unk where the character is
  // not in the vocab.
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  bool previous_unk = false;
  std::string scratch;
  for (std::size_t pos = 0; pos < piece.size();) {
    const std::size_t begin = pos;
    pos += utf8_length(static_cast<unsigned char>(piece[pos]));
    if (pos > piece.size()) pos = piece.size();
    std::string_view character = piece.substr(begin, pos - begin);
    const bool first = begin == 0, last = pos == piece.size();
    if ((!first && !continuing_subword_prefix_.empty()) || (last && !end_of_word_suffix_.empty())) {
      scratch.clear();
      if (!first) scratch += continuing_subword_prefix_;
      scratch += character;
      if (last) scratch += end_of_word_suffix_;
      character = scratch;
    }
    if (const auto id = symbol_id(character)) {
      symbols.push_back(*id);
      previous_unk = false;
      continue;
    }
    const std::string_view raw = piece.substr(begin, pos - begin);
    if (byte_fallback_) {
      bool all = true;
      for (char c : raw) all = all && byte_fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : raw) symbols.push_back(byte_fallback_ids_[static_cast<unsigned char>(c)]);
        previous_unk = false;
        continue;
      }
    }
    if (unk_id_) {
      if (!(fuse_unk_ && previous_unk)) symbols.push_back(*unk_id_);
      previous_unk = true;
    }
  }
  if (symbols.size() <= 1) {
    out.insert(out.end(), symbols.begin(), symbols.end());
    return;
  }

  // Doubly linked symbols; a queue of candidate merges ordered by (rank, position). Stale candidates (a side
  // already merged away or changed) are skipped when popped.
  const auto n = static_cast<int32_t>(symbols.size());
  std::vector<int32_t> prev(symbols.size()), next(symbols.size());
  std::vector<bool> alive(symbols.size(), true);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int32_t left) {
    const int32_t right = next[left];
    if (right < 0) return;
    const auto it = merges_.find(pair_key(symbols[left], symbols[right]));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    if (!alive[top.pos]) continue;
    const int32_t right = next[top.pos];
    if (right < 0) continue;
    const auto it = merges_.find(pair_key(symbols[top.pos], symbols[right]));
    if (it == merges_.end() || it->second.new_id != top.new_id || it->second.rank != top.rank) continue;
    symbols[top.pos] = top.new_id;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) consider(prev[top.pos]);
    consider(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(symbols[i]);
}

}  // namespace tierlm::tok::detail
