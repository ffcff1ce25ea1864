// Compares runtime/template with python3-jinja2 (transformers' environment) byte for byte over the golden files
// of tools/make_template_golden.py: the real chat templates of Qwen3, Llama-3, Gemma-3, DeepSeek-V3, Qwen3.5 and
// Gemma 4 (and any in profiles/models) over many conversations, plus hand-written templates exercising the language.
// A case jinja2 raises on must raise TemplateError with the same message; a template jinja2 refuses must be refused
// at parse.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/template/builtins.h"
#include "runtime/template/chat_template.h"

namespace fs = std::filesystem;
using namespace tierlm::tmpl;

namespace {

const fs::path kFixtures = fs::path(TIERLM_SOURCE_DIR) / "tests" / "fixtures" / "templates";

std::vector<boost::json::object> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<boost::json::object> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(boost::json::parse(line).as_object());
  return out;
}

std::string str(const boost::json::value& v) { return std::string(v.as_string()); }

struct Tally {
  int total = 0, passed = 0;
};

// Renders one model-template case through the public render_chat API.
void check_model_case(const ChatTemplate& tmpl, const boost::json::object& special, const boost::json::object& c,
                      Tally& tally) {
  SCOPED_TRACE(str(c.at("name")));
  ++tally.total;
  const auto& messages = c.at("messages").as_array();
  bool agp = c.at("add_generation_prompt").as_bool();
  const auto& tools = c.at("tools");
  const auto& extra = c.at("extra").as_object();
  if (c.contains("expected")) {
    std::string got;
    try {
      got = render_chat(tmpl, messages, agp, tools, special, extra);
    } catch (const TemplateError& e) {
      ADD_FAILURE() << "unexpected error: " << e.what();
      return;
    }
    EXPECT_EQ(got, str(c.at("expected")));
    if (got == str(c.at("expected"))) ++tally.passed;
    return;
  }
  try {
    std::string got = render_chat(tmpl, messages, agp, tools, special, extra);
    ADD_FAILURE() << "expected " << str(c.at("error_type")) << ": " << str(c.at("error")) << "\n got output: " << got;
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.message(), str(c.at("error"))) << str(c.at("error_type"));
    if (e.message() == str(c.at("error"))) ++tally.passed;
  }
}

void check_model_file(const fs::path& path) {
  auto lines = read_lines(path);
  ASSERT_GT(lines.size(), 1u) << path;
  const auto& meta = lines[0].at("meta").as_object();
  ChatTemplate tmpl = ChatTemplate::parse(str(meta.at("template")));
  const auto& special = meta.at("special_tokens").as_object();
  // Templates that print the date were rendered by jinja2 at a fixed time ("fixed_now", ISO 8601): render at it too.
  if (meta.contains("fixed_now")) {
    std::tm fixed{};
    std::istringstream in(str(meta.at("fixed_now")));
    in >> std::get_time(&fixed, "%Y-%m-%dT%H:%M:%S");
    ASSERT_FALSE(in.fail()) << str(meta.at("fixed_now"));
    set_clock_for_testing(fixed);
  }
  struct ClockGuard {
    ~ClockGuard() { set_clock_for_testing(std::nullopt); }
  } clock_guard;
  Tally tally;
  for (std::size_t i = 1; i < lines.size(); ++i) check_model_case(tmpl, special, lines[i], tally);
  std::printf("[golden] %s: %d/%d cases identical to jinja2 %s\n", path.filename().c_str(), tally.passed,
              tally.total, str(meta.at("jinja2")).c_str());
  EXPECT_EQ(tally.passed, tally.total);
  EXPECT_GE(tally.total, 30);
}

}  // namespace

TEST(ChatTemplateGolden, Qwen3) { check_model_file(kFixtures / "qwen3.jsonl"); }
TEST(ChatTemplateGolden, Llama3) { check_model_file(kFixtures / "llama3.jsonl"); }
TEST(ChatTemplateGolden, Gemma3) { check_model_file(kFixtures / "gemma3.jsonl"); }
TEST(ChatTemplateGolden, DeepSeekV3) { check_model_file(kFixtures / "deepseek_v3.jsonl"); }
// Kept verbatim under fixtures/templates/sources (sources.json cites where each was read): tools, tool results,
// thinking switches and multi-turn, plus each template's own fields (Gemma 4's tool_responses).
TEST(ChatTemplateGolden, Qwen3_5) { check_model_file(kFixtures / "qwen3_5.jsonl"); }
TEST(ChatTemplateGolden, Gemma4) { check_model_file(kFixtures / "gemma4.jsonl"); }
// gpt-oss's harmony template (sources.json cites it): channels, developer message, TypeScript-like tool namespaces,
// builtin_tools / model_identity / reasoning_effort kwargs, analysis kept only before a tool call; rendered at the
// golden's fixed date.
TEST(ChatTemplateGolden, GptOss) { check_model_file(kFixtures / "gpt_oss.jsonl"); }

TEST(ChatTemplateGolden, ProfileModels) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(kFixtures)) {
    if (entry.path().filename().string().rfind("profile-", 0) != 0) continue;
    ++files;
    SCOPED_TRACE(entry.path().string());
    check_model_file(entry.path());
  }
  if (files == 0) GTEST_SKIP() << "no model under profiles/models ships a chat template";
}

TEST(ChatTemplateGolden, Features) {
  auto lines = read_lines(kFixtures / "features.jsonl");
  ASSERT_GT(lines.size(), 1u);
  Tally tally;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const auto& c = lines[i];
    SCOPED_TRACE(str(c.at("name")));
    ++tally.total;
    std::string source = str(c.at("template"));
    if (c.contains("parse_error")) {
      try {
        ChatTemplate::parse(source);
        ADD_FAILURE() << "jinja2 refuses this template (" << str(c.at("error")) << ") but it parsed";
      } catch (const TemplateError&) {
        ++tally.passed;
      }
      continue;
    }
    std::optional<ChatTemplate> tmpl;
    try {
      tmpl = ChatTemplate::parse(source);
    } catch (const TemplateError& e) {
      ADD_FAILURE() << "parse failed: " << e.what();
      continue;
    }
    const auto& context = c.at("context").as_object();
    if (c.contains("expected")) {
      try {
        std::string got = tmpl->render(context);
        EXPECT_EQ(got, str(c.at("expected")));
        if (got == str(c.at("expected"))) ++tally.passed;
      } catch (const TemplateError& e) {
        ADD_FAILURE() << "unexpected error: " << e.what();
      }
    } else {
      try {
        std::string got = tmpl->render(context);
        ADD_FAILURE() << "expected " << str(c.at("error_type")) << ": " << str(c.at("error")) << "\n got: " << got;
      } catch (const TemplateError& e) {
        EXPECT_EQ(e.message(), str(c.at("error"))) << str(c.at("error_type"));
        if (e.message() == str(c.at("error"))) ++tally.passed;
      }
    }
  }
  std::printf("[golden] features.jsonl: %d/%d cases identical to jinja2\n", tally.passed, tally.total);
  EXPECT_EQ(tally.passed, tally.total);
}
