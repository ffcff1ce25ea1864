// runtime/hub/hub_error.h — the one error type of the hub client. Its message names the repo, the file when there is
// one, what happened and what to do; it never contains the token.
#pragma once

#include <stdexcept>
#include <string>

namespace tierlm::hub {

class HubError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace tierlm::hub
