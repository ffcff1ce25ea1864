// tests/fuzz/fuzz_harness.cpp — the shared pieces of fuzz_harness.h.
#include "tests/fuzz/fuzz_harness.h"

#include <unistd.h>

#include <fstream>
#include <stdexcept>

#include <spdlog/spdlog.h>

namespace tierlm::fuzz {

ScratchFile::ScratchFile(const std::string& name) {
  // /dev/shm when there is one: libFuzzer writes this file thousands of times a second.
  std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
  std::string pattern = (base / "tierlm-fuzz-XXXXXX").string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("fuzz: cannot create a scratch folder under " + base.string());
  folder_ = pattern;
  path_ = folder_ / name;
}

ScratchFile::~ScratchFile() {
  std::error_code ignored;
  std::filesystem::remove_all(folder_, ignored);
}

void ScratchFile::write(const uint8_t* data, size_t size) const {
  std::ofstream out(path_, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) throw std::runtime_error("fuzz: cannot write " + path_.string());
}

const ScratchFile& scratch_file(const std::string& name) {
  static const ScratchFile file(name);
  return file;
}

void silence_logs() { spdlog::set_level(spdlog::level::off); }

}  // namespace tierlm::fuzz
