// runtime/hub/remote_headers.h — what a model is, read from the hub without downloading it: config.json and the
// JSON header of every safetensors shard, each header by two HTTP Range reads (its 8-byte length, then the header),
// so a 40 GB repo costs kilobytes. Writes nothing to the cache.
#pragma once

#include <string>
#include <vector>

#include "runtime/hub/hub_id.h"

namespace tierlm::hub {

struct RemoteModel {
  std::string commit;
  std::string config_json;
  std::vector<std::pair<std::string, std::string>> shard_headers;  // shard file, its JSON header
  uint64_t bytes_fetched = 0;  // bodies received, API answers included
};

RemoteModel fetch_remote_model(const HubId& id);

}  // namespace tierlm::hub
