// server/tool_call_formats.h — the body grammars of each family's tool-call block, as pure functions from a closed
// block's text to calls (name + JSON arguments), and the markers that open and close the blocks. Used by
// assistant_output.cpp, which finds the blocks in streamed text. Never: throws on model output (a body that does not
// parse is nullopt, and its text goes back to the client as content).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/array.hpp>

#include "server/assistant_output.h"

namespace tierlm::server::toolfmt {

struct ParsedCall {
  std::string name;
  std::string arguments;  // serialized JSON object
};

struct BlockMarker {
  std::string open;
  std::string close;        // empty: the block runs to the end of the output
  bool at_start_only = false;  // only where nothing but whitespace came before it
};

// The markers of a format (empty for none and harmony, which has its own parser).
std::vector<BlockMarker> block_markers(ToolCallFormat format);

// Parses one block: `open` is the marker that opened it, `body` what came before its close marker (or the end).
// tools: the request's tools (qwen_xml types parameter values from their schemas).
std::optional<std::vector<ParsedCall>> parse_block(ToolCallFormat format, const BlockMarker& marker,
                                                   std::string_view body, const boost::json::array& tools);

// {"name": ..., "arguments"|"parameters": object or JSON string} -> a call; nullopt otherwise.
std::optional<ParsedCall> call_from_json_object(std::string_view json_text);
// Gemma 4's argument syntax ({key:<|"|>text<|"|>,n:3,xs:[1,2],o:{k:true}}) as JSON text; nullopt when malformed.
std::optional<std::string> gemma4_arguments_to_json(std::string_view text);

}  // namespace tierlm::server::toolfmt
