// runtime/model/config_keys.h — the audit of config.json keys: per family, the keys that change the math and are
// read; the keys known not to change it (bookkeeping, training-only); and keys known to change the math that the
// engine does not implement, refused by name at load whenever they are set to something other than their neutral
// value. Any other key is unread: load logs it (a warning naming it), and the fixture test fails on it, so a new
// math key is noticed instead of silently ignored.
// Never: read values into ModelConfig (that is config.cpp); decide on anything but names and neutral values.
#pragma once

#include <string>
#include <vector>

#include <boost/json/object.hpp>

#include "runtime/model/config.h"

namespace tierlm::model {

// The math keys a family reads, common ones included, sorted.
std::vector<std::string> config_keys_read(const ArchitectureSpec& arch);
// Keys that never change what the model computes at inference.
bool is_bookkeeping_key(const std::string& key);
// Keys of `config` that are neither read by the family, nor bookkeeping, nor known-and-refused-unless-neutral,
// sorted.
std::vector<std::string> unread_config_keys(const boost::json::object& config, const ArchitectureSpec& arch);
// Throws ModelError naming the first known-but-unimplemented math key set to a non-neutral value.
void refuse_unimplemented_keys(const boost::json::object& config, const ArchitectureSpec& arch,
                               const std::string& origin);
// Logs (warning) the unread keys, once per load.
void warn_unread_keys(const boost::json::object& config, const ArchitectureSpec& arch, const std::string& origin);

}  // namespace tierlm::model
