#include "server/completion_stream.h"

#include <cmath>

#include <boost/json.hpp>

namespace tierlm::server {

namespace json = boost::json;

CompletionStream::CompletionStream(const tok::Tokenizer& tokenizer, std::vector<std::string> stops, bool logprobs)
    : tokenizer_(tokenizer), decoder_(tokenizer, /*skip_special_tokens=*/true), matcher_(std::move(stops)),
      logprobs_(logprobs) {}

bool CompletionStream::on_token(const engine::TokenOutput& token) {
  const std::string piece = decoder_.step(token.token);
  const std::string text = matcher_.push(piece);
  {
    std::lock_guard lock(mutex_);
    if (logprobs_ && !matcher_.stopped()) {
      LogprobEntry e;
      const int32_t id = token.token;
      e.token = tokenizer_.decode(std::span(&id, 1), false);
      e.logprob = token.logprob;
      e.text_offset = emitted_bytes_;
      for (const auto& t : token.top) {
        const int32_t tid = t.token;
        e.top.emplace_back(tokenizer_.decode(std::span(&tid, 1), false), t.logprob);
      }
      pending_.logprobs.push_back(std::move(e));
    }
    pending_.text += text;
    emitted_bytes_ += int64_t(text.size());
  }
  if (!text.empty() || logprobs_) {
    if (!notified_.exchange(true) && notify_) notify_();
  }
  return !matcher_.stopped();
}

void CompletionStream::on_finish(const engine::SequenceResult& result) {
  std::string tail;
  if (!matcher_.stopped()) {
    tail = matcher_.push(decoder_.flush());
    if (!matcher_.stopped()) tail += matcher_.flush();
  }
  {
    std::lock_guard lock(mutex_);
    pending_.text += tail;
    pending_.finished = true;
    pending_.finish_reason = matcher_.stopped() ? "stop" : result.finish_reason;
    pending_.error = result.error;
    pending_.usage.prompt_tokens = result.prompt_tokens;
    pending_.usage.completion_tokens = result.completion_tokens;
    pending_.usage.cached_tokens = result.cached_prompt_tokens;
  }
  notified_.store(true);
  if (notify_) notify_();
}

CompletionPiece CompletionStream::take() {
  std::lock_guard lock(mutex_);
  notified_.store(false);
  CompletionPiece out = std::move(pending_);
  pending_ = CompletionPiece{};
  if (out.finished) {  // the end stays visible to later takes
    pending_.finished = true;
    pending_.finish_reason = out.finish_reason;
    pending_.error = out.error;
    pending_.usage = out.usage;
  }
  return out;
}

namespace {

json::value usage_json(const Usage& u) {
  json::object o;
  o["prompt_tokens"] = u.prompt_tokens;
  o["completion_tokens"] = u.completion_tokens;
  o["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  json::object details;
  details["cached_tokens"] = u.cached_tokens;
  o["prompt_tokens_details"] = std::move(details);
  return o;
}

json::value finite(float x) { return std::isfinite(x) ? json::value(double(x)) : json::value(-9999.0); }

json::array token_bytes(const std::string& s) {
  json::array a;
  for (unsigned char c : s) a.push_back(int64_t(c));
  return a;
}

// Chat format: {"content":[{token, logprob, bytes, top_logprobs:[...]}]}; legacy completions: parallel arrays.
json::value logprobs_json(Endpoint endpoint, const std::vector<LogprobEntry>& entries) {
  if (endpoint == Endpoint::chat) {
    json::array content;
    for (const auto& e : entries) {
      json::object o;
      o["token"] = e.token;
      o["logprob"] = finite(e.logprob);
      o["bytes"] = token_bytes(e.token);
      json::array top;
      for (const auto& [t, lp] : e.top) {
        json::object x;
        x["token"] = t;
        x["logprob"] = finite(lp);
        x["bytes"] = token_bytes(t);
        top.push_back(std::move(x));
      }
      o["top_logprobs"] = std::move(top);
      content.push_back(std::move(o));
    }
    json::object out;
    out["content"] = std::move(content);
    out["refusal"] = nullptr;
    return out;
  }
  json::array tokens, lps, tops, offsets;
  for (const auto& e : entries) {
    tokens.push_back(json::value(e.token));
    lps.push_back(finite(e.logprob));
    json::object top;
    for (const auto& [t, lp] : e.top) top[t] = finite(lp);
    tops.push_back(std::move(top));
    offsets.push_back(e.text_offset);
  }
  json::object out;
  out["tokens"] = std::move(tokens);
  out["token_logprobs"] = std::move(lps);
  out["top_logprobs"] = std::move(tops);
  out["text_offset"] = std::move(offsets);
  return out;
}

json::value reason(const std::string& r) { return r.empty() ? json::value(nullptr) : json::value(r); }

}  // namespace

std::string ResponseFormat::full(const std::string& text, const std::vector<LogprobEntry>& entries,
                                 const std::string& finish_reason, const Usage& usage) const {
  json::object choice;
  choice["index"] = 0;
  if (endpoint == Endpoint::chat) {
    json::object message;
    message["role"] = "assistant";
    message["content"] = text;
    message["refusal"] = nullptr;
    choice["message"] = std::move(message);
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs ? logprobs_json(endpoint, entries) : json::value(nullptr);
  choice["finish_reason"] = reason(finish_reason);
  json::object body;
  body["id"] = id;
  body["object"] = endpoint == Endpoint::chat ? "chat.completion" : "text_completion";
  body["created"] = created;
  body["model"] = model;
  body["choices"] = json::array{std::move(choice)};
  body["usage"] = usage_json(usage);
  body["system_fingerprint"] = "tierlm";
  return json::serialize(body);
}

std::string ResponseFormat::chunk(const std::string& text, const std::vector<LogprobEntry>& entries,
                                  const std::string& finish_reason, bool role_chunk, bool usage_null) const {
  json::object choice;
  choice["index"] = 0;
  if (endpoint == Endpoint::chat) {
    json::object delta;
    if (role_chunk) delta["role"] = "assistant";
    if (role_chunk || !text.empty()) delta["content"] = text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs && !entries.empty() ? logprobs_json(endpoint, entries) : json::value(nullptr);
  choice["finish_reason"] = reason(finish_reason);
  json::object body;
  body["id"] = id;
  body["object"] = endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion";
  body["created"] = created;
  body["model"] = model;
  body["system_fingerprint"] = "tierlm";
  body["choices"] = json::array{std::move(choice)};
  if (usage_null) body["usage"] = nullptr;
  return json::serialize(body);
}

std::string ResponseFormat::usage_chunk(const Usage& usage) const {
  json::object body;
  body["id"] = id;
  body["object"] = endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion";
  body["created"] = created;
  body["model"] = model;
  body["system_fingerprint"] = "tierlm";
  body["choices"] = json::array{};
  body["usage"] = usage_json(usage);
  return json::serialize(body);
}

}  // namespace tierlm::server
