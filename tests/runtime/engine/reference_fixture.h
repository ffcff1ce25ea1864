// tests/runtime/engine/reference_fixture.h — reading the transformers reference fixtures made by
// tools/make_fixtures.py (tests/fixtures/models/NAME/{config.json, model.safetensors, reference.json}) and comparing
// logits with them. Header-only; shared by the dense, MoE and GPU forward tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/json.hpp>

namespace tierlm::fixtures {

inline std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models" / name;
}

inline boost::json::value read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return boost::json::parse(ss.str());
}

inline std::vector<float> floats(const boost::json::value& v) {
  std::vector<float> out;
  for (auto& x : v.as_array()) out.push_back(float(x.to_number<double>()));
  return out;
}

// max |ours - ref| over max |ref|
inline double relative_error(const float* ours, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, double(std::fabs(ours[i] - ref[i])));
    den = std::max(den, double(std::fabs(ref[i])));
  }
  return num / std::max(den, 1e-12);
}

// The prompt (token ids) a fixture's reference.json was computed on.
inline std::vector<int32_t> reference_prompt(const std::filesystem::path& dir) {
  const boost::json::value ref = read_json(dir / "reference.json");  // named: a range-for would not keep it alive
  std::vector<int32_t> prompt;
  for (auto& t : ref.at("prompt").as_array()) prompt.push_back(int32_t(t.as_int64()));
  return prompt;
}

inline int32_t argmax(const float* x, int64_t n) { return int32_t(std::max_element(x, x + n) - x); }

}  // namespace tierlm::fixtures
