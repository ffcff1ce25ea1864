#include "runtime/template/text.h"

#include <algorithm>

#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/locid.h>

namespace tierlm::tmpl::text {

std::vector<char32_t> decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    char32_t cp;
    int extra;
    if (c < 0x80) {
      cp = c;
      extra = 0;
    } else if ((c >> 5) == 0x6) {
      cp = c & 0x1f;
      extra = 1;
    } else if ((c >> 4) == 0xe) {
      cp = c & 0x0f;
      extra = 2;
    } else if ((c >> 3) == 0x1e) {
      cp = c & 0x07;
      extra = 3;
    } else {
      out.push_back(0xfffd);  // invalid lead byte: inputs come from JSON, so this is only defensive
      ++i;
      continue;
    }
    if (i + static_cast<std::size_t>(extra) >= s.size()) {
      out.push_back(0xfffd);
      break;
    }
    for (int k = 1; k <= extra; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += 1 + extra;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::string encode(const std::vector<char32_t>& cps, std::size_t begin, std::size_t end) {
  std::string out;
  for (std::size_t i = begin; i < end && i < cps.size(); ++i) append_utf8(out, cps[i]);
  return out;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

std::size_t length(std::string_view s) {
  std::size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xc0) != 0x80) ++n;
  return n;
}

bool is_space(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0a: case 0x0b: case 0x0c: case 0x0d: case 0x1c: case 0x1d: case 0x1e: case 0x1f:
    case 0x20: case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029: case 0x202f: case 0x205f:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200a;
  }
}

namespace {

template <class Pred>
std::string strip_if(std::string_view s, bool left, bool right, Pred&& strip_it) {
  auto cps = decode(s);
  std::size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return encode(cps, b, e);
}

std::string via_icu(std::string_view s, bool to_upper) {
  auto u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  if (to_upper)
    u.toUpper(icu::Locale::getRoot());
  else
    u.toLower(icu::Locale::getRoot());
  std::string out;
  u.toUTF8String(out);
  return out;
}

bool is_cased(char32_t cp) { return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_CASED); }

std::string title_one(char32_t cp) {
  // Full titlecase mapping of a single code point (e.g. U+01C6 -> U+01C5).
  icu::UnicodeString u(static_cast<UChar32>(cp));
  std::string out;
  icu::UnicodeString t = u;
  t.toTitle(nullptr, icu::Locale::getRoot(), U_TITLECASE_NO_LOWERCASE | U_TITLECASE_NO_BREAK_ADJUSTMENT);
  t.toUTF8String(out);
  return out;
}

}  // namespace

std::string strip(std::string_view s, bool left, bool right) {
  if (is_ascii(s)) {
    std::size_t b = 0, e = s.size();
    auto sp = [](char c) { return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f); };
    if (left)
      while (b < e && sp(s[b])) ++b;
    if (right)
      while (e > b && sp(s[e - 1])) --e;
    return std::string(s.substr(b, e - b));
  }
  return strip_if(s, left, right, is_space);
}

std::string strip_chars(std::string_view s, std::string_view chars, bool left, bool right) {
  auto set = decode(chars);
  return strip_if(s, left, right, [&](char32_t c) { return std::find(set.begin(), set.end(), c) != set.end(); });
}

std::string upper(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    return out;
  }
  return via_icu(s, true);
}

std::string lower(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    return out;
  }
  return via_icu(s, false);
}

std::string title(std::string_view s) {
  // str.title: a cased character following a cased one is lowered, any other is title-cased.
  std::string out;
  bool previous_cased = false;
  for (char32_t cp : decode(s)) {
    std::string one;
    append_utf8(one, cp);
    out += previous_cased ? lower(one) : title_one(cp);
    previous_cased = is_cased(cp);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  auto cps = decode(s);
  if (cps.empty()) return {};
  return title_one(cps[0]) + lower(encode(cps, 1, cps.size()));
}

}  // namespace tierlm::tmpl::text
