// runtime/hub/hub_http.h — the hub's HTTP conventions over libcurl: the endpoint (HF_ENDPOINT), the token (HF_TOKEN,
// sent only to the endpoint's own origin, never logged), proxies from the environment (libcurl's own handling of
// http_proxy / https_proxy / no_proxy), and one request at a time for the small API calls and per-file metadata.
// Bulk transfers are the downloader's (curl multi); this file owns no file on disk.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tierlm::hub {

struct HubSettings {
  std::string endpoint;  // no trailing slash
  std::string token;     // empty: anonymous
  bool offline = false;  // HF_HUB_OFFLINE

  static HubSettings from_env();
  // The Authorization header for `url`, or "" when the URL is not on the endpoint's origin (a CDN redirect target
  // never sees the token).
  std::string authorization_for(const std::string& url) const;
};

struct HttpReply {
  long status = 0;
  std::map<std::string, std::string> headers;  // names lowercased; the last value wins
  std::string body;
  std::string transport_error;  // libcurl's description when no HTTP answer came
  std::string header(const std::string& lowercase_name) const {
    auto it = headers.find(lowercase_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// One request without following redirects. method: "GET" or "HEAD".
HttpReply http_request(const HubSettings& settings, const std::string& method, const std::string& url,
                       const std::vector<std::string>& extra_headers = {});

// A GET that follows redirects (relative and absolute, at most 10); the reply is the last response's.
HttpReply http_get_following(const HubSettings& settings, std::string url, const std::vector<std::string>& extra_headers);

// What the resolve endpoint says about one file, following redirects (relative and absolute) with HEAD requests.
struct FileMetadata {
  std::string commit;        // X-Repo-Commit
  std::string etag;          // X-Linked-Etag (LFS: the sha256) else ETag (git blob sha1), quotes and W/ removed
  uint64_t size = 0;         // X-Linked-Size else Content-Length
  bool lfs = false;          // X-Linked-Etag present: the etag is the content's sha256
  std::string download_url;  // the last URL of the redirect chain
};

// Percent-encodes every byte outside the URL-unreserved set, keeping '/' when keep_slash.
std::string url_quote(const std::string& text, bool keep_slash);

// Folds a transport failure or a non-2xx answer into a HubError naming repo and file (file may be empty) with what
// to do; returns normally for 2xx.
void check_reply(const HttpReply& reply, const HubSettings& settings, const std::string& repo, const std::string& file,
                 const std::string& what);

FileMetadata file_metadata(const HubSettings& settings, const std::string& repo, const std::string& commit,
                           const std::string& filename);

// libcurl's global state, initialised once for the process.
void ensure_curl_initialised();

}  // namespace tierlm::hub
