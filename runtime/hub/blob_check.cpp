#include "runtime/hub/blob_check.h"

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <vector>

#include <openssl/evp.h>

namespace tierlm::hub {

namespace {

std::string digest_file(const std::filesystem::path& path, const EVP_MD* algorithm, const std::string& prefix) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw std::runtime_error("cannot read " + path.string());
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> context(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!context || EVP_DigestInit_ex(context.get(), algorithm, nullptr) != 1)
    throw std::runtime_error("OpenSSL digest unavailable");
  EVP_DigestUpdate(context.get(), prefix.data(), prefix.size());
  std::vector<unsigned char> buffer(1 << 20);
  size_t got;
  while ((got = std::fread(buffer.data(), 1, buffer.size(), file.get())) > 0)
    EVP_DigestUpdate(context.get(), buffer.data(), got);
  if (std::ferror(file.get())) throw std::runtime_error("read error on " + path.string());
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(context.get(), digest, &length);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

}  // namespace

std::string file_sha256(const std::filesystem::path& path) { return digest_file(path, EVP_sha256(), ""); }

std::string file_git_blob_sha1(const std::filesystem::path& path) {
  const std::string header = "blob " + std::to_string(std::filesystem::file_size(path));
  return digest_file(path, EVP_sha1(), std::string(header.data(), header.size() + 1));  // with the NUL
}

bool matches_etag(const std::filesystem::path& path, const std::string& etag, bool lfs) {
  return (lfs ? file_sha256(path) : file_git_blob_sha1(path)) == etag;
}

}  // namespace tierlm::hub
