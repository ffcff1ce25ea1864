// runtime/hub/hub_id.h — a Hugging Face repo id as the user writes it: ORG/NAME[@REVISION]. Owns only the parsing
// and the rule that an existing local path always wins over an id; it never touches the network or the cache.
#pragma once

#include <optional>
#include <string>

namespace tierlm::hub {

struct HubId {
  std::string repo;                // "ORG/NAME"
  std::string revision = "main";  // branch, tag or 40-hex commit
  bool revision_given = false;

  std::string display() const { return revision_given ? repo + "@" + revision : repo; }
};

// The id `argument` names, or nothing when it is a local path (one that exists, or one written as a path: absolute,
// ./, ../, ~) or not shaped like ORG/NAME[@REV]. Throws std::invalid_argument for an id-shaped argument with an
// empty or malformed part (e.g. "org/name@").
std::optional<HubId> parse_hub_id(const std::string& argument);

// True when `revision` is a full commit hash (40 lowercase hex digits).
bool is_commit_hash(const std::string& revision);

}  // namespace tierlm::hub
