// A served MoE model whose expert file breaks under it: the default model (tierlm-tiny, 6 layers x 8 experts, top-2)
// with its experts packed into a file of the test's own and 4 cache slots, so nearly every token reads experts from
// disk. The file is truncated to its header while the server runs (every expert read then finds "unexpected end of
// file"), then restored. Each request that needed an expert fails alone and clearly (HTTP 500 with an OpenAI-style
// body naming the expert and the file; a stream: an error event, then [DONE]); /health and /metrics count the
// failures; and once the file is back the server answers exactly as before it broke (greedy text equal to the first
// answer): no pin, failed slot or KV state of the failed requests is left behind.
#include <gtest/gtest.h>

#include <fstream>

#include <fmt/format.h>

#include "runtime/model/moe_model.h"
#include "tests/runtime/model/safetensors_writer.h"
#include "tests/server/test_client.h"

namespace tierlm::server::testing {
namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

double tier_number(Telemetry& t, const char* name) { return t.health().at("tiering").at(name).to_number<double>(); }

TEST(ExpertReadErrors, AFailedExpertReadFailsOnlyItsRequest) {
  test::TempDir dir;
  const auto packed = dir / "experts.tierlm";
  model::pack_experts(tiny_model_dir(), std::nullopt, packed);
  const std::string bytes = slurp(packed);
  ServerOptions o;
  o.packed_experts = packed;
  o.expert_slots = 4;
  o.expert_tier_counters = true;
  o.scheduler.max_batch = 2;
  TestServer s(o);
  const std::string body = R"({"prompt":"def fibonacci(n):","max_tokens":8,"temperature":0,"ignore_eos":true)";

  auto first = post(s.port(), "/v1/completions", body + "}");
  ASSERT_EQ(first.status, 200) << first.body;
  const std::string text = first.json().at("choices").at(0).at("text").as_string().c_str();
  EXPECT_EQ(tier_number(s.telemetry(), "expert_read_errors"), 0.0);
  EXPECT_GT(tier_number(s.telemetry(), "disk_bytes_read"), 0.0);

  std::filesystem::resize_file(packed, tiering::kPackedHeaderBytes);  // every expert is gone
  auto failed = post(s.port(), "/v1/completions", body + "}");
  EXPECT_EQ(failed.status, 500) << failed.body;
  const auto error = failed.json().at("error");
  const std::string message = error.at("message").as_string().c_str();
  EXPECT_EQ(error.at("type").as_string(), "server_error");
  EXPECT_NE(message.find("could not be loaded"), std::string::npos) << message;
  EXPECT_NE(message.find("expert "), std::string::npos) << message;
  EXPECT_NE(message.find(packed.string() + ": unexpected end of file at "), std::string::npos) << message;
  const double errors_after_one = tier_number(s.telemetry(), "expert_read_errors");
  EXPECT_GE(errors_after_one, 1.0);

  // A stream: the headers went out before the failure, so it ends with an error event, then [DONE].
  auto streamed = post(s.port(), "/v1/completions", body + R"(,"stream":true})");
  EXPECT_EQ(streamed.status, 200);
  const auto events = sse_events(streamed.body);
  ASSERT_GE(events.size(), 2u) << streamed.body;
  EXPECT_EQ(events.back(), "[DONE]");
  const auto event = boost::json::parse(events[events.size() - 2]);
  EXPECT_NE(std::string(event.at("error").at("message").as_string().c_str()).find("could not be loaded"),
            std::string::npos)
      << streamed.body;
  EXPECT_GT(tier_number(s.telemetry(), "expert_read_errors"), errors_after_one);

  // The server kept serving all along: /health answers, and the failures are in /metrics too.
  auto health = request(s.port(), "GET", "/health");
  EXPECT_EQ(health.status, 200);
  const double errors = health.json().at("tiering").at("expert_read_errors").to_number<double>();
  auto metrics = request(s.port(), "GET", "/metrics");
  EXPECT_NE(metrics.body.find(fmt::format("tierlm_expert_read_errors_total {}", errors)), std::string::npos)
      << metrics.body;

  // The file comes back: the same request gives the same greedy text, and nothing fails any more.
  std::ofstream(packed, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
  for (int i = 0; i < 2; ++i) {
    auto again = post(s.port(), "/v1/completions", body + "}");
    ASSERT_EQ(again.status, 200) << again.body;
    EXPECT_EQ(again.json().at("choices").at(0).at("text").as_string(), text);
  }
  EXPECT_EQ(tier_number(s.telemetry(), "expert_read_errors"), errors);
}

}  // namespace
}  // namespace tierlm::server::testing
