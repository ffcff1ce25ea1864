// server/stop_matcher.h — finds OpenAI `stop` strings in generated text that arrives in pieces (one per token), so a
// stop string split across tokens still matches and is never sent. Text that could be the start of a stop string is
// held back until the next piece decides. The stop string that completes first wins, so the output never depends on
// how the text was split into tokens. Owns: the held-back tail. Never: emits any byte of a matched stop string.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tierlm::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Adds the next piece of text; returns what may be sent now. Once a stop string has matched, stopped() is true,
  // the returned text ends right before the match and later pushes return "".
  std::string push(std::string_view text);
  // End of generation without a match: returns the held-back text.
  std::string flush();
  bool stopped() const { return stopped_; }
  // The stop string that matched ("" until one has).
  const std::string& matched() const { return matched_; }
  const std::vector<std::string>& stops() const { return stops_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace tierlm::server
