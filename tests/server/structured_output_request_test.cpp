// response_format in the OpenAI request decoder and the service's StructuredOutputs: the kinds, the 400s for a
// malformed response_format (naming the parameter) and for an unsupported schema keyword (naming the keyword), and
// a constraint that holds the default model's tokenizer to the schema.
#include <gtest/gtest.h>

#include <cmath>

#include <boost/json.hpp>

#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/structured_output.h"

namespace tierlm::server {
namespace {

const std::string kMessages = R"("messages":[{"role":"user","content":"hi"}])";

CompletionRequest parse(const std::string& format) {
  return parse_completion_request("{" + kMessages + ",\"response_format\":" + format + "}", Endpoint::chat);
}

void rejects(const std::string& format, const std::string& param) {
  try {
    parse(format);
    ADD_FAILURE() << "accepted " << format;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << format;
    EXPECT_EQ(e.param(), param) << format << ": " << e.what();
  }
}

TEST(StructuredOutputRequest, Kinds) {
  EXPECT_EQ(parse_completion_request("{" + kMessages + "}", Endpoint::chat).structured_output.kind,
            StructuredOutput::Kind::text);
  EXPECT_EQ(parse(R"({"type":"text"})").structured_output.kind, StructuredOutput::Kind::text);
  EXPECT_EQ(parse(R"({"type":"json_object"})").structured_output.kind, StructuredOutput::Kind::json_object);
  const auto r =
      parse(R"({"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{"type":"integer"}}})");
  EXPECT_EQ(r.structured_output.kind, StructuredOutput::Kind::json_schema);
  EXPECT_EQ(r.structured_output.name, "n");
  EXPECT_TRUE(r.structured_output.strict);
  EXPECT_EQ(boost::json::serialize(r.structured_output.schema), R"({"type":"integer"})");
}

TEST(StructuredOutputRequest, MalformedIsA400NamingTheParameter) {
  rejects(R"("json")", "response_format");
  rejects(R"({})", "response_format.type");
  rejects(R"({"type":"yaml"})", "response_format.type");
  rejects(R"({"type":"json_schema"})", "response_format.json_schema");
  rejects(R"({"type":"json_schema","json_schema":{"schema":{}}})", "response_format.json_schema.name");
  rejects(R"({"type":"json_schema","json_schema":{"name":"n","schema":[]}})", "response_format.json_schema.schema");
  rejects(R"({"type":"json_schema","json_schema":{"name":"n","strict":"yes"}})", "response_format.json_schema.strict");
}

TEST(StructuredOutputs, UnsupportedKeywordIsA400NamingIt) {
  StructuredOutputs outputs(tok::Tokenizer::load(std::string(TIERLM_SOURCE_DIR) + "/profiles/models/tierlm-tiny"),
                            nullptr);
  const auto r = parse(R"({"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object",
      "properties":{"n":{"type":"number","exclusiveMinimum":0}}}}})");
  try {
    outputs.constraint_for(r.structured_output);
    ADD_FAILURE() << "compiled a schema with exclusiveMinimum";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("exclusiveMinimum"), std::string::npos) << e.what();
    EXPECT_NE(e.param().find("exclusiveMinimum"), std::string::npos) << e.param();
  }
}

TEST(StructuredOutputs, ConstraintFollowsTheSchemaOnTheDefaultTokenizer) {
  const auto tokenizer = tok::Tokenizer::load(std::string(TIERLM_SOURCE_DIR) + "/profiles/models/tierlm-tiny");
  StructuredOutputs outputs(tokenizer, nullptr);
  EXPECT_EQ(outputs.constraint_for(parse(R"({"type":"text"})").structured_output), nullptr);
  const auto r = parse(R"({"type":"json_schema","json_schema":{"name":"n","schema":{"enum":["yes","no"]}}})");
  auto constraint = outputs.constraint_for(r.structured_output);
  ASSERT_NE(constraint, nullptr);
  // Greedy over logits that favour the highest id: the text must still be one of the enum's values.
  std::vector<float> logits(size_t(tokenizer.vocab_size()) + 7);
  const int32_t end[1] = {tokenizer.eos_ids().at(0)};
  std::vector<int32_t> ids;
  while (!constraint->complete() && ids.size() < 16) {
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(i);
    ASSERT_TRUE(constraint->mask(logits, end));
    const int32_t id = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (id == end[0]) break;
    constraint->accept(id);
    ids.push_back(id);
  }
  const std::string text = tokenizer.decode(ids, false);
  EXPECT_TRUE(text == "\"yes\"" || text == "\"no\"") << text;
  // The same schema again reuses the compiled grammar (and its masks): a second constraint starts afresh.
  EXPECT_NE(outputs.constraint_for(r.structured_output), nullptr);
}

}  // namespace
}  // namespace tierlm::server
