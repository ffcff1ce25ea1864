#include "runtime/kernels/matmul_scratch.h"

#include <algorithm>

namespace tierlm::kernels {

namespace {

thread_local MatmulScratch* t_scoped = nullptr;

}  // namespace

void* MatmulScratch::region(Region r, size_t bytes) {
  tiering::LedgerBuffer& b = regions_[size_t(r)];
  if (b.size() < bytes || b.empty()) {
    b.reset();  // the old block goes first: a region never holds two blocks at once
    b = tiering::LedgerBuffer(*ledger_, tiering::accounts::scratch, std::max<size_t>(bytes, 1));
  }
  return b.data();
}

void MatmulScratch::reserve(const Sizes& sizes) {
  for (int r = 0; r < kRegions; ++r)
    if (sizes[size_t(r)] > 0) region(Region(r), sizes[size_t(r)]);
}

uint64_t MatmulScratch::bytes() const {
  uint64_t total = 0;
  for (const auto& b : regions_) total += b.size();
  return total;
}

MatmulScratch& MatmulScratch::current() {
  if (t_scoped) return *t_scoped;
  // Declared in this order so the ledger outlives the scratch charged to it at thread exit.
  thread_local tiering::Ledger own_ledger;
  thread_local MatmulScratch own(own_ledger);
  return own;
}

MatmulScratch::Scope::Scope(MatmulScratch& scratch) : previous_(t_scoped) { t_scoped = &scratch; }
MatmulScratch::Scope::~Scope() { t_scoped = previous_; }

}  // namespace tierlm::kernels
