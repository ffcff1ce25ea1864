// PreTokenizer: HF's pre-tokenizers (Split with its delimiter behaviours, ByteLevel, Metaspace, Digits,
// Whitespace, WhitespaceSplit, Sequence) built from tokenizer.json. Each one cuts pieces into smaller pieces (and
// may rewrite them, as ByteLevel's byte->char map does); the model then encodes every piece on its own.
#pragma once

#include <boost/json/fwd.hpp>

#include <memory>
#include <string>
#include <vector>

namespace tierlm::tok::detail {

struct Piece {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the caller's input (Metaspace's prepend_scheme "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

// nullptr for a JSON null; throws TokenizerError naming `where` for an unsupported type or behaviour.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const boost::json::value& json, const std::string& where);

}  // namespace tierlm::tok::detail
