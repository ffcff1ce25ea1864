// server/tool_choice_constraint.h — tool_choice "required" / a named function, enforced by the grammar engine: what
// the model must generate is the chat template's own call block around JSON whose arguments validate against the
// chosen function's `parameters` schema, so the constrained text goes through AssistantOutputParser like any other
// output and the response has the same shape with or without the constraint.
// Owns: the choice of allowed functions from a request, and each template syntax's call form (prefix, arguments,
// suffix, separator between parallel calls).
// Never: guesses a syntax it has no form for (400 naming the format), or constrains tool_choice auto / none.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/object.hpp>

#include "runtime/grammar/grammar.h"
#include "server/assistant_output.h"
#include "server/openai_request.h"

namespace tierlm::server {

// What the server asks the grammar engine to enforce for one sequence.
struct ToolCallConstraintSpec {
  ToolCallFormat format = ToolCallFormat::none;  // the block syntax around the JSON call
  std::vector<std::string> names;                 // allowed functions (one for a named tool_choice)
  std::vector<boost::json::object> parameters;    // each allowed function's JSON schema, same order
  bool parallel = true;                           // more than one call may follow
  // The format's markers that are special tokens in the model's tokenizer: a grammar allows only ordinary tokens,
  // so a call form that must write one cannot be constrained (400 naming the marker).
  std::vector<std::string> special_markers;
};

// The spec of a request whose tool_choice is required (every offered tool) or a named function (that one); a
// function without `parameters` takes any JSON object. special_markers is left for the caller (it has the tokenizer).
ToolCallConstraintSpec tool_choice_spec(const CompletionRequest& req, ToolCallFormat format);

// The grammar of the calls `spec` allows, in the syntax `template_source` (the chat template that renders the tool
// calls) teaches: hermes as Qwen's `<tool_call>\n{"name": N, "arguments": A}\n</tool_call>`, or, for a template
// writing `<tool_call>NAME {args}</tool_call>` (the embedded default model's), that form; Llama-3.x JSON as
// `{"name": N, "parameters": A}`; Mistral as `[TOOL_CALLS]N[ARGS]A` (v11+ templates, whose source has [ARGS]) or
// `[TOOL_CALLS][{"name": N, "arguments": A}]` (v3). Llama-3 and Mistral calls are one per turn (their templates
// write one). Throws ApiError(400): other formats (naming the format: Qwen3-Coder / Qwen3.5 XML needs raw-text
// parameter values, which the grammar engine does not express), a marker that is a special token (naming it), a
// parameters schema the compiler refuses (naming the tool and the keyword).
std::shared_ptr<const grammar::Grammar> compile_tool_choice(const ToolCallConstraintSpec& spec,
                                                            std::string_view template_source);
// A key naming what compile_tool_choice compiles (for StructuredOutputs' cache of recent grammars).
std::string tool_choice_key(const ToolCallConstraintSpec& spec, std::string_view template_source);
// The literal markers a format's constrained calls write (for finding those that are special tokens).
std::vector<std::string> tool_choice_markers(ToolCallFormat format);

}  // namespace tierlm::server
