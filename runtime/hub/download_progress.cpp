#include "runtime/hub/download_progress.h"

#include <cstdio>

#include <unistd.h>

namespace tierlm::hub {

std::string human_bytes(double bytes) {
  static const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1000 && unit < 4) {
    bytes /= 1000;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

DownloadProgress::DownloadProgress(std::string label, uint64_t total, uint64_t already, double plain_interval_seconds)
    : label_(std::move(label)),
      total_(total),
      already_(already),
      tty_(isatty(STDERR_FILENO)),
      plain_interval_(plain_interval_seconds),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void DownloadProgress::add(uint64_t fetched_bytes) {
  fetched_ += fetched_bytes;
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_draw_).count();
  if (since >= (tty_ ? 0.1 : plain_interval_)) draw(false);
}

void DownloadProgress::finish() { draw(true); }

void DownloadProgress::draw(bool final_line) {
  const auto now = std::chrono::steady_clock::now();
  last_draw_ = now;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const uint64_t done = std::min(total_, already_ + fetched_);
  const double rate = seconds > 0 ? double(fetched_) / seconds : 0;
  const int percent = total_ ? int(100.0 * double(done) / double(total_)) : 100;
  std::string eta = "--";
  if (rate > 0 && done < total_) {
    const long left = long(double(total_ - done) / rate);
    char text[32];
    std::snprintf(text, sizeof text, "%ld:%02ld", left / 60, left % 60);
    eta = text;
  }
  const std::string numbers = human_bytes(double(done)) + " / " + human_bytes(double(total_)) + ", " +
                              human_bytes(rate) + "/s, ETA " + eta;
  if (tty_) {
    const int width = 24, filled = total_ ? int(double(done) * width / double(total_)) : width;
    std::fprintf(stderr, "\r%s [%s%s] %3d%% %s\033[K", label_.c_str(), std::string(size_t(filled), '#').c_str(),
                 std::string(size_t(width - filled), '.').c_str(), percent, numbers.c_str());
    if (final_line) std::fprintf(stderr, " (%.1f s)\n", seconds);
  } else {
    const std::string tail = final_line ? " (" + std::to_string(int(seconds)) + " s)" : "";
    std::fprintf(stderr, "%s: %d%% %s%s\n", label_.c_str(), percent, numbers.c_str(), tail.c_str());
  }
  std::fflush(stderr);
}

}  // namespace tierlm::hub
