#include "runtime/kv/turbo_quant.h"

#include <cmath>
#include <map>
#include <memory>
#include <mutex>

#include "runtime/kernels/splitmix64.h"

namespace tierlm::kv {

namespace {

double normal_pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }
double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// Lloyd-Max for N(0,1): alternate midpoint thresholds and conditional means E[X | a < X < b] =
// (pdf(a) - pdf(b)) / (cdf(b) - cdf(a)) until the levels stop moving.
std::vector<double> lloyd_max(int levels) {
  std::vector<double> c(static_cast<size_t>(levels));
  for (int i = 0; i < levels; ++i) c[size_t(i)] = -2.5 + 5.0 * (i + 0.5) / levels;
  for (int iter = 0; iter < 10000; ++iter) {
    double moved = 0;
    for (int i = 0; i < levels; ++i) {
      const double a = i == 0 ? -INFINITY : 0.5 * (c[size_t(i - 1)] + c[size_t(i)]);
      const double b = i == levels - 1 ? INFINITY : 0.5 * (c[size_t(i)] + c[size_t(i + 1)]);
      const double pa = std::isinf(a) ? 0.0 : normal_pdf(a), pb = std::isinf(b) ? 0.0 : normal_pdf(b);
      const double mass = (std::isinf(b) ? 1.0 : normal_cdf(b)) - (std::isinf(a) ? 0.0 : normal_cdf(a));
      const double next = (pa - pb) / mass;
      moved = std::max(moved, std::fabs(next - c[size_t(i)]));
      c[size_t(i)] = next;
    }
    if (moved < 1e-12) break;
  }
  return c;
}

// splitmix64: a fixed, portable stream so tables are identical on every machine and run.
struct Stream {
  uint64_t s;
  uint64_t next() { return kernels::splitmix64_next(s); }
  double uniform() { return (double(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
};

}  // namespace

void walsh_hadamard(float* x, int n) {
  for (int h = 1; h < n; h *= 2)
    for (int i = 0; i < n; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

TurboTables::TurboTables(int d) : d_(d), signs_(static_cast<size_t>(d)), qjl_(static_cast<size_t>(d) * size_t(d)) {
  for (int bits = 1; bits <= 4; ++bits) {
    const auto c = lloyd_max(1 << bits);
    for (size_t i = 0; i < c.size(); ++i) centroids_[size_t(bits)][i] = float(c[i]);
    for (size_t i = 0; i + 1 < c.size(); ++i) thresholds_[size_t(bits)][i] = float(0.5 * (c[i] + c[i + 1]));
  }
  Stream rng{0x7E4B0C0DEull ^ uint64_t(d)};
  for (auto& s : signs_) s = (rng.next() >> 63) ? -1.0f : 1.0f;
  for (size_t i = 0; i < qjl_.size(); i += 2) {  // Box-Muller pairs
    const double r = std::sqrt(-2.0 * std::log(rng.uniform())), t = 2.0 * M_PI * rng.uniform();
    qjl_[i] = float(r * std::cos(t));
    if (i + 1 < qjl_.size()) qjl_[i + 1] = float(r * std::sin(t));
  }
}

const TurboTables& TurboTables::get(int d) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<TurboTables>> tables;
  std::lock_guard lock(mutex);
  auto& slot = tables[d];
  if (!slot) slot.reset(new TurboTables(d));
  return *slot;
}

int TurboTables::quantize(float z, int bits) const {
  const auto& t = thresholds_[size_t(bits)];
  int code = 0;
  for (int i = 0; i < (1 << bits) - 1; ++i) code += z > t[size_t(i)];
  return code;
}

void TurboTables::rotate(const float* x, float* y) const {
  const float norm = 1.0f / std::sqrt(float(d_));
  for (int i = 0; i < d_; ++i) y[i] = x[i] * signs_[size_t(i)];
  walsh_hadamard(y, d_);
  for (int i = 0; i < d_; ++i) y[i] *= norm;
}

void TurboTables::unrotate(const float* y, float* x) const {
  const float norm = 1.0f / std::sqrt(float(d_));
  for (int i = 0; i < d_; ++i) x[i] = y[i];
  walsh_hadamard(x, d_);
  for (int i = 0; i < d_; ++i) x[i] *= norm * signs_[size_t(i)];
}

void TurboTables::project(const float* x, float* y) const {
  for (int i = 0; i < d_; ++i) {
    const float* row = qjl_.data() + size_t(i) * size_t(d_);
    float s = 0;
    for (int j = 0; j < d_; ++j) s += row[j] * x[j];
    y[i] = s;
  }
}

void TurboTables::project_transposed(const float* y, float* x) const {
  for (int j = 0; j < d_; ++j) x[j] = 0;
  for (int i = 0; i < d_; ++i) {
    const float* row = qjl_.data() + size_t(i) * size_t(d_);
    for (int j = 0; j < d_; ++j) x[j] += row[j] * y[i];
  }
}

}  // namespace tierlm::kv
