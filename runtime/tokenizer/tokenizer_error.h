// TokenizerError: the one exception type the tokenizer throws at load time (bad JSON, unsupported component) and
// for impossible requests. Messages name the file and the JSON path of what was wrong.
#pragma once

#include <stdexcept>
#include <string>

namespace tierlm::tok {

class TokenizerError : public std::runtime_error {
 public:
  explicit TokenizerError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace tierlm::tok
