// tests/runtime/engine/reference_fixture.h — reading the transformers reference fixtures made by
// tools/make_fixtures.py (tests/fixtures/models/NAME/{config.json, model.safetensors, reference.json}) and comparing
// logits with them, and running a loaded model through a fixture's prompt and greedy steps. Header-only; shared by
// the dense, MoE and GPU forward tests.
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

#include "runtime/engine/forward.h"

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

// Every position's logits of `prompt` run in chunks of `chunk` tokens on a fresh cache (2 threads, context 64).
inline std::vector<float> chunked_logits(const model::ModelWeights& w, tiering::Ledger& ledger,
                                         std::span<const int32_t> prompt, int64_t chunk) {
  const int64_t V = w.config.vocab_size, n = int64_t(prompt.size());
  kernels::ThreadPool pool(2);
  engine::Forward forward(w, pool, ledger, std::min<int64_t>(chunk, 32), 64);
  engine::KVCache cache(w.config, 64, ledger);
  std::vector<float> logits(size_t(n * V));
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t len = std::min(chunk, n - at);
    forward.run(prompt.subspan(size_t(at), size_t(len)), at, cache, logits.data() + at * V, true);
  }
  return logits;
}

// max |a - b| over two runs' logits.
inline double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) err = std::max(err, double(std::fabs(a[i] - b[i])));
  return err;
}

struct ReferenceMatch {
  double prompt_error = 0, step_error = 0;
  int greedy_matches = 0, greedy_total = 0;
};

// The fixture's prompt through `w` in chunks of `chunk` tokens (every position's logits), then its greedy steps,
// each against reference.json (2 threads, chunks up to 64, context 128).
inline ReferenceMatch match_reference(const model::ModelWeights& w, tiering::Ledger& ledger,
                                      const std::filesystem::path& dir, int64_t chunk) {
  const boost::json::value ref = read_json(dir / "reference.json");
  const std::vector<int32_t> prompt = reference_prompt(dir);
  const int64_t V = w.config.vocab_size, n = int64_t(prompt.size());
  kernels::ThreadPool pool(2);
  engine::Forward forward(w, pool, ledger, 64, 128);
  engine::KVCache cache(w.config, 128, ledger);
  std::vector<float> logits(size_t(n * V));
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t len = std::min(chunk, n - at);
    forward.run(std::span(prompt).subspan(size_t(at), size_t(len)), at, cache, logits.data() + at * V, true);
  }
  ReferenceMatch m;
  const auto& prompt_logits = ref.at("prompt_logits").as_array();
  for (int64_t i = 0; i < n; ++i)
    m.prompt_error = std::max(m.prompt_error, relative_error(&logits[size_t(i * V)], floats(prompt_logits[size_t(i)])));
  const auto& greedy = ref.at("greedy").as_array();
  const auto& steps = ref.at("step_logits").as_array();
  int32_t next = argmax(&logits[size_t((n - 1) * V)], V);
  std::vector<float> step(static_cast<size_t>(V));
  for (size_t s = 0; s < greedy.size(); ++s) {
    const int32_t expected = int32_t(greedy[s].as_int64());
    m.greedy_matches += next == expected;
    ++m.greedy_total;
    forward.run(std::span(&expected, 1), n + int64_t(s), cache, step.data());
    m.step_error = std::max(m.step_error, relative_error(step.data(), floats(steps[s])));
    next = argmax(step.data(), V);
  }
  return m;
}

}  // namespace tierlm::fixtures
