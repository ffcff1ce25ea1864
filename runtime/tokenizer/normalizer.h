// Normalizer: HF's text normalizers (NFC/NFKC/NFD/NFKD through ICU, Replace, Prepend, Lowercase, Strip,
// StripAccents, Sequence) built from tokenizer.json. They rewrite a whole piece of text; offsets are not tracked
// because tierlm never needs them.
#pragma once

#include <boost/json/fwd.hpp>

#include <memory>
#include <string>

namespace tierlm::tok::detail {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// nullptr for a JSON null; throws TokenizerError naming `where` for an unsupported type.
std::unique_ptr<Normalizer> make_normalizer(const boost::json::value& json, const std::string& where);

}  // namespace tierlm::tok::detail
