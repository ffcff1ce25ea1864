#include "runtime/hub/pull.h"

#include <algorithm>

#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "runtime/hub/downloader.h"
#include "runtime/hub/hub_cache.h"
#include "runtime/hub/hub_error.h"
#include "runtime/hub/hub_http.h"

namespace tierlm::hub {

namespace {

}  // namespace

RepoListing list_repo_files(const HubSettings& settings, const HubId& id) {
  const std::string url =
      settings.endpoint + "/api/models/" + id.repo + "/revision/" + url_quote(id.revision, false);
  const HttpReply reply = http_request(settings, "GET", url, {"Accept: application/json"});
  check_reply(reply, settings, id.display(), "", "reading the repo's file list");
  RepoListing listing;
  try {
    const boost::json::object info = boost::json::parse(reply.body).as_object();
    listing.commit = std::string(info.at("sha").as_string());
    for (const auto& sibling : info.at("siblings").as_array())
      listing.files.emplace_back(sibling.as_object().at("rfilename").as_string());
  } catch (const std::exception& e) {
    throw HubError(id.display() + ": the model-info answer from " + settings.endpoint + " is not what the hub sends (" +
                   e.what() + "). Is HF_ENDPOINT a Hugging Face hub or mirror?");
  }
  if (!is_commit_hash(listing.commit))
    throw HubError(id.display() + ": the hub named no commit for revision " + id.revision + ".");
  return listing;
}

namespace {

PulledModel from_cache(const RepoCache& cache, const std::string& commit) {
  PulledModel pulled;
  pulled.snapshot_dir = cache.snapshot_dir(commit).string();
  pulled.commit = commit;
  pulled.from_cache_only = true;
  return pulled;
}

}  // namespace

PulledModel pull(const HubId& id, const PullOptions& options) {
  const HubSettings settings = HubSettings::from_env();
  const RepoCache cache(cache_root_from_env(), id.repo);
  const auto cached_commit = cache.commit_for(id.revision);
  const bool cached_usable = cached_commit && cache.has_snapshot_file(*cached_commit, "config.json");
  if (settings.offline) {
    if (!cached_usable)
      throw HubError(id.display() + " is not in the Hugging Face cache at " + cache.root().string() +
                     " and HF_HUB_OFFLINE is set, so it cannot be downloaded. Unset HF_HUB_OFFLINE and run `tierlm "
                     "pull " + id.display() + "`, or point HF_HUB_CACHE / HF_HOME at the cache that holds it.");
    return from_cache(cache, *cached_commit);
  }

  RepoListing listing;
  try {
    listing = list_repo_files(settings, id);
  } catch (const HubError& e) {
    // The hub is unreachable but the cache has this revision: use it, as the Python client does.
    const std::string what = e.what();
    if (cached_usable && what.find("network error") != std::string::npos) {
      spdlog::warn("hub: {}; using the cached snapshot {}", what, *cached_commit);
      return from_cache(cache, *cached_commit);
    }
    throw;
  }
  const std::vector<std::string> selected = select_files(listing.files, options.filter);
  const bool default_filter = !options.filter.only_include && options.filter.include.empty();
  const bool has_weights = std::any_of(selected.begin(), selected.end(), [](const std::string& f) {
    return f.size() > 12 && f.compare(f.size() - 12, 12, ".safetensors") == 0;
  });
  if (default_filter && (!has_weights || std::find(selected.begin(), selected.end(), "config.json") == selected.end()))
    throw HubError(id.display() + ": the repo has no config.json and safetensors weights, which tierlm needs "
                   "(its files: " + std::to_string(listing.files.size()) +
                   "; e.g. GGUF or PyTorch .bin only). Pick a safetensors repo, or name files with --include.");
  if (selected.empty()) throw HubError(id.display() + ": --include/--exclude leave no file to fetch.");

  std::vector<BlobTask> tasks;
  for (const auto& file : selected) {
    if (cache.has_snapshot_file(listing.commit, file)) continue;  // fetched before, by us or another client
    BlobTask task{file, file_metadata(settings, id.repo, listing.commit, file)};
    if (!task.meta.commit.empty() && task.meta.commit != listing.commit)
      throw HubError(id.display() + ": " + file + ": the hub moved from commit " + listing.commit + " to " +
                     task.meta.commit + " during the download; run the same command again.");
    tasks.push_back(std::move(task));
  }
  std::filesystem::create_directories(cache.snapshot_dir(listing.commit));
  PulledModel pulled;
  pulled.commit = listing.commit;
  pulled.snapshot_dir = cache.snapshot_dir(listing.commit).string();
  pulled.files = selected.size();
  if (!tasks.empty()) {
    const DownloadReport report = download_blobs(settings, cache, id.display(), listing.commit, tasks, options.parallel);
    pulled.bytes_fetched = report.bytes_fetched;
    if (!report.errors.empty()) {
      std::string message;
      for (const auto& error : report.errors) message += (message.empty() ? "" : "\n") + error;
      throw HubError(message);
    }
  }
  cache.write_ref(id.revision, listing.commit);
  pulled.from_cache_only = tasks.empty();
  return pulled;
}

std::string resolve_model_argument(const std::string& argument) {
  const auto id = parse_hub_id(argument);
  if (!id) return argument;
  const PulledModel pulled = pull(*id, PullOptions{});
  spdlog::info("hub: {} is {} ({})", id->display(), pulled.snapshot_dir,
               pulled.from_cache_only ? "from the cache" : "downloaded " + std::to_string(pulled.bytes_fetched) + " bytes");
  return pulled.snapshot_dir;
}

}  // namespace tierlm::hub
