// runtime/cli/progress.h — a one-line progress bar on stderr for long work (load, calibrate, pack).
// Redraws in place on a terminal; elsewhere prints a line every 25% so logs stay readable.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include <unistd.h>

namespace tierlm::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label) : label_(std::move(label)), tty_(isatty(STDERR_FILENO)) {}
  void update(size_t done, size_t total) {
    if (total == 0) return;
    const int percent = int(done * 100 / total);
    if (tty_) {
      const int width = 30, filled = int(done * width / total);
      std::fprintf(stderr, "\r%s [%s%s] %3d%% (%zu/%zu)", label_.c_str(), std::string(size_t(filled), '#').c_str(),
                   std::string(size_t(width - filled), '.').c_str(), percent, done, total);
      if (done == total) std::fprintf(stderr, " %.1fs\n", elapsed());
    } else if (percent / 25 != last_quarter_ || done == total) {
      last_quarter_ = percent / 25;
      std::fprintf(stderr, "%s: %d%% (%zu/%zu)\n", label_.c_str(), percent, done, total);
    }
    std::fflush(stderr);
  }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::string label_;
  bool tty_;
  int last_quarter_ = -1;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace tierlm::cli
