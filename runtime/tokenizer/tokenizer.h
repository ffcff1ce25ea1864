// tierlm::tok — text <-> token ids, exact against Hugging Face `tokenizers` for the tokenizer.json files tierlm
// serves: byte-level BPE (Qwen3, Llama-3, DeepSeek-V3) and SentencePiece-style BPE with byte fallback (Gemma-3,
// Llama-2). Owns loading tokenizer.json (+ tokenizer_config.json / generation_config.json for BOS/EOS names),
// encoding (added tokens, normalizer, pre-tokenizer, BPE, post-processor) and decoding, including StreamDecoder for
// token-by-token output. Never truncates or pads, never tracks offsets, never aborts on user input: invalid UTF-8
// given to encode is first repaired (U+FFFD), unknown ids are dropped by decode as HF does.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tokenizer/tokenizer_error.h"

namespace tierlm::tok {

class Tokenizer {
 public:
  // `path` is a model directory holding tokenizer.json (and optionally tokenizer_config.json,
  // generation_config.json) or the tokenizer.json file itself. Throws TokenizerError naming the file and the
  // JSON path of anything malformed or unsupported.
  static Tokenizer load(const std::filesystem::path& path);

  // HF's Tokenizer.encode(text, add_special_tokens).ids. Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // HF's Tokenizer.decode(ids, skip_special_tokens). Thread-safe.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  int32_t token_to_id(std::string_view token) const;  // -1 when the token does not exist
  std::string id_to_token(int32_t id) const;           // "" when the id does not exist
  // The raw bytes one token stands for, where its decoded text would show U+FFFD for a character it ends or starts
  // in the middle of: byte-level symbols mapped back to bytes, a <0xNN> byte-fallback piece as its byte; any other
  // token its decoded text (special tokens included). "" for an unknown id.
  std::string token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;                   // an added token marked special
  // One past the largest id (model vocab and added tokens); embedding tables may be larger.
  int32_t vocab_size() const;
  // From tokenizer_config.json's bos_token / eos_token (plus generation_config.json's eos_token_id list).
  std::optional<int32_t> bos_id() const;
  std::vector<int32_t> eos_ids() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Turns ids arriving one at a time into text pieces that are always whole UTF-8 characters: a token that ends in
// the middle of a multi-byte character is held back until the rest arrives (HF's DecodeStream rule: hold while the
// decoded tail ends in U+FFFD). flush() returns whatever is held, invalid bytes as U+FFFD. Concatenating every
// step() and the final flush() gives decode(all ids), except where a later byte-fallback token makes an already
// emitted run invalid (decode() would turn the whole run into U+FFFDs; HF's DecodeStream raises an error): the
// stream never retracts text, and decodes the new tokens on their own. Not thread-safe; one per sequence.
class StreamDecoder {
 public:
  explicit StreamDecoder(Tokenizer tokenizer, bool skip_special_tokens = false);

  // Text newly completed by `id`; empty while held back.
  std::string step(int32_t id);
  // Everything still held back; the decoder then starts afresh.
  std::string flush();

 private:
  std::string unseen_text(const std::string& window_text) const;

  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;   // the current window: context tokens followed by not-yet-emitted ones
  std::string prefix_;         // what ids_ decoded to at the last emission
  std::size_t prefix_index_ = 0;
};

}  // namespace tierlm::tok
