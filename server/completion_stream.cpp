#include "server/completion_stream.h"

#include <cmath>

#include <boost/json.hpp>

namespace tierlm::server {

namespace json = boost::json;

CompletionStream::CompletionStream(const tok::Tokenizer& tokenizer, std::vector<std::string> stops, bool logprobs,
                                   bool keep_special_tokens)
    : tokenizer_(tokenizer), decoder_(tokenizer, /*skip_special_tokens=*/!keep_special_tokens), matcher_(std::move(stops)),
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
      e.bytes = tokenizer_.token_bytes(id);
      e.logprob = token.logprob;
      e.text_offset = emitted_bytes_;
      for (const auto& t : token.top) {
        const int32_t tid = t.token;
        e.top.push_back({tokenizer_.decode(std::span(&tid, 1), false), tokenizer_.token_bytes(tid), t.logprob});
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
    pending_.stop_sequence = matcher_.matched();
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
    pending_.stop_sequence = out.stop_sequence;
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

json::array byte_list(const std::string& s) {
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
      o["bytes"] = byte_list(e.bytes);
      json::array top;
      for (const auto& t : e.top) {
        json::object x;
        x["token"] = t.token;
        x["logprob"] = finite(t.logprob);
        x["bytes"] = byte_list(t.bytes);
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
    for (const auto& t : e.top) top[t.token] = finite(t.logprob);
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

json::array tool_calls_json(const std::vector<ToolCall>& calls, int first, bool with_index) {
  json::array out;
  for (size_t i = 0; i < calls.size(); ++i) {
    json::object fn;
    fn["name"] = calls[i].name;
    fn["arguments"] = calls[i].arguments;
    json::object c;
    if (with_index) c["index"] = first + int(i);
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = std::move(fn);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

std::string ResponseFormat::full(const std::vector<Choice>& choices, const Usage& usage) const {
  json::array list;
  for (size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    json::object choice;
    choice["index"] = int64_t(i);
    if (endpoint == Endpoint::chat) {
      json::object message;
      message["role"] = "assistant";
      const bool calls = !c.output.tool_calls.empty();
      message["content"] = calls && c.output.content.empty() ? json::value(nullptr) : json::value(c.output.content);
      if (!c.output.reasoning.empty()) message["reasoning_content"] = c.output.reasoning;
      if (calls) message["tool_calls"] = tool_calls_json(c.output.tool_calls, 0, false);
      message["refusal"] = nullptr;
      choice["message"] = std::move(message);
    } else {
      choice["text"] = c.output.content;
    }
    choice["logprobs"] = logprobs ? logprobs_json(endpoint, c.logprobs) : json::value(nullptr);
    choice["finish_reason"] = reason(c.finish_reason);
    list.push_back(std::move(choice));
  }
  json::object body;
  body["id"] = id;
  body["object"] = endpoint == Endpoint::chat ? "chat.completion" : "text_completion";
  body["created"] = created;
  body["model"] = model;
  body["choices"] = std::move(list);
  body["usage"] = usage_json(usage);
  body["system_fingerprint"] = "tierlm";
  return json::serialize(body);
}

std::string ResponseFormat::chunk(int index, const AssistantDelta& out, const std::vector<LogprobEntry>& entries,
                                  const std::string& finish_reason, bool role_chunk, bool usage_null,
                                  int first_call) const {
  json::object choice;
  choice["index"] = index;
  if (endpoint == Endpoint::chat) {
    json::object delta;
    if (role_chunk) delta["role"] = "assistant";
    if (role_chunk || !out.content.empty()) delta["content"] = out.content;
    if (!out.reasoning.empty()) delta["reasoning_content"] = out.reasoning;
    if (!out.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(out.tool_calls, first_call, true);
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = out.content;
  }
  choice["logprobs"] = logprobs && !entries.empty() ? logprobs_json(endpoint, entries) : json::value(nullptr);
  choice["finish_reason"] = reason(finish_reason);
  return chunk_body(json::array{std::move(choice)}, usage_null, nullptr);
}

std::string ResponseFormat::tool_call_chunk(int index, int call_index, const ToolCall* header,
                                            std::string_view arguments, bool usage_null) const {
  json::object fn;
  if (header) fn["name"] = header->name;
  fn["arguments"] = arguments;
  json::object call;
  call["index"] = call_index;
  if (header) {
    call["id"] = header->id;
    call["type"] = "function";
  }
  call["function"] = std::move(fn);
  json::object delta;
  delta["tool_calls"] = json::array{std::move(call)};
  json::object choice;
  choice["index"] = index;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = nullptr;
  return chunk_body(json::array{std::move(choice)}, usage_null, nullptr);
}

std::string ResponseFormat::usage_chunk(const Usage& usage) const {
  const json::value totals = usage_json(usage);
  return chunk_body(json::array{}, false, &totals);
}

// usage_null: a "usage": null member (stream_options.include_usage puts one in every chunk); usage: the totals.
std::string ResponseFormat::chunk_body(boost::json::array choices, bool usage_null, const boost::json::value* usage) const {
  json::object body;
  body["id"] = id;
  body["object"] = endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion";
  body["created"] = created;
  body["model"] = model;
  body["system_fingerprint"] = "tierlm";
  body["choices"] = std::move(choices);
  if (usage) body["usage"] = *usage;
  else if (usage_null) body["usage"] = nullptr;
  return json::serialize(body);
}

}  // namespace tierlm::server
