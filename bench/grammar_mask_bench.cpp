// Structured output: the cost per token of the grammar constraint on the real Qwen3 vocabulary (151,669 tokens,
// .cache/tokenizers/qwen3 from tools/fetch_tokenizers.sh) for a realistic nested schema (tests/runtime/grammar/
// schemas.json #1: nested objects, an enum, an array, optional members, a nullable string, a maxLength), over the
// tokens the Qwen3 tokenizer gives for a document a model would write. Per token: mask() (state key, the mask from
// the grammar's cache or computed by the trie walk, written into 151,936 logits) + accept() + complete().
// "warm": the grammar's mask cache already holds the document's states (a schema seen before, as a server keeps
// its last 16 grammars); "cold": a freshly compiled grammar, every state's mask computed on first use. Reported:
// median / p90 / max microseconds of thread CPU time per token (counters; median_wall_us: the median in wall time),
// and the whole document per iteration as the time.
// Measured 2026-11-25 on the shared 2-core dev VM (load average ~13): warm median 11-22 us CPU per token (p90
// 22-26), cold median 28-37 us (p90 134-164 us; max ~9 ms: a trie walk from an open string state, once per state);
// masking 151,936 logits from a cached mask: 4 us CPU inside a string, 10-11 us on a property name.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <boost/json.hpp>

#include "runtime/grammar/grammar.h"
#include "runtime/grammar/vocabulary.h"
#include "runtime/tokenizer/tokenizer.h"

namespace {

namespace json = boost::json;
using namespace tierlm;

const std::filesystem::path kSource = TIERLM_SOURCE_DIR;
constexpr int64_t kModelVocabulary = 151936;  // Qwen3's embedding rows (beyond the tokenizer's 151,669)

const char* kDocument =
    R"({"id": 4812, "user": {"name": "Maria Lopez", "email": "maria.lopez@example.com", "address": )"
    R"({"city": "São Paulo", "zip": "01310-100"}}, "tags": ["premium", "early-adopter"], "status": "active", )"
    R"("score": 87.25, "verified": true})";

struct Fixture {
  tok::Tokenizer tokenizer;
  std::shared_ptr<const grammar::Vocabulary> vocabulary;
  json::value schema;
  std::vector<int32_t> tokens;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    const auto dir = kSource / ".cache/tokenizers/qwen3";
    if (!std::filesystem::exists(dir / "tokenizer.json"))
      throw std::runtime_error(dir.string() + " is missing: run tools/fetch_tokenizers.sh");
    auto tokenizer = tok::Tokenizer::load(dir);
    const auto t0 = std::chrono::steady_clock::now();
    auto vocabulary = grammar::build_vocabulary(tokenizer);
    std::fprintf(stderr, "vocabulary: %d tokens, %d trie nodes, built in %.0f ms\n", vocabulary->size(),
                 vocabulary->nodes(),
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    std::ifstream in(kSource / "tests/runtime/grammar/schemas.json");
    std::stringstream text;
    text << in.rdbuf();
    json::value schema = json::parse(text.str()).as_array().at(1);
    auto tokens = tokenizer.encode(kDocument, false);
    return Fixture{std::move(tokenizer), std::move(vocabulary), std::move(schema), std::move(tokens)};
  }();
  return f;
}

// This thread's CPU time: per-token figures that other processes on a shared machine do not inflate.
double thread_cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) / 1e3;
}

void run_document(benchmark::State& state, bool warm) {
  const Fixture& f = fixture();
  std::vector<float> logits(kModelVocabulary, 0.5f);
  const int32_t ends[1] = {151645};  // <|im_end|>
  std::vector<double> per_token, per_token_wall;
  auto shared = grammar::compile_json_schema(f.schema);
  if (warm) {  // one pass fills the cache
    auto c = grammar::make_constraint(shared, f.vocabulary);
    for (int32_t t : f.tokens) {
      c->mask(logits, ends);
      c->accept(t);
    }
  }
  for (auto _ : state) {
    state.PauseTiming();
    auto g = warm ? shared : grammar::compile_json_schema(f.schema);
    auto constraint = grammar::make_constraint(g, f.vocabulary);
    state.ResumeTiming();
    for (int32_t t : f.tokens) {
      const double c0 = thread_cpu_us();
      const auto t0 = std::chrono::steady_clock::now();
      constraint->mask(logits, ends);
      constraint->accept(t);
      benchmark::DoNotOptimize(constraint->complete());
      per_token_wall.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      per_token.push_back(thread_cpu_us() - c0);
    }
    if (!constraint->complete()) state.SkipWithError("the document did not complete the grammar");
  }
  std::sort(per_token.begin(), per_token.end());
  std::sort(per_token_wall.begin(), per_token_wall.end());
  state.counters["tokens"] = double(f.tokens.size());
  state.counters["median_us"] = per_token[per_token.size() / 2];
  state.counters["p90_us"] = per_token[per_token.size() * 9 / 10];
  state.counters["max_us"] = per_token.back();
  state.counters["median_wall_us"] = per_token_wall[per_token_wall.size() / 2];
}

void BM_NestedSchemaWarm(benchmark::State& state) { run_document(state, true); }
void BM_NestedSchemaCold(benchmark::State& state) { run_document(state, false); }
BENCHMARK(BM_NestedSchemaWarm)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_NestedSchemaCold)->Unit(benchmark::kMicrosecond)->Iterations(5);

// The masking alone: 151,936 logits through a cached mask, for a state that allows almost everything (inside a
// string) and one that allows almost nothing (a property name).
void BM_ApplyMask(benchmark::State& state) {
  const Fixture& f = fixture();
  auto g = grammar::compile_json_schema(f.schema);
  auto constraint = grammar::make_constraint(g, f.vocabulary);
  const std::string prefix = state.range(0) ? R"({"id": 1, "user": {"name": "Ma)" : R"({"id": 1, "us)";
  for (int32_t t : f.tokenizer.encode(prefix, false)) {
    std::vector<float> logits(kModelVocabulary);
    constraint->mask(logits, {});
    constraint->accept(t);
  }
  std::vector<float> logits(kModelVocabulary, 0.5f);
  for (auto _ : state) {
    constraint->mask(logits, {});
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_ApplyMask)->Arg(0)->Arg(1)->ArgNames({"in_string"})->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
