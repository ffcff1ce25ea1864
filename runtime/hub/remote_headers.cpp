#include "runtime/hub/remote_headers.h"

#include <cstring>

#include "runtime/hub/hub_error.h"
#include "runtime/hub/hub_http.h"
#include "runtime/hub/pull.h"

namespace tierlm::hub {

namespace {

std::string read_range(const HubSettings& settings, const HubId& id, const std::string& commit,
                       const std::string& file, uint64_t begin, uint64_t end_inclusive, uint64_t& fetched) {
  const std::string url =
      settings.endpoint + "/" + id.repo + "/resolve/" + url_quote(commit, false) + "/" + url_quote(file, true);
  const HttpReply reply = http_get_following(
      settings, url, {"Range: bytes=" + std::to_string(begin) + "-" + std::to_string(end_inclusive)});
  check_reply(reply, settings, id.display(), file, "reading the file's header");
  fetched += reply.body.size();
  const uint64_t want = end_inclusive - begin + 1;
  if (reply.status != 206 || reply.body.size() != want)
    throw HubError(id.display() + ": " + file + ": the server did not answer the range request (HTTP " +
                   std::to_string(reply.status) + ", " + std::to_string(reply.body.size()) + " bytes for " +
                   std::to_string(want) + "), so the header cannot be read without a full download.");
  return reply.body;
}

}  // namespace

RemoteModel fetch_remote_model(const HubId& id) {
  const HubSettings settings = HubSettings::from_env();
  if (settings.offline) throw HubError(id.display() + ": HF_HUB_OFFLINE is set; give the cached folder instead.");
  const RepoListing listing = list_repo_files(settings, id);
  RemoteModel remote;
  remote.commit = listing.commit;
  bool has_config = false;
  for (const auto& f : listing.files) has_config |= f == "config.json";
  if (!has_config) throw HubError(id.display() + ": the repo has no config.json.");
  const HttpReply config = http_get_following(
      settings, settings.endpoint + "/" + id.repo + "/resolve/" + listing.commit + "/config.json", {});
  check_reply(config, settings, id.display(), "config.json", "reading the model's config");
  remote.config_json = config.body;
  remote.bytes_fetched += config.body.size();
  for (const auto& f : listing.files) {
    if (f.size() <= 12 || f.compare(f.size() - 12, 12, ".safetensors") != 0 || f.find('/') != std::string::npos)
      continue;
    const std::string length_bytes = read_range(settings, id, listing.commit, f, 0, 7, remote.bytes_fetched);
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | uint8_t(length_bytes[size_t(i)]);
    if (length == 0 || length > (100u << 20))
      throw HubError(id.display() + ": " + f + ": a safetensors header of " + std::to_string(length) + " bytes is not plausible.");
    remote.shard_headers.emplace_back(f, read_range(settings, id, listing.commit, f, 8, 8 + length - 1,
                                                    remote.bytes_fetched));
  }
  return remote;
}

}  // namespace tierlm::hub
