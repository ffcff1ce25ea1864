// AssistantOutputParser on model outputs in each family's real wire format (as the families' chat templates render
// assistant tool calls and as the models emit them), including malformed and truncated ones. Every case is parsed
// whole, byte by byte, at every two-way split, and token by token (the embedded model's byte-level BPE, and the
// family's real vocabulary when tools/fetch_tokenizers.sh has fetched it): all must equal the expected result.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "runtime/tokenizer/tokenizer.h"
#include "server/assistant_output.h"
#include "server/tool_call_formats.h"

namespace tierlm::server {
namespace {

namespace json = boost::json;

struct ExpectedCall {
  std::string name;
  std::string arguments;  // JSON, compared as values
};

struct Case {
  std::string name;
  ToolCallFormat format;
  std::string text;
  std::string reasoning;
  std::string content;
  std::vector<ExpectedCall> calls;
  bool split_reasoning = false;
  bool starts_in_reasoning = false;
  std::string vocab;  // .cache/tokenizers/<vocab> for the token-by-token split
};

const std::filesystem::path kSource = TIERLM_SOURCE_DIR;

AssistantOutputOptions options_of(const Case& c) {
  AssistantOutputOptions o;
  o.format = c.format;
  o.parse_tool_calls = true;
  o.split_reasoning = c.split_reasoning;
  o.starts_in_reasoning = c.starts_in_reasoning;
  o.id_prefix = "call_t";
  o.tools = json::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"},"note":{"type":"string"}}}}}])")
                .as_array();
  return o;
}

AssistantDelta run_pieces(const Case& c, const std::vector<std::string>& pieces) {
  AssistantOutputParser p(options_of(c));
  AssistantDelta out;
  for (const auto& piece : pieces) out.append(p.push(piece));
  out.append(p.finish());
  return out;
}

void expect_result(const Case& c, const AssistantDelta& got, const std::string& how) {
  SCOPED_TRACE(c.name + " (" + how + ")");
  EXPECT_EQ(got.reasoning, c.reasoning);
  EXPECT_EQ(got.content, c.content);
  ASSERT_EQ(got.tool_calls.size(), c.calls.size());
  for (size_t i = 0; i < c.calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].id, "call_t" + std::to_string(i));
    EXPECT_EQ(got.tool_calls[i].name, c.calls[i].name);
    EXPECT_EQ(json::parse(got.tool_calls[i].arguments), json::parse(c.calls[i].arguments)) << got.tool_calls[i].arguments;
    EXPECT_TRUE(json::parse(got.tool_calls[i].arguments).is_object());
  }
}

