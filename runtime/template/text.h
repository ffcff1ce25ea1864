// Python str semantics over UTF-8 std::string: code-point indexing, whitespace per str.isspace, case mapping through
// ICU (full mappings, as CPython). Templates index and strip by code point, never by byte.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tierlm::tmpl::text {

std::vector<char32_t> decode(std::string_view s);
std::string encode(const std::vector<char32_t>& cps, std::size_t begin, std::size_t end);
void append_utf8(std::string& out, char32_t cp);
std::size_t length(std::string_view s);  // in code points
bool is_ascii(std::string_view s);

bool is_space(char32_t cp);  // Python's str.isspace for one code point

std::string strip(std::string_view s, bool left, bool right);                         // whitespace
std::string strip_chars(std::string_view s, std::string_view chars, bool left, bool right);  // any of `chars`

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title
std::string capitalize(std::string_view s);  // str.capitalize

}  // namespace tierlm::tmpl::text
