#include "server/structured_output.h"

#include <chrono>

#include <boost/json.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/grammar/vocabulary.h"
#include "server/api_error.h"

namespace tierlm::server {

namespace {
constexpr size_t kRecentGrammars = 16;
}

std::shared_ptr<const grammar::Vocabulary> StructuredOutputs::vocabulary() {
  std::call_once(vocabulary_once_, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    vocabulary_ = grammar::build_vocabulary(tokenizer_, ledger_);
    spdlog::info("[grammar] token vocabulary for structured output: {} tokens, {} trie nodes, {:.0f} ms",
                 vocabulary_->size(), vocabulary_->nodes(),
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  });
  return vocabulary_;
}

std::shared_ptr<const grammar::Grammar> StructuredOutputs::compiled(
    const std::string& key, const std::function<std::shared_ptr<const grammar::Grammar>()>& compile) {
  {
    std::lock_guard lock(mutex_);
    for (auto it = recent_.begin(); it != recent_.end(); ++it)
      if (it->first == key) {
        recent_.splice(recent_.begin(), recent_, it);
        return recent_.front().second;
      }
  }
  std::shared_ptr<const grammar::Grammar> grammar = compile();
  std::lock_guard lock(mutex_);
  recent_.emplace_front(key, grammar);
  if (recent_.size() > kRecentGrammars) recent_.pop_back();
  return grammar;
}

std::shared_ptr<const grammar::Grammar> StructuredOutputs::compiled(const StructuredOutput& format) {
  if (format.kind == StructuredOutput::Kind::text) return nullptr;
  const std::string key = format.kind == StructuredOutput::Kind::json_object
                              ? std::string("json_object")
                              : "json_schema:" + boost::json::serialize(format.schema);
  return compiled(key, [&] {
    try {
      return format.kind == StructuredOutput::Kind::json_object
                 ? grammar::compile_json_object()
                 : grammar::compile_json_schema(format.schema.is_null() ? boost::json::value(boost::json::object())
                                                                        : format.schema);
    } catch (const grammar::SchemaError& e) {
      throw ApiError(400, fmt::format("Invalid 'response_format.json_schema.schema': {}", e.what()),
                     "invalid_request_error", "response_format.json_schema.schema." + e.keyword(),
                     "unsupported_schema");
    }
  });
}

std::shared_ptr<engine::TokenConstraint> StructuredOutputs::constraint_for(std::shared_ptr<const grammar::Grammar> g) {
  return grammar::make_constraint(std::move(g), vocabulary());
}

std::shared_ptr<engine::TokenConstraint> StructuredOutputs::constraint_for(const StructuredOutput& format) {
  if (format.kind == StructuredOutput::Kind::text) return nullptr;
  return constraint_for(compiled(format));
}

}  // namespace tierlm::server