std::vector<std::string> token_pieces(const tok::Tokenizer& t, const std::string& text) {
  std::vector<std::string> pieces;
  tok::StreamDecoder d(t, /*skip_special_tokens=*/false);
  for (int32_t id : t.encode(text, false)) pieces.push_back(d.step(id));
  pieces.push_back(d.flush());
  std::string joined;
  for (const auto& p : pieces) joined += p;
  EXPECT_EQ(joined, text) << "the tokenizer does not round-trip this text";
  return pieces;
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

std::vector<Case> cases() {
  const std::string dsb = "<｜tool▁calls▁begin｜>", dse = "<｜tool▁calls▁end｜>", cb = "<｜tool▁call▁begin｜>",
                    ce = "<｜tool▁call▁end｜>", sep = "<｜tool▁sep｜>";
  return {
      // Qwen3: thinking, then two Hermes calls (the template's own layout: "<tool_call>\n{json}\n</tool_call>").
      {"qwen3_think_two_calls", ToolCallFormat::hermes,
       "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
       "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
       "{\"tz\": \"Europe/Paris\"}}\n</tool_call>",
       "\nThe user wants the weather.\n", "",
       {{"get_weather", R"({"city":"Paris","days":2})"}, {"get_time", R"({"tz":"Europe/Paris"})"}}, true, false,
       "qwen3"},
      {"qwen25_text_then_call", ToolCallFormat::hermes,
       "Let me check that.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}\n"
       "</tool_call>",
       "", "Let me check that.", {{"get_weather", R"({"city":"Oslo"})"}}, false, false, "qwen3"},
      {"hermes_malformed_json", ToolCallFormat::hermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>", "",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>", {}, false, false, "qwen3"},
      {"hermes_truncated_mid_json", ToolCallFormat::hermes, "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"argu", "",
       "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"argu", {}, false, false, "qwen3"},
      {"hermes_truncated_before_close", ToolCallFormat::hermes, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{}}\n",
       "", "", {{"get_weather", "{}"}}, false, false, "qwen3"},
      {"hermes_plain_text_with_angles", ToolCallFormat::hermes, "a < b and <tool is not </tool_call> a call <tool_cal",
       "", "a < b and <tool is not </tool_call> a call <tool_cal", {}, false, false, "qwen3"},
      {"hermes_text_after_call", ToolCallFormat::hermes,
       "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}</tool_call>\n\nDone.  ", "",
       "\n\nDone.", {{"get_weather", R"({"city":"Rome"})"}}, false, false, "qwen3"},
      {"qwen3_thinking_truncated", ToolCallFormat::hermes, "<think>\nstill thinking about <tool_call>", "\nstill thinking "
       "about <tool_call>", "", {}, true, false, "qwen3"},
      {"qwen3_prompt_opened_think", ToolCallFormat::hermes, "plan: call it</think>\n\nThe answer is 4.",
       "plan: call it", "The answer is 4.", {}, true, true, "qwen3"},
      {"qwen3_no_think_plain", ToolCallFormat::hermes, "  Hello world\n", "", "  Hello world\n", {}, true, false, "qwen3"},
      {"tiny_template_name_space_json", ToolCallFormat::hermes, "<tool_call>get_weather {\"city\": \"Lima\"}</tool_call>",
       "", "", {{"get_weather", R"({"city":"Lima"})"}}, false, false, ""},
      // Qwen3-Coder / Qwen3.5 XML-style blocks; values typed by the tool's schema.
      {"qwen_xml_typed", ToolCallFormat::qwen_xml,
       "I'll look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n"
       "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=note>\n42\n</parameter>\n</function>\n"
       "</tool_call>",
       "", "I'll look.", {{"get_weather", R"({"city":"New York","days":3,"metric":true,"note":"42"})"}}, false, false,
       "qwen3"},
      {"qwen_xml_two_calls_no_wrapper", ToolCallFormat::qwen_xml,
       "<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n<function=get_time>\n</function>", "", "",
       {{"get_time", R"({"tz":"UTC"})"}, {"get_time", "{}"}}, false, false, "qwen3"},
      {"qwen_xml_truncated", ToolCallFormat::qwen_xml, "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "",
       "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", {}, false, false, "qwen3"},
      // Llama 3.1/3.2 JSON tool calls: the whole message is the call.
      {"llama3_json", ToolCallFormat::llama3_json,
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 1}}", "", "",
       {{"get_weather", R"({"city":"Paris","days":1})"}}, false, false, "llama3"},
      {"llama3_python_tag", ToolCallFormat::llama3_json,
       "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Kyiv\"}}", "", "",
       {{"get_weather", R"({"city":"Kyiv"})"}}, false, false, "llama3"},
      {"llama3_semicolon_calls", ToolCallFormat::llama3_json,
       "\n{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}", "", "",
       {{"a", "{}"}, {"b", R"({"x":1})"}}, false, false, "llama3"},
      {"llama3_brace_text_is_content", ToolCallFormat::llama3_json, "{not a call} really", "", "{not a call} really", {},
       false, false, "llama3"},
      {"llama3_text_with_braces_later", ToolCallFormat::llama3_json, "Use {\"name\": \"x\"} syntax.", "",
       "Use {\"name\": \"x\"} syntax.", {}, false, false, "llama3"},
      // Mistral: v3 JSON list, and v11+ NAME[ARGS]{...} per [TOOL_CALLS].
      {"mistral_v3_list", ToolCallFormat::mistral,
       "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", "
       "\"arguments\": {}}]",
       "", "", {{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}}, false, false, ""},
      {"mistral_v11_args", ToolCallFormat::mistral,
       "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}", "", "",
       {{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}}, false, false, ""},
      {"mistral_truncated", ToolCallFormat::mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"ci", "",
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"ci", {}, false, false, ""},
      // Gemma 4: <|tool_call>call:NAME{...}<tool_call|> with <|"|> string quotes.
      {"gemma4_call", ToolCallFormat::gemma4,
       "Checking.<|tool_call>call:get_weather{city:<|\"|>Paris, FR<|\"|>,days:3,opts:{metric:true},tags:[<|\"|>a<|\"|>,"
       "1.5,null]}<tool_call|>",
       "", "Checking.", {{"get_weather", R"({"city":"Paris, FR","days":3,"opts":{"metric":true},"tags":["a",1.5,null]})"}},
       false, false, "gemma3"},
      {"gemma4_malformed", ToolCallFormat::gemma4, "<|tool_call>call:get_weather{city:<|\"|>Paris}<tool_call|>", "",
       "<|tool_call>call:get_weather{city:<|\"|>Paris}<tool_call|>", {}, false, false, "gemma3"},
      // gpt-oss harmony: analysis -> reasoning, a functions.* recipient -> a call (<|call|> is an eos, not in text).
      {"harmony_call", ToolCallFormat::harmony,
       "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
       "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
       "Need the weather.", "", {{"get_weather", R"({"city":"Paris"})"}}, false, false, ""},
      {"harmony_final", ToolCallFormat::harmony,
       "<|channel|>analysis<|message|>2+2=4<|end|><|start|>assistant<|channel|>final<|message|>The answer is 4.",
       "2+2=4", "The answer is 4.", {}, false, false, ""},
      {"harmony_bad_args", ToolCallFormat::harmony,
       "<|channel|>commentary to=functions.get_weather<|message|>{\"city\":", "",
       "<|channel|>commentary to=functions.get_weather<|message|>{\"city\":", {}, false, false, ""},
      {"harmony_plain_text", ToolCallFormat::harmony, "no header here", "", "no header here", {}, false, false, ""},
      {"harmony_long_text_then_marker", ToolCallFormat::harmony, std::string(600, 'a') + "<|start|>x", "",
       std::string(600, 'a') + "<|start|>x", {}, false, false, ""},
      {"harmony_markers_without_headers", ToolCallFormat::harmony, repeat("<|start|>", 60), "", repeat("<|start|>", 60),
       {}, false, false, ""},
      // DeepSeek-V3 (fenced JSON) and V3.1 (bare JSON).
      {"deepseek_v3", ToolCallFormat::deepseek_v3,
       "Let me see." + dsb + cb + "function" + sep + "get_weather\n```json\n{\"city\": \"Paris\"}\n```" + ce + cb +
           "function" + sep + "get_time\n```json\n{}\n```" + ce + dse,
       "", "Let me see.", {{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}}, false, false, "deepseek_v3"},
      {"deepseek_v31", ToolCallFormat::deepseek_v3, dsb + cb + "get_weather" + sep + "{\"city\": \"Oslo\"}" + ce + dse, "",
       "", {{"get_weather", R"({"city":"Oslo"})"}}, false, false, "deepseek_v3"},
      {"deepseek_truncated", ToolCallFormat::deepseek_v3, dsb + cb + "function" + sep + "get_weather\n```json\n{\"ci", "",
       dsb + cb + "function" + sep + "get_weather\n```json\n{\"ci", {}, false, false, "deepseek_v3"},
  };
}

