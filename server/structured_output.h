// server/structured_output.h — turns a request's response_format into the engine's per-sequence TokenConstraint:
// compiles the schema (a 400 naming any keyword it does not support), keeps the last compiled grammars by schema
// text so repeated requests reuse their cached token masks, and builds the tokenizer's vocabulary trie once, on
// the first constrained request. Also the entry point for other grammars (tool calls): constraint_for(grammar).
// Never: constrains a request that asked for plain text, or blocks the engine thread (compilation runs on the
// caller's, an HTTP thread).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "runtime/engine/token_constraint.h"
#include "runtime/grammar/grammar.h"
#include "runtime/tokenizer/tokenizer.h"
#include "server/openai_request.h"

namespace tierlm::tiering {
class Ledger;
}

namespace tierlm::server {

class StructuredOutputs {
 public:
  StructuredOutputs(tok::Tokenizer tokenizer, tiering::Ledger* ledger)
      : tokenizer_(std::move(tokenizer)), ledger_(ledger) {}

  // null for response_format text. Throws ApiError(400) for a schema the grammar compiler refuses.
  std::shared_ptr<engine::TokenConstraint> constraint_for(const StructuredOutput& format);
  // A fresh constraint for any compiled grammar (e.g. grammar::compile_tool_calls).
  std::shared_ptr<engine::TokenConstraint> constraint_for(std::shared_ptr<const grammar::Grammar> compiled);
  std::shared_ptr<const grammar::Vocabulary> vocabulary();

  // response_format's grammar (null for text), from the recent ones when the same schema came lately.
  std::shared_ptr<const grammar::Grammar> compiled(const StructuredOutput& format);
  // Any grammar by a key naming what it was compiled from (e.g. tool_choice's forms), reused while recent so its
  // token-mask cache outlives one request; `compile` runs (on the caller's thread) only on a miss.
  std::shared_ptr<const grammar::Grammar> compiled(
      const std::string& key, const std::function<std::shared_ptr<const grammar::Grammar>()>& compile);

 private:

  tok::Tokenizer tokenizer_;
  tiering::Ledger* ledger_;
  std::once_flag vocabulary_once_;
  std::shared_ptr<const grammar::Vocabulary> vocabulary_;
  std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<const grammar::Grammar>>> recent_;  // most recent first
};

}  // namespace tierlm::server
