// Fuzzes a safetensors file (8-byte header length, JSON header, data) through TensorIndex::open_file, the loader's
// own path (the file is memory-mapped), then reads every tensor's bytes. Bad files must end in ModelError; a file
// that opens must keep every tensor inside the file with the byte length its dtype and shape need.
#include <cstdint>
#include <filesystem>

#include "runtime/model/safetensors.h"
#include "tests/fuzz/fuzz_harness.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tierlm::fuzz::silence_logs();
  (void)tierlm::fuzz::scratch_file("model.safetensors");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tierlm::model;
  const auto& scratch = tierlm::fuzz::scratch_file("model.safetensors");
  scratch.write(data, size);
  try {
    const TensorIndex index = TensorIndex::open_file(scratch.path());
    for (const auto& [name, info] : index.tensors()) {
      TIERLM_FUZZ_CHECK(info.offset <= size && info.length <= size - info.offset);
      TIERLM_FUZZ_CHECK(info.length == static_cast<uint64_t>(info.elements()) * dtype_size(info.dtype));
      const auto bytes = index.data(info);
      TIERLM_FUZZ_CHECK(bytes.size() == info.length);
      unsigned sum = 0;
      for (std::byte b : bytes) sum += static_cast<unsigned>(b);
      TIERLM_FUZZ_CHECK(bytes.empty() || std::to_integer<uint8_t>(bytes[0]) == data[info.offset]);
      (void)sum;
    }
  } catch (const ModelError&) {
  }
  return 0;
}
