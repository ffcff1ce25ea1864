// server/service.h — the OpenAI routes without the HTTP: validates a request body, renders and tokenizes the
// prompt, checks it against the context, and submits it to the scheduler; answers /v1/models and /wisdom.
// The HTTP layer (http_server.cpp) only moves bytes. Owns: the tokenizer and chat prompt renderer.
// Never: touches sockets, or lets a client's input reach the engine unvalidated.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "runtime/engine/scheduler.h"
#include "runtime/tokenizer/tokenizer.h"
#include "server/chat_prompt.h"
#include "server/completion_stream.h"
#include "server/openai_request.h"
#include "server/structured_output.h"
#include "server/telemetry.h"

namespace tierlm::server {

struct StartedCompletion {
  std::shared_ptr<CompletionStream> stream;
  std::shared_ptr<engine::SequenceHandle> handle;
  ResponseFormat format;
  bool streaming = false;
  bool include_usage = false;
};

class Service {
 public:
  Service(std::string model_id, tok::Tokenizer tokenizer, ChatPrompt chat_prompt, engine::Scheduler& scheduler,
          Telemetry& telemetry);

  // Throws ApiError (400 invalid, 404 unknown model, 429 queue full). notify runs on the engine thread whenever
  // the stream has something to take(). Past `deadline` the generation finishes ("length" with what it has, or
  // "timeout" when it has generated nothing).
  StartedCompletion start_completion(
      std::string_view body, Endpoint endpoint, std::function<void()> notify,
      std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());

  std::string models_json() const;
  // The active plan as JSON; throws ApiError(404) while no plan (wisdom) is loaded.
  std::string wisdom_json() const;

  const std::string& model_id() const { return model_id_; }
  Telemetry& telemetry() { return telemetry_; }
  const tok::Tokenizer& tokenizer() const { return tokenizer_; }
  const ChatPrompt& chat_prompt() const { return chat_prompt_; }
  StructuredOutputs& structured_outputs() { return structured_; }

 private:
  std::string model_id_;
  tok::Tokenizer tokenizer_;
  ChatPrompt chat_prompt_;
  engine::Scheduler& scheduler_;
  Telemetry& telemetry_;
  StructuredOutputs structured_;
  int64_t created_;
};

}  // namespace tierlm::server
