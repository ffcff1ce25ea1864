// runtime/engine/token_constraint.h — the hook through which a sequence's output is held to a language (a JSON
// Schema, a tool call's format): before each sampling the scheduler lets the constraint mask the logits (greedy
// too), and after it hands back the chosen token. The engine knows nothing of grammars; runtime/grammar implements
// this interface.
// Never: called from more than one thread at a time (one constraint per sequence, used on the engine thread).
#pragma once

#include <cstdint>
#include <span>

namespace tierlm::engine {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets to -infinity the logit of every token that may not come next (ids beyond the constraint's vocabulary
  // included). An end token (EOS / stop token) keeps its logit only where the constrained text may end. Returns
  // false when no token at all is allowed (a language the vocabulary cannot spell), so the caller can fail the
  // sequence instead of sampling from nothing.
  virtual bool mask(std::span<float> logits, std::span<const int32_t> end_tokens) = 0;
  // Advances past `token`, sampled from the masked logits. Throws std::logic_error for a token mask() forbade.
  virtual void accept(int32_t token) = 0;
  // True when the text is complete and nothing but an end token may follow: the sequence should end ("stop").
  virtual bool complete() = 0;
};

}  // namespace tierlm::engine
