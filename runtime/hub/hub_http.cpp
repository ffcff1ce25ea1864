#include "runtime/hub/hub_http.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include <curl/curl.h>

#include "runtime/hub/hub_error.h"

namespace tierlm::hub {

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

bool truthy(std::string value) {
  std::transform(value.begin(), value.end(), value.begin(), [](unsigned char c) { return char(std::toupper(c)); });
  return value == "1" || value == "ON" || value == "YES" || value == "TRUE";
}

std::string trim(std::string text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  size_t start = 0;
  while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
  return text.substr(start);
}

// scheme://host[:port] of a URL, lowercased.
std::string origin_of(const std::string& url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return "";
  const size_t path_start = url.find('/', scheme_end + 3);
  std::string origin = url.substr(0, path_start);
  std::transform(origin.begin(), origin.end(), origin.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return origin;
}

std::string normalize_etag(std::string etag) {
  etag = trim(etag);
  if (etag.rfind("W/", 0) == 0) etag = etag.substr(2);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return etag;
}

size_t collect_body(char* data, size_t size, size_t count, void* user) {
  static_cast<std::string*>(user)->append(data, size * count);
  return size * count;
}

size_t collect_header(char* data, size_t size, size_t count, void* user) {
  auto* reply = static_cast<HttpReply*>(user);
  const std::string line(data, size * count);
  if (line.rfind("HTTP/", 0) == 0) {
    reply->headers.clear();  // a new response (after a 100 Continue or a proxy CONNECT)
    return size * count;
  }
  const size_t colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    reply->headers[name] = trim(line.substr(colon + 1));
  }
  return size * count;
}

// Resolves a Location header against the URL that sent it.
std::string absolute_location(const std::string& base, const std::string& location) {
  if (location.find("://") != std::string::npos) return location;
  if (!location.empty() && location.front() == '/') return origin_of(base) + location;
  const size_t last_slash = base.rfind('/');
  return base.substr(0, last_slash + 1) + location;
}

}  // namespace

void ensure_curl_initialised() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

HubSettings HubSettings::from_env() {
  HubSettings s;
  s.endpoint = env("HF_ENDPOINT");
  if (s.endpoint.empty()) s.endpoint = "https://huggingface.co";
  while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
  s.token = env("HF_TOKEN");
  if (s.token.empty()) s.token = env("HUGGING_FACE_HUB_TOKEN");
  if (s.token.empty()) {  // the file `huggingface-cli login` writes
    std::string path = env("HF_TOKEN_PATH");
    if (path.empty() && !env("HF_HOME").empty()) path = env("HF_HOME") + "/token";
    if (path.empty() && !env("XDG_CACHE_HOME").empty()) path = env("XDG_CACHE_HOME") + "/huggingface/token";
    if (path.empty()) path = env("HOME") + "/.cache/huggingface/token";
    std::ifstream in(path);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      s.token = trim(text.str());
    }
  }
  s.offline = truthy(env("HF_HUB_OFFLINE"));
  return s;
}

std::string HubSettings::authorization_for(const std::string& url) const {
  if (token.empty() || origin_of(url) != origin_of(endpoint)) return "";
  return "Authorization: Bearer " + token;
}

std::string url_quote(const std::string& text, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += char(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

HttpReply http_request(const HubSettings& settings, const std::string& method, const std::string& url,
                       const std::vector<std::string>& extra_headers) {
  ensure_curl_initialised();
  HttpReply reply;
  CURL* curl = curl_easy_init();
  if (!curl) {
    reply.transport_error = "libcurl could not start a request";
    return reply;
  }
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Accept-Encoding: identity");
  headers = curl_slist_append(headers, "User-Agent: tierlm/0.1 (hub client)");
  if (const std::string auth = settings.authorization_for(url); !auth.empty())
    headers = curl_slist_append(headers, auth.c_str());
  for (const auto& h : extra_headers) headers = curl_slist_append(headers, h.c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  if (method == "HEAD") curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 30L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);  // no byte for 60 s: the connection is gone
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply.body);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, collect_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &reply);
  const CURLcode rc = curl_easy_perform(curl);
  if (rc != CURLE_OK) {
    reply.transport_error = curl_easy_strerror(rc);
  } else {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply.status);
  }
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return reply;
}

