// runtime/hub/download_progress.h — the download's progress on stderr: bytes done of total, rate and ETA. On a
// terminal one line redrawn in place (at most 10 times a second); elsewhere a plain line every few seconds, so logs
// stay readable. Owns only its output; never stdout.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tierlm::hub {

class DownloadProgress {
 public:
  // `already` bytes were on disk before this run (resumed or cached) and count as done but not toward the rate.
  DownloadProgress(std::string label, uint64_t total, uint64_t already, double plain_interval_seconds = 5.0);
  void add(uint64_t fetched_bytes);  // bytes that just arrived
  void finish();                     // the closing line
  uint64_t fetched() const { return fetched_; }

 private:
  void draw(bool final_line);
  std::string label_;
  uint64_t total_, already_, fetched_ = 0;
  bool tty_;
  double plain_interval_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "1.5 GB", "830 kB" (decimal units, as download tools print them).
std::string human_bytes(double bytes);

}  // namespace tierlm::hub
