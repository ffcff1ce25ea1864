// UTF-8 helpers shared by the tokenizer pieces: code point iteration, lossy repair with the same rules as Rust's
// String::from_utf8_lossy (one U+FFFD per maximal invalid subpart), Unicode White_Space, and the GPT-2 byte<->char
// map that byte-level BPE uses. Inputs to the iteration helpers must already be valid UTF-8.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tierlm::tok::detail {

// Length of the UTF-8 sequence that starts with `lead` (1 for stray continuation bytes, so loops always advance).
inline std::size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Decodes the code point at text[pos] (valid UTF-8) and advances pos.
char32_t next_code_point(std::string_view text, std::size_t& pos);
void append_utf8(std::string& out, char32_t cp);

// True when `bytes` is well-formed UTF-8 throughout.
bool is_valid_utf8(std::string_view bytes);
// Rust's from_utf8_lossy: every maximal invalid subpart becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Unicode White_Space (what Rust's char::is_whitespace tests).
bool is_whitespace(char32_t cp);

// GPT-2 byte-level alphabet: every byte maps to one printable code point.
struct ByteLevelAlphabet {
  std::array<char32_t, 256> byte_to_char{};
  std::array<std::string, 256> byte_to_utf8{};
  // code point -> byte, or -1; code points above 0x1FF never belong to the alphabet.
  std::array<int16_t, 0x200> char_to_byte{};
};
const ByteLevelAlphabet& byte_level_alphabet();

// A byte-level BPE token string (GPT-2 alphabet) back to the bytes it stands for; false (out unspecified) when a
// character is not in the alphabet (an added token such as "<｜User｜>").
bool byte_level_bytes(std::string_view token, std::string& out);
// "<0xNN>" (SentencePiece byte fallback) -> the byte NN, else -1.
int byte_fallback_byte(std::string_view token);

}  // namespace tierlm::tok::detail