HttpReply http_get_following(const HubSettings& settings, std::string url, const std::vector<std::string>& extra_headers) {
  for (int hop = 0;; ++hop) {
    HttpReply reply = http_request(settings, "GET", url, extra_headers);
    const bool redirect = reply.transport_error.empty() && reply.status >= 300 && reply.status < 400 &&
                          !reply.header("location").empty();
    if (!redirect || hop >= 10) return reply;
    url = absolute_location(url, reply.header("location"));
  }
}

void check_reply(const HttpReply& reply, const HubSettings& settings, const std::string& repo, const std::string& file,
                 const std::string& what) {
  const std::string where = file.empty() ? repo : repo + ": " + file;
  const std::string rerun = " Files already complete are kept; run the same command again to resume.";
  if (!reply.transport_error.empty())
    throw HubError(where + ": network error while " + what + " from " + settings.endpoint + " (" +
                   reply.transport_error + "). Check the connection, HF_ENDPOINT and any proxy settings." + rerun);
  if (reply.status >= 200 && reply.status < 300) return;
  const std::string code = reply.header("x-error-code"), message = reply.header("x-error-message");
  const std::string hub_said = message.empty() ? "" : " (the hub says: " + message + ")";
  const std::string page = settings.endpoint + "/" + repo;
  switch (reply.status) {
    case 401:
      throw HubError(where + ": HTTP 401, the repo is gated or private and needs a token" + hub_said + ". " +
                     (settings.token.empty() ? "Set HF_TOKEN to a read token of an account with access"
                                             : "The token in HF_TOKEN was not accepted: check it") +
                     " (for a gated model, accept its terms at " + page + ").");
    case 403:
      throw HubError(where + ": HTTP 403, access denied" + hub_said + ". The repo is gated: accept its terms at " +
                     page + " with the account whose token is in HF_TOKEN, or use a token with read access.");
    case 404:
      if (code == "EntryNotFound" || (!file.empty() && code != "RepoNotFound" && code != "RevisionNotFound"))
        throw HubError(where + ": HTTP 404, no such file in the repo" + hub_said + ". Check --include/--exclude "
                       "and the revision.");
      if (code == "RevisionNotFound")
        throw HubError(repo + ": HTTP 404, revision not found" + hub_said + ". Check the name after '@'.");
      throw HubError(repo + ": HTTP 404, no such repo at " + settings.endpoint + hub_said +
                     ". Check the id (ORG/NAME) or give a local folder; a private repo also needs HF_TOKEN.");
    default:
      throw HubError(where + ": HTTP " + std::to_string(reply.status) + " while " + what + hub_said +
                     (reply.status == 429 || reply.status >= 500 ? ". The hub is busy or failing: try again later."
                                                                 : ".") +
                     rerun);
  }
}

FileMetadata file_metadata(const HubSettings& settings, const std::string& repo, const std::string& commit,
                           const std::string& filename) {
  FileMetadata meta;
  std::string url = settings.endpoint + "/" + repo + "/resolve/" + url_quote(commit, false) + "/" +
                    url_quote(filename, true);
  for (int hop = 0;; ++hop) {
    const HttpReply reply = http_request(settings, "HEAD", url);
    if (meta.commit.empty()) meta.commit = reply.header("x-repo-commit");
    if (meta.etag.empty() && !reply.header("x-linked-etag").empty()) {
      meta.etag = normalize_etag(reply.header("x-linked-etag"));
      meta.lfs = true;
    }
    if (meta.size == 0 && !reply.header("x-linked-size").empty())
      meta.size = std::strtoull(reply.header("x-linked-size").c_str(), nullptr, 10);
    const bool redirect = reply.transport_error.empty() && reply.status >= 300 && reply.status < 400 &&
                          !reply.header("location").empty();
    if (redirect && hop < 10) {
      // The resolve answer (not the CDN's) carries the file's git ETag for non-LFS files.
      if (meta.etag.empty() && !reply.header("x-repo-commit").empty() && !reply.header("etag").empty())
        meta.etag = normalize_etag(reply.header("etag"));
      url = absolute_location(url, reply.header("location"));
      continue;
    }
    check_reply(reply, settings, repo, filename, "reading the file's metadata");
    if (meta.etag.empty()) meta.etag = normalize_etag(reply.header("etag"));
    if (meta.size == 0) meta.size = std::strtoull(reply.header("content-length").c_str(), nullptr, 10);
    meta.download_url = url;
    break;
  }
  if (meta.etag.empty() || meta.etag.find('/') != std::string::npos || meta.etag.find("..") != std::string::npos)
    throw HubError(repo + ": " + filename + ": the hub sent no usable ETag, so the file cannot be cached safely.");
  return meta;
}

}  // namespace tierlm::hub
