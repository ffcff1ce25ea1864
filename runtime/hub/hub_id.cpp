#include "runtime/hub/hub_id.h"

#include <cctype>
#include <filesystem>
#include <stdexcept>

namespace tierlm::hub {

namespace {

// The hub's own rule for a repo name part: letters, digits, '-', '_', '.', not starting or ending with '-' or '.',
// no "--" or "..", at most 96 characters.
bool valid_name_part(const std::string& part) {
  if (part.empty() || part.size() > 96) return false;
  for (char c : part)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  if (part.front() == '-' || part.front() == '.' || part.back() == '-' || part.back() == '.') return false;
  return part.find("--") == std::string::npos && part.find("..") == std::string::npos;
}

bool valid_revision(const std::string& revision) {
  if (revision.empty() || revision.size() > 255) return false;
  for (char c : revision)
    if (static_cast<unsigned char>(c) <= ' ' || c == '~' || c == '^' || c == ':' || c == '\\' || c == '?' ||
        c == '*' || c == '[')
      return false;
  return revision.find("..") == std::string::npos;
}

}  // namespace

bool is_commit_hash(const std::string& revision) {
  if (revision.size() != 40) return false;
  for (char c : revision)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

std::optional<HubId> parse_hub_id(const std::string& argument) {
  if (argument.empty()) return std::nullopt;
  std::error_code ec;
  if (std::filesystem::exists(argument, ec)) return std::nullopt;  // a local path wins
  const char first = argument.front();
  if (first == '/' || first == '.' || first == '~') return std::nullopt;
  HubId id;
  std::string rest = argument;
  const size_t at = argument.find('@');
  const size_t slash = argument.find('/');
  if (slash == std::string::npos || (at != std::string::npos && at < slash)) return std::nullopt;  // user@host/x
  if (argument.find('/', slash + 1) < at) return std::nullopt;  // a/b/c: a path (a revision may hold slashes)
  if (at != std::string::npos) {
    id.revision = argument.substr(at + 1);
    id.revision_given = true;
    rest = argument.substr(0, at);
    if (!valid_revision(id.revision))
      throw std::invalid_argument("'" + argument + "': the revision after '@' must be a branch, tag or commit hash");
  }
  const std::string org = rest.substr(0, slash), name = rest.substr(slash + 1);
  if (!valid_name_part(org) || !valid_name_part(name)) return std::nullopt;
  id.repo = rest;
  return id;
}

}  // namespace tierlm::hub