TEST(AssistantOutput, EveryFormatWholeByteByByteSplitAndTokenByToken) {
  const auto tiny = tok::Tokenizer::load(kSource / "profiles/models/tierlm-tiny");
  for (const auto& c : cases()) {
    expect_result(c, AssistantOutputParser::parse(c.text, options_of(c)), "whole");
    std::vector<std::string> bytes;
    for (char ch : c.text) bytes.emplace_back(1, ch);
    expect_result(c, run_pieces(c, bytes), "byte by byte");
    for (size_t cut = 1; cut < c.text.size(); ++cut)
      expect_result(c, run_pieces(c, {c.text.substr(0, cut), c.text.substr(cut)}), "split at " + std::to_string(cut));
    expect_result(c, run_pieces(c, token_pieces(tiny, c.text)), "tierlm-tiny tokens");
    const auto dir = kSource / ".cache/tokenizers" / c.vocab;
    if (!c.vocab.empty() && std::filesystem::exists(dir / "tokenizer.json")) {
      static std::map<std::string, tok::Tokenizer> loaded;  // each vocabulary loads once
      auto it = loaded.find(c.vocab);
      if (it == loaded.end()) it = loaded.emplace(c.vocab, tok::Tokenizer::load(dir)).first;
      expect_result(c, run_pieces(c, token_pieces(it->second, c.text)), c.vocab + " tokens");
    }
  }
}

