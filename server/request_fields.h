// server/request_fields.h — the one list of request-body fields each route implements. A field not in its route's
// list is refused with 400 naming it ("Unrecognized request argument supplied: X"), never silently ignored, so a
// client that asks for something tierlm does not do finds out. Adding support for a field means adding it here.
// Never: validates values (the route's decoder does that).
#pragma once

#include <span>
#include <string_view>

#include <boost/json/object.hpp>

namespace tierlm::server {

enum class BodyKind { chat_completions, completions, anthropic_messages, anthropic_count_tokens, responses };

// The fields a route accepts at the top level of its JSON body.
std::span<const std::string_view> accepted_fields(BodyKind kind);
// Throws ApiError(400, param = the field) for the first field `body` has that `kind` does not accept.
void reject_unknown_fields(const boost::json::object& body, BodyKind kind);
// The same for a nested object (e.g. stream_options), naming the field as "parent.field".
void reject_unknown_fields(const boost::json::object& object, std::span<const std::string_view> accepted,
                           std::string_view parent);

}  // namespace tierlm::server
