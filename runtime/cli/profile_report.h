// runtime/cli/profile_report.h — the context x configuration matrix of `tierlm bench profile` as people and
// machines read it: a plain-text table (stdout), Markdown, JSON, and an SVG chart drawn by this code (decode and
// prefill tok/s and peak RSS per context, one bar per configuration; no plotting library).
// Never: measure anything; the cells arrive filled in.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <boost/json/value.hpp>

namespace tierlm::cli {

struct ProfileCell {
  int64_t context = 0;           // tokens in the sequence: the prompt fills it up to the decoded tokens
  std::string configuration;     // in_ram | streamed | turbo_kv | streamed_turbo_kv
  bool ok = false;
  std::string error;             // why the cell has no numbers
  // The plan the cell ran (calibrate's planner at the cell's budget and KV codec).
  std::string kv_codec;
  uint64_t budget_bytes = 0;
  int64_t resident_experts = 0, cache_slots = 0;
  double streamed_expert_fraction = 0;
  double predicted_decode = 0, predicted_prefill = 0;
  // Measured.
  int64_t prompt_tokens = 0, decoded_tokens = 0;
  double prefill_tokens_per_second = 0, decode_tokens_per_second = 0, time_to_first_token_seconds = 0;
  double expert_hit_rate = 1;
  uint64_t expert_bytes_read = 0;
  uint64_t peak_rss_bytes = 0;                    // the cell's process VmHWM
  std::map<std::string, uint64_t> ledger_peak;    // peak bytes by ledger account
};

struct ProfileReport {
  std::string model, device;  // what ran, on what (a line each)
  std::vector<ProfileCell> cells;
};

std::string profile_table(const ProfileReport& report);
std::string profile_markdown(const ProfileReport& report);
boost::json::value profile_json(const ProfileReport& report);
ProfileCell profile_cell_from_json(const boost::json::value& v);
boost::json::value to_json(const ProfileCell& cell);
std::string profile_svg(const ProfileReport& report);

}  // namespace tierlm::cli
