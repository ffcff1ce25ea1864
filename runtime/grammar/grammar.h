// runtime/grammar/grammar.h — structured output. Compiles a JSON Schema (or "any JSON object", or tool calls in a
// model family's text format) into a byte-level grammar, and makes per-sequence engine::TokenConstraints that mask
// the logits to the tokens keeping the output inside that grammar, over any tokenizer's vocabulary (byte-level BPE
// and SentencePiece alike: a token is the bytes it decodes to).
// Owns: the schema compiler, the compiled grammar (immutable, shared by every sequence using it, plus a cache of
// token masks per grammar state) and the token vocabulary trie.
// Never: accepts a schema keyword it does not implement (SchemaError names it), or lets a constrained sequence
// reach a state with no valid continuation.
//
// Whitespace policy: the output is compact JSON, except that one optional space (0x20) may follow each ':' and each
// ',' (the style `{"a": 1, "b": 2}` models tend to write); no other whitespace, no newlines.
// Object members come in the order of the schema's `properties`; optional ones may be left out; required ones
// never are. Strings are well-formed UTF-8 with JSON escapes (a \u escape may not start with d/D: no surrogates).
// Numbers: at most 15 integer digits, 15 fraction digits and 3 exponent digits.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/value.hpp>

#include "runtime/engine/token_constraint.h"

namespace tierlm::tok {
class Tokenizer;
}
namespace tierlm::tiering {
class Ledger;
}

namespace tierlm::grammar {

// A schema keyword (or a value of one) the compiler does not implement, or a malformed schema; keyword() names the
// keyword (the server answers 400 naming it).
class SchemaError : public std::invalid_argument {
 public:
  SchemaError(std::string keyword, const std::string& message)
      : std::invalid_argument(message), keyword_(std::move(keyword)) {}
  const std::string& keyword() const { return keyword_; }

 private:
  std::string keyword_;
};

class Grammar;     // compiled; thread-safe to share
class Vocabulary;  // every token's bytes as a trie; build once per tokenizer, thread-safe to share

// Supported: type (object, array, string, number, integer, boolean, null, and arrays of them), properties,
// required, additionalProperties (false, true, or a schema for objects without properties), items, enum, const,
// anyOf, oneOf (as anyOf: keep the branches disjoint), allOf with one member, $ref to #, #/$defs/NAME or
// #/definitions/NAME (recursion allowed), minItems, maxItems, minLength, maxLength; annotations (title,
// description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored. Anything
// else (minimum, pattern, format, prefixItems, ...) throws SchemaError naming it.
std::shared_ptr<const Grammar> compile_json_schema(const boost::json::value& schema);
// response_format {type: json_object}: any JSON object.
std::shared_ptr<const Grammar> compile_json_object();

// A tool call in a family's text format: `prefix`, then the arguments as JSON valid against `parameters` (a
// function's parameters schema), then `suffix`.
struct ToolCallForm {
  std::string prefix;
  boost::json::value parameters;
  std::string suffix;
};
// Qwen2.5 / Qwen3 (Hermes style): `<tool_call>\n{"name": "NAME", "arguments": ` ARGS `}\n</tool_call>`.
ToolCallForm qwen_tool_call(std::string_view function_name, const boost::json::value& parameters);
// One call of any of `forms` (tool_choice required: all tools; a named function: just its form); with
// `parallel`, one or more calls separated by `separator`. Throws SchemaError for a parameters schema it cannot
// compile.
std::shared_ptr<const Grammar> compile_tool_calls(std::span<const ToolCallForm> forms, bool parallel = false,
                                                  std::string_view separator = "\n");

// Reads every token's bytes from the tokenizer; special tokens (except as end tokens) are never allowed by a grammar.
// The trie (a few MB for a 151k vocabulary) is charged to the ledger's "grammar" account when one is given.
std::shared_ptr<const Vocabulary> build_vocabulary(const tok::Tokenizer& tokenizer, tiering::Ledger* ledger = nullptr);

// A fresh constraint at the grammar's start, for one sequence.
std::unique_ptr<engine::TokenConstraint> make_constraint(std::shared_ptr<const Grammar> grammar,
                                                         std::shared_ptr<const Vocabulary> vocabulary);

}  // namespace tierlm::grammar
