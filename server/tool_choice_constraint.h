// server/tool_choice_constraint.h — the interface (a header only, agreed ahead of the grammar engine, issue 17 item
// 2) through which tool_choice "required" / a named function will force the model to call a tool. Until the grammar
// engine provides it, Service::start answers such requests 400 ("needs constrained decoding"), never pretends.
//
// The contract, as the server will use it:
//  - The grammar engine exposes a per-sequence constraint (engine::SequenceParams gains an optional
//    std::shared_ptr<TokenConstraint>, null = unconstrained) that masks the logits before sampling and advances on
//    each sampled token; the sampler hook is the grammar engine's.
//  - The server builds what must be generated from the request: the family's call block (assistant_output.h's
//    format: e.g. hermes `<tool_call>\n{"name": N, "arguments": A}\n</tool_call>`) around JSON whose "name" is one of
//    the allowed functions and whose "arguments" validate against that function's `parameters` schema.
//  - The constrained text then goes through AssistantOutputParser like any other output, so the response shape is
//    the same with or without constraints.
// Never: implemented here; a request asking for it without the engine is refused.
#pragma once

#include <string>
#include <vector>

#include <boost/json/object.hpp>

#include "server/assistant_output.h"

namespace tierlm::server {

// What the server asks the grammar engine to enforce for one sequence.
struct ToolCallConstraintSpec {
  ToolCallFormat format = ToolCallFormat::none;  // the block syntax around the JSON call
  std::vector<std::string> names;                 // allowed functions (one for a named tool_choice)
  std::vector<boost::json::object> parameters;    // each allowed function's JSON schema, same order
  bool parallel = true;                           // more than one call may follow
};

}  // namespace tierlm::server
