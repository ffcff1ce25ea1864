// tests/fuzz/fuzz_harness.h — what every libFuzzer harness shares: the two entry points it defines, a scratch file
// for parsers that read a path, and the rule that only a parser's own error type may leave it.
// A harness catches exactly the exception its parser documents for bad input; anything else (another exception, a
// sanitizer report, an abort) escapes to libFuzzer, or to replay_main.cpp in the ordinary build, as a crash.
// Never: hides an unexpected exception, or depends on state left by an earlier input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace tierlm::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The source tree (fixtures the harnesses read once at start).
inline std::filesystem::path source_dir() { return TIERLM_SOURCE_DIR; }

// A file named `name` in a private temporary folder, rewritten for every input; the folder goes with the process.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& name);
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& folder() const { return folder_; }
  void write(const uint8_t* data, size_t size) const;

 private:
  std::filesystem::path folder_, path_;
};

// This process's scratch file, created on the first call with the name the parser expects (later names are ignored:
// one harness, one file).
const ScratchFile& scratch_file(const std::string& name);

// A broken invariant of a parser's successful result: report it and abort (libFuzzer saves the input).
[[noreturn]] inline void invariant_failed(const char* what) {
  std::fprintf(stderr, "fuzz: invariant broken: %s\n", what);
  std::abort();
}
#define TIERLM_FUZZ_CHECK(condition) \
  do {                               \
    if (!(condition)) ::tierlm::fuzz::invariant_failed(#condition); \
  } while (0)

// Logs of the parsers under test go nowhere (millions of inputs).
void silence_logs();

}  // namespace tierlm::fuzz
