// runtime/cli/profile_report.cpp — table, Markdown, JSON and SVG of the profile matrix
// (runtime/cli/profile_report.h).
#include "runtime/cli/profile_report.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <boost/json.hpp>
#include <fmt/format.h>

namespace tierlm::cli {

namespace bj = boost::json;

namespace {

constexpr double kMiB = double(1 << 20);

const std::vector<std::string>& configuration_order() {
  static const std::vector<std::string> order = {"in_ram", "streamed", "turbo_kv", "streamed_turbo_kv"};
  return order;
}

std::string context_label(int64_t context) {
  return context >= 1024 && context % 1024 == 0 ? fmt::format("{}K", context / 1024) : std::to_string(context);
}

// The ledger accounts worth a column: those any cell used.
std::vector<std::string> accounts(const ProfileReport& r) {
  std::set<std::string> names;
  for (auto& c : r.cells)
    for (auto& [name, bytes] : c.ledger_peak)
      if (bytes > 0) names.insert(name);
  return {names.begin(), names.end()};
}

std::vector<std::string> row(const ProfileCell& c, const std::vector<std::string>& account_names) {
  std::vector<std::string> out = {context_label(c.context), c.configuration};
  if (!c.ok) {
    out.push_back("error: " + c.error);
    return out;
  }
  out.push_back(c.kv_codec);
  out.push_back(fmt::format("{:.0f}%", 100 * c.streamed_expert_fraction));
  out.push_back(fmt::format("{:.1f}", c.prefill_tokens_per_second));
  out.push_back(fmt::format("{:.2f}", c.decode_tokens_per_second));
  out.push_back(fmt::format("{:.2f}", c.time_to_first_token_seconds));
  out.push_back(fmt::format("{:.1f}%", 100 * c.expert_hit_rate));
  out.push_back(fmt::format("{:.1f}", double(c.peak_rss_bytes) / kMiB));
  for (auto& a : account_names) {
    auto it = c.ledger_peak.find(a);
    out.push_back(fmt::format("{:.1f}", it == c.ledger_peak.end() ? 0.0 : double(it->second) / kMiB));
  }
  return out;
}

std::vector<std::string> header(const std::vector<std::string>& account_names) {
  std::vector<std::string> h = {"context", "configuration", "KV", "streamed", "prefill tok/s", "decode tok/s",
                                "TTFT s", "expert hits", "peak RSS MiB"};
  for (auto& a : account_names) h.push_back(a + " MiB");
  return h;
}

}  // namespace

std::string profile_table(const ProfileReport& r) {
  const auto names = accounts(r);
  std::vector<std::vector<std::string>> rows = {header(names)};
  for (auto& c : r.cells) rows.push_back(row(c, names));
  std::vector<size_t> width(rows.front().size(), 0);
  for (auto& rw : rows)
    for (size_t i = 0; i < rw.size() && i < width.size(); ++i)
      if (rw.size() == width.size()) width[i] = std::max(width[i], rw[i].size());
  std::string out = r.model + "\n" + r.device + "\n";
  for (auto& rw : rows) {
    for (size_t i = 0; i < rw.size(); ++i)
      out += i + 1 < rw.size() && i < width.size() ? fmt::format("{:<{}}  ", rw[i], width[i]) : rw[i];
    out += "\n";
  }
  return out;
}

std::string profile_markdown(const ProfileReport& r) {
  const auto names = accounts(r);
  std::string out = "# tierlm bench profile\n\n" + r.model + "\n\n" + r.device + "\n\n";
  auto line = [](const std::vector<std::string>& cells) {
    std::string s = "|";
    for (auto& c : cells) s += " " + c + " |";
    return s + "\n";
  };
  const auto h = header(names);
  out += line(h);
  out += line(std::vector<std::string>(h.size(), "---"));
  for (auto& c : r.cells) {
    auto rw = row(c, names);
    rw.resize(h.size());
    out += line(rw);
  }
  out += "\nPrefill fills the context (prompt = context - decoded tokens); TTFT is that prefill. Streamed: the share "
         "of experts not resident (read from disk through the expert cache). Ledger columns: peak bytes by account.\n";
  return out;
}

bj::value to_json(const ProfileCell& c) {
  bj::object ledger;
  for (auto& [name, bytes] : c.ledger_peak) ledger[name] = bytes;
  return bj::object{{"context", c.context},
                    {"configuration", c.configuration},
                    {"ok", c.ok},
                    {"error", c.error},
                    {"kv_codec", c.kv_codec},
                    {"budget_bytes", c.budget_bytes},
                    {"resident_experts", c.resident_experts},
                    {"cache_slots", c.cache_slots},
                    {"streamed_expert_fraction", c.streamed_expert_fraction},
                    {"predicted_decode_tokens_per_second", c.predicted_decode},
                    {"predicted_prefill_tokens_per_second", c.predicted_prefill},
                    {"prompt_tokens", c.prompt_tokens},
                    {"decoded_tokens", c.decoded_tokens},
                    {"prefill_tokens_per_second", c.prefill_tokens_per_second},
                    {"decode_tokens_per_second", c.decode_tokens_per_second},
                    {"time_to_first_token_seconds", c.time_to_first_token_seconds},
                    {"expert_hit_rate", c.expert_hit_rate},
                    {"expert_bytes_read", c.expert_bytes_read},
                    {"peak_rss_bytes", c.peak_rss_bytes},
                    {"ledger_peak_bytes", std::move(ledger)}};
}

ProfileCell profile_cell_from_json(const bj::value& v) {
  const bj::object& o = v.as_object();
  auto num = [&](const char* k) { return o.at(k).to_number<double>(); };
  auto u64 = [&](const char* k) { return o.at(k).to_number<uint64_t>(); };
  auto i64 = [&](const char* k) { return o.at(k).to_number<int64_t>(); };
  ProfileCell c;
  c.context = i64("context");
  c.configuration = std::string(o.at("configuration").as_string());
  c.ok = o.at("ok").as_bool();
  c.error = std::string(o.at("error").as_string());
  c.kv_codec = std::string(o.at("kv_codec").as_string());
  c.budget_bytes = u64("budget_bytes");
  c.resident_experts = i64("resident_experts");
  c.cache_slots = i64("cache_slots");
  c.streamed_expert_fraction = num("streamed_expert_fraction");
  c.predicted_decode = num("predicted_decode_tokens_per_second");
  c.predicted_prefill = num("predicted_prefill_tokens_per_second");
  c.prompt_tokens = i64("prompt_tokens");
  c.decoded_tokens = i64("decoded_tokens");
  c.prefill_tokens_per_second = num("prefill_tokens_per_second");
  c.decode_tokens_per_second = num("decode_tokens_per_second");
  c.time_to_first_token_seconds = num("time_to_first_token_seconds");
  c.expert_hit_rate = num("expert_hit_rate");
  c.expert_bytes_read = u64("expert_bytes_read");
  c.peak_rss_bytes = u64("peak_rss_bytes");
  for (auto& [name, bytes] : o.at("ledger_peak_bytes").as_object())
    c.ledger_peak[std::string(name)] = bytes.to_number<uint64_t>();
  return c;
}

bj::value profile_json(const ProfileReport& r) {
  bj::array cells;
  for (auto& c : r.cells) cells.push_back(to_json(c));
  return bj::object{
      {"schema", "tierlm-bench-profile"}, {"model", r.model}, {"device", r.device}, {"cells", std::move(cells)}};
}

std::string profile_svg(const ProfileReport& r) {
  // Three panels side by side (prefill tok/s, decode tok/s, peak RSS MiB); in each, a group of bars per context,
  // one bar per configuration, a linear axis from 0 with five gridlines.
  std::vector<int64_t> contexts;
  for (auto& c : r.cells)
    if (std::find(contexts.begin(), contexts.end(), c.context) == contexts.end()) contexts.push_back(c.context);
  const auto& configs = configuration_order();
  const char* colors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759"};
  struct Panel {
    std::string title;
    double (*value)(const ProfileCell&);
  };
  const Panel panels[] = {
      {"prefill tok/s", [](const ProfileCell& c) { return c.prefill_tokens_per_second; }},
      {"decode tok/s", [](const ProfileCell& c) { return c.decode_tokens_per_second; }},
      {"peak RSS (MiB)", [](const ProfileCell& c) { return double(c.peak_rss_bytes) / kMiB; }},
  };
  const double panel_w = 340, panel_h = 260, left = 50, top = 60, gap = 40;
  const double width = left + 3 * (panel_w + gap), height = top + panel_h + 90;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{:.0f}\" y=\"22\" font-size=\"14\" font-weight=\"bold\">tierlm bench profile</text>\n"
      "<text x=\"{:.0f}\" y=\"40\">{}</text>\n",
      width, height, left, left, r.model.substr(0, 160));
  for (size_t p = 0; p < 3; ++p) {
    const double x0 = left + double(p) * (panel_w + gap), y0 = top, y1 = top + panel_h;
    double max = 0;
    for (auto& c : r.cells)
      if (c.ok) max = std::max(max, panels[p].value(c));
    if (max <= 0) max = 1;
    const double magnitude = std::pow(10.0, std::floor(std::log10(max)));
    const double step = std::ceil(max / magnitude / 5 * 2) / 2 * magnitude;  // 5 gridlines, round steps
    const double axis_max = step * 5;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-weight=\"bold\">{}</text>\n", x0, y0 - 6, panels[p].title);
    for (int g = 0; g <= 5; ++g) {
      const double y = y1 - (y1 - y0) * g / 5.0;
      s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", x0, y,
                       x0 + panel_w, y);
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>\n", x0 - 4, y + 4, step * g);
    }
    const double group_w = panel_w / double(std::max<size_t>(contexts.size(), 1));
    const double bar_w = group_w * 0.8 / double(configs.size());
    for (size_t ci = 0; ci < contexts.size(); ++ci) {
      const double gx = x0 + group_w * double(ci) + group_w * 0.1;
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", gx + group_w * 0.4,
                       y1 + 16, context_label(contexts[ci]));
      for (size_t k = 0; k < configs.size(); ++k)
        for (auto& c : r.cells) {
          if (c.context != contexts[ci] || c.configuration != configs[k]) continue;
          const double v = c.ok ? panels[p].value(c) : 0;
          const double h = (y1 - y0) * v / axis_max;
          s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"><title>{} "
                           "{}: {:.3g}</title></rect>\n",
                           gx + bar_w * double(k), y1 - h, bar_w * 0.92, h, colors[k], context_label(c.context),
                           c.configuration, v);
          if (!c.ok)
            s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#c00\">x</text>\n",
                             gx + bar_w * (double(k) + 0.5), y1 - 3);
        }
    }
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#333\"/>\n", x0, y1,
                     x0 + panel_w, y1);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">context (tokens)</text>\n",
                     x0 + panel_w / 2, y1 + 32);
  }
  for (size_t k = 0; k < configs.size(); ++k) {
    const double x = left + double(k) * 170, y = height - 22;
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>\n", x, y - 10,
                     colors[k]);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", x + 16, y, configs[k]);
  }
  return s + "</svg>\n";
}

}  // namespace tierlm::cli