TEST(AssistantOutput, ToolParsingOffLeavesCallsAsContent) {
  AssistantOutputOptions o;
  o.format = ToolCallFormat::hermes;
  o.parse_tool_calls = false;
  const std::string text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  const auto out = AssistantOutputParser::parse(text, o);
  EXPECT_EQ(out.content, text);
  EXPECT_TRUE(out.tool_calls.empty());
}

TEST(AssistantOutput, DetectsTheFormatFromTheTemplate) {
  EXPECT_EQ(detect_tool_call_format("{{- '<tool_call>\\n' }}{{ tool_call.arguments | tojson }}"), ToolCallFormat::hermes);
  EXPECT_EQ(detect_tool_call_format("<tool_call>\n<function={{ name }}>\n<parameter={{ k }}>"), ToolCallFormat::qwen_xml);
  EXPECT_EQ(detect_tool_call_format("<|start_header_id|>ipython<|end_header_id|>"), ToolCallFormat::llama3_json);
  EXPECT_EQ(detect_tool_call_format("[AVAILABLE_TOOLS]...[TOOL_CALLS]"), ToolCallFormat::mistral);
  EXPECT_EQ(detect_tool_call_format("<|tool_call>call:"), ToolCallFormat::gemma4);
  EXPECT_EQ(detect_tool_call_format("<|start|>assistant<|channel|>final<|message|>"), ToolCallFormat::harmony);
  EXPECT_EQ(detect_tool_call_format("<｜tool▁calls▁begin｜>"), ToolCallFormat::deepseek_v3);
  EXPECT_EQ(detect_tool_call_format("{{ message.content }}"), ToolCallFormat::none);
}

// The real templates in tests/fixtures/templates name their formats.
TEST(AssistantOutput, DetectsTheFixtureTemplates) {
  auto template_of = [](const std::string& file) {
    std::ifstream in(kSource / "tests/fixtures/templates" / file);
    std::string line;
    std::getline(in, line);
    return std::string(json::parse(line).at("meta").at("template").as_string());
  };
  EXPECT_EQ(detect_tool_call_format(template_of("qwen3.jsonl")), ToolCallFormat::hermes);
  EXPECT_EQ(detect_tool_call_format(template_of("deepseek_v3.jsonl")), ToolCallFormat::deepseek_v3);
  EXPECT_EQ(detect_tool_call_format(template_of("gemma3.jsonl")), ToolCallFormat::none);
  EXPECT_EQ(detect_tool_call_format(template_of("llama3.jsonl")), ToolCallFormat::none);  // Llama-3.0: no tools
  EXPECT_EQ(detect_tool_call_format(template_of("profile-tierlm-tiny-default.jsonl")), ToolCallFormat::hermes);
}

TEST(AssistantOutput, Gemma4ArgumentSyntax) {
  EXPECT_EQ(json::parse(*toolfmt::gemma4_arguments_to_json("{a:<|\"|>x, y<|\"|>,b:-2,c:[true,false],d:{e:\"q\"}}")),
            json::parse(R"({"a":"x, y","b":-2,"c":[true,false],"d":{"e":"q"}})"));
  EXPECT_FALSE(toolfmt::gemma4_arguments_to_json("{a:}"));
  EXPECT_FALSE(toolfmt::gemma4_arguments_to_json("{a:1"));
  EXPECT_FALSE(toolfmt::gemma4_arguments_to_json("[1]"));
}

}  // namespace
}  // namespace tierlm::server
