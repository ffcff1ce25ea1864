// Fuzzes tokenizer.json through Tokenizer::load (the file path the server and CLI use), then, when it loads, encodes
// a few fixed texts (specials, spaces, digits, accents, CJK, emoji, invalid UTF-8), decodes the ids whole and token by
// token, and looks ids and tokens up both ways. Bad files must end in TokenizerError; a loaded tokenizer must never
// crash on any text or id.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_harness.h"

namespace {

constexpr std::string_view kTexts[] = {
    "Hello world! It's 2024-06-01, 12345 items.",
    "<|im_start|>user\n  spaced\t\ttabs  <s></s><unk> <|endoftext|><|im_end|>",
    "caf\xc3\xa9 na\xc3\xafve \xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80!",
    "bad \xff\xfe utf8 \xc3",
    "",
};
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tierlm::fuzz::silence_logs();
  (void)tierlm::fuzz::scratch_file("tokenizer.json");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierlm::tok;
  const auto& scratch = tierlm::fuzz::scratch_file("tokenizer.json");
  scratch.write(data, size);
  std::optional<Tokenizer> tokenizer;
  try {
    tokenizer = Tokenizer::load(scratch.path());
  } catch (const TokenizerError&) {
    return 0;
  }
  const int32_t vocab = tokenizer->vocab_size();
  TIERLM_FUZZ_CHECK(vocab >= 0);
  for (std::string_view text : kTexts) {
    for (bool add_special : {false, true}) {
      const std::vector<int32_t> ids = tokenizer->encode(text, add_special);
      for (int32_t id : ids) TIERLM_FUZZ_CHECK(id >= 0 && id < vocab);
      (void)tokenizer->decode(ids, false);
      (void)tokenizer->decode(ids, true);
      StreamDecoder stream(*tokenizer);
      for (int32_t id : ids) (void)stream.step(id);
      (void)stream.flush();
    }
  }
  const std::vector<int32_t> odd_ids = {-1, 0, 1, vocab - 1, vocab, 1 << 30};
  (void)tokenizer->decode(odd_ids, false);
  for (int32_t id = 0; id < vocab && id < 64; ++id) {
    const std::string token = tokenizer->id_to_token(id);
    if (!token.empty()) (void)tokenizer->token_to_id(token);
    (void)tokenizer->is_special(id);
  }
  (void)tokenizer->bos_id();
  (void)tokenizer->eos_ids();
  return 0;
}
