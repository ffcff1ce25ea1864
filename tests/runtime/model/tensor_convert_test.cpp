#include "runtime/model/tensor_convert.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "tests/runtime/model/safetensors_writer.h"

using namespace tierlm::model;
using namespace tierlm::test;

namespace {

// Oracles from the definitions of the formats (value = (-1)^s * 2^(e-bias) * 1.m, or 2^(1-bias) * 0.m), computed
// with ldexp in double and narrowed: exact, since every half/bfloat16 value is a float.
float reference_f16(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0x1f)
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exponent == 0)
    magnitude = std::ldexp(static_cast<double>(mantissa), -24);
  else
    magnitude = std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  return static_cast<float>(sign ? -magnitude : magnitude);
}

float reference_bf16(uint16_t b) {
  const int sign = b >> 15, exponent = (b >> 7) & 0xff, mantissa = b & 0x7f;
  double magnitude;
  if (exponent == 0xff)
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exponent == 0)
    magnitude = std::ldexp(static_cast<double>(mantissa), -133);
  else
    magnitude = std::ldexp(1.0 + mantissa / 128.0, exponent - 127);
  return static_cast<float>(sign ? -magnitude : magnitude);
}

void expect_same(float got, float want, uint16_t bits) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << std::hex << bits;
    EXPECT_EQ(std::signbit(got), std::signbit(want)) << std::hex << bits;
  } else {
    EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << std::hex << bits << " " << got;
  }
}

std::vector<uint16_t> all_patterns() {
  std::vector<uint16_t> out(65536);
  for (uint32_t i = 0; i < 65536; ++i) out[i] = static_cast<uint16_t>(i);
  return out;
}

}  // namespace

TEST(TensorConvert, HalfAllBitPatternsExact) {
  for (uint32_t i = 0; i < 65536; ++i) expect_same(f16_bits_to_f32(i), reference_f16(i), i);
  // Spot checks of the boundary values.
  EXPECT_EQ(f16_bits_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_bits_to_f32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_bits_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_bits_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(std::bit_cast<uint32_t>(f16_bits_to_f32(0x8000)), 0x80000000u);  // -0
  // NaN payloads survive widening (top mantissa bits).
  EXPECT_EQ(std::bit_cast<uint32_t>(f16_bits_to_f32(0x7e01)), 0x7fc02000u);
}

TEST(TensorConvert, BFloat16AllBitPatternsExact) {
  for (uint32_t i = 0; i < 65536; ++i) expect_same(bf16_bits_to_f32(i), reference_bf16(i), i);
  EXPECT_EQ(bf16_bits_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(std::bit_cast<uint32_t>(bf16_bits_to_f32(0x7fc1)), 0x7fc10000u);
}

TEST(TensorConvert, FromFileAllDTypesUnaligned) {
  TempDir dir;
  const auto patterns = all_patterns();
  std::vector<float> floats = {1.5f, -0.0f, std::numeric_limits<float>::denorm_min(), 3e38f};
  // A 1-byte tensor first and an odd header pad put the 16-bit data at odd addresses.
  write_bytes(dir / "model.safetensors",
              build_file({{"pad", "U8", {1}, {0}},
                          {"half", "F16", {256, 256}, bytes_of(patterns)},
                          {"brain", "BF16", {65536}, bytes_of(patterns)},
                          {"single", "F32", {2, 2}, bytes_of(floats)},
                          {"ints", "I32", {1}, {1, 0, 0, 0}},
                          {"empty", "F16", {0}, {}}},
                         {}, 1));
  TensorIndex index = TensorIndex::open(dir.path);

  std::vector<float> half = tensor_to_f32(index, index.at("half"));
  ASSERT_EQ(half.size(), 65536u);
  for (uint32_t i = 0; i < 65536; ++i) expect_same(half[i], reference_f16(i), i);

  std::vector<float> brain(65536);
  tensor_to_f32(index, index.at("brain"), brain.data());
  for (uint32_t i = 0; i < 65536; ++i) expect_same(brain[i], reference_bf16(i), i);

  std::vector<float> single = tensor_to_f32(index, index.at("single"));
  ASSERT_EQ(single.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(single[i]), std::bit_cast<uint32_t>(floats[i]));

  EXPECT_TRUE(tensor_to_f32(index, index.at("empty")).empty());

  try {
    tensor_to_f32(index, index.at("ints"));
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("'ints'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("I32"), std::string::npos) << e.what();
  }
  float sink = 0;
  EXPECT_THROW(tensor_to_f32(index, index.at("ints"), &sink), ModelError);
}
