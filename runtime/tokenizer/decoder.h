// Decoder: HF's decoders (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence) built from
// tokenizer.json. A decoder rewrites the list of token strings; the caller joins the result.
#pragma once

#include <boost/json/fwd.hpp>

#include <memory>
#include <string>
#include <vector>

namespace tierlm::tok::detail {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// nullptr for a JSON null; throws TokenizerError naming `where` for an unsupported type.
std::unique_ptr<Decoder> make_decoder(const boost::json::value& json, const std::string& where);

}  // namespace tierlm::tok::detail
