// Fuzzes config.json through parse_config, as load_config reads it. Anything missing, mistyped, out of range or
// unsupported must be a ModelError naming the field; a config that parses names a known architecture.
#include <cstdint>
#include <string>

#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"
#include "tests/fuzz/fuzz_harness.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tierlm::fuzz::silence_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierlm::model;
  try {
    const ModelConfig config = parse_config(std::string(tierlm::fuzz::as_text(data, size)), "fuzz/config.json");
    TIERLM_FUZZ_CHECK(find_architecture(config.model_type) != nullptr);
  } catch (const ModelError&) {
  }
  return 0;
}
