// runtime/hub/blob_check.h — is a downloaded file the one the hub named? LFS files are named by the sha256 of their
// content, other files by their git blob sha1 ("blob LEN\0" + content). Reads the file; never changes it.
#pragma once

#include <filesystem>
#include <string>

namespace tierlm::hub {

// Lowercase hex digest of the file's content (sha256) or of its git blob object (sha1).
std::string file_sha256(const std::filesystem::path& path);
std::string file_git_blob_sha1(const std::filesystem::path& path);

// True when `path` hashes to `etag`: sha256 when lfs, the git blob sha1 otherwise.
bool matches_etag(const std::filesystem::path& path, const std::string& etag, bool lfs);

}  // namespace tierlm::hub
