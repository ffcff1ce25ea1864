// Random walks of the grammar constraint over the real Qwen3 (byte-level BPE, 151k tokens) and Gemma-3
// (SentencePiece, 262k tokens) vocabularies for every schema of schemas.json: at each step the mask must leave a way
// on (a token, or the end where the text is complete); every finished output, decoded by the tokenizer, must parse
// and validate with python3-jsonschema (validate_outputs.py). Also: a text's tokens spell its exact bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <boost/json.hpp>

#include "runtime/grammar/grammar.h"
#include "runtime/grammar/vocabulary.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tierlm::grammar {
namespace {

namespace json = boost::json;
const std::filesystem::path kSource = TIERLM_SOURCE_DIR;

// Random walks: at each step the mask must leave a way on (a token, or the end when the text is complete); the
// end is taken at random when allowed; finished outputs go to python3-jsonschema.
void random_walks(const std::string& tokenizer_name, int seeds_per_schema) {
  const auto dir = kSource / ".cache/tokenizers" / tokenizer_name;
  if (!std::filesystem::exists(dir / "tokenizer.json"))
    GTEST_SKIP() << dir << " is missing: run tools/fetch_tokenizers.sh";
  const auto tokenizer = tok::Tokenizer::load(dir);
  const auto vocabulary = build_vocabulary(tokenizer);
  std::ifstream in(kSource / "tests/runtime/grammar/schemas.json");
  std::stringstream text;
  text << in.rdbuf();
  const json::array schemas = json::parse(text.str()).as_array();
  const int32_t end_token = tokenizer.vocab_size();  // an id no grammar token has
  const int32_t ends[1] = {end_token};
  std::vector<float> logits(size_t(end_token) + 1);
  std::string lines;
  int finished = 0, walks = 0;
  for (const auto& s : schemas) {
    const auto g = compile_json_schema(s);
    for (int seed = 0; seed < seeds_per_schema; ++seed, ++walks) {
      std::mt19937 rng(uint32_t(seed * 7919 + walks));
      auto constraint = make_constraint(g, vocabulary);
      std::vector<int32_t> ids;
      bool done = false;
      for (int step = 0; step < 300 && !done; ++step) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        ASSERT_TRUE(constraint->mask(logits, ends)) << "no way on after " << tokenizer.decode(ids, false);
        std::vector<int32_t> allowed, structural;
        for (int32_t id = 0; id < end_token; ++id) {
          if (std::isinf(logits[size_t(id)])) continue;
          allowed.push_back(id);
          const std::string& b = vocabulary->bytes(id);
          if (b.find_first_of("\"]}0123456789tfn,") != std::string::npos && b.size() <= 3) structural.push_back(id);
        }
        const bool end_allowed = !std::isinf(logits[size_t(end_token)]);
        if (end_allowed && (allowed.empty() || rng() % 3 == 0)) {
          done = true;
          break;
        }
        ASSERT_FALSE(allowed.empty()) << "neither a token nor the end allowed after " << tokenizer.decode(ids, false);
        const auto& pool = (!structural.empty() && rng() % 4 != 0) ? structural : allowed;
        const int32_t id = pool[rng() % pool.size()];
        constraint->accept(id);
        ids.push_back(id);
        if (constraint->complete()) done = true;
      }
      if (!done) continue;
      ++finished;
      json::object line;
      line["schema"] = s;
      line["text"] = tokenizer.decode(ids, false);
      lines += json::serialize(line) + "\n";
    }
  }
  EXPECT_GE(finished, walks * 3 / 4) << "too few walks finished within 300 tokens";
  const auto path = std::filesystem::temp_directory_path() / ("grammar_walks_" + tokenizer_name + ".jsonl");
  std::ofstream(path) << lines;
  const std::string command =
      "python3 " + (kSource / "tests/runtime/grammar/validate_outputs.py").string() + " < " + path.string();
  const int status = std::system(command.c_str());
  std::filesystem::remove(path);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "python3-jsonschema missing";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "some outputs did not validate (see above)";
}

TEST(GrammarWalk, Qwen3ByteLevelVocabulary) { random_walks("qwen3", 6); }
TEST(GrammarWalk, Gemma3SentencePieceVocabulary) { random_walks("gemma3", 3); }

TEST(GrammarVocabulary, TokensDecodeToTheirBytes) {
  for (const char* name : {"qwen3", "gemma3"}) {
    const auto dir = kSource / ".cache/tokenizers" / name;
    if (!std::filesystem::exists(dir / "tokenizer.json")) GTEST_SKIP() << dir << " is missing";
    const auto tokenizer = tok::Tokenizer::load(dir);
    const auto vocabulary = build_vocabulary(tokenizer);
    // A text's tokens, mid-sentence, spell exactly the text (spaces and multi-byte characters included).
    const std::string text = "x {\"city\": \"S\xC3\xA3o Paulo\", \"temp\": -3.5} \xE4\xBD\xA0\xE5\xA5\xBD";
    const auto ids = tokenizer.encode(text, false);
    std::string spelled;
    for (int32_t id : ids) spelled += vocabulary->bytes(id);
    EXPECT_EQ(spelled, text) << name;
  }
}

}  // namespace
}  // namespace tierlm::grammar
