// runtime/gpu/dequant_ahead.cpp — see dequant_ahead.h. Piece i goes to slot i % slots: its write waits for the GEMM
// of piece i - slots (free_), and the GEMM of piece i waits for its write (ready_). Events are recorded and waited on
// in host order (a wait binds to the event's latest record), so piece i + slots is issued only after the compute
// stream's wait for piece i is enqueued.
#ifdef TIERLM_HAVE_CUDA

#include "runtime/gpu/dequant_ahead.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace tierlm::gpu {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("gpu: dequant ahead: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

DequantAhead::DequantAhead(std::vector<void*> slots, int64_t slot_elements)
    : slots_(std::move(slots)), slot_elements_(slot_elements) {
  if (slots_.size() < 2) throw std::invalid_argument("gpu: dequant ahead needs at least 2 slots");
  int least = 0, greatest = 0;
  check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "priority range");
  // The lowest priority: the compute stream's blocks are dispatched first when both have work pending.
  check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, least), "stream");
  for (size_t i = 0; i < slots_.size(); ++i) {
    cudaEvent_t a = nullptr, b = nullptr;
    check(cudaEventCreateWithFlags(&a, cudaEventDisableTiming), "event");
    ready_.push_back(a);
    check(cudaEventCreateWithFlags(&b, cudaEventDisableTiming), "event");
    free_.push_back(b);
  }
}

DequantAhead::~DequantAhead() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto e : ready_) cudaEventDestroy(e);
  for (auto e : free_) cudaEventDestroy(e);
  if (stream_) cudaStreamDestroy(stream_);
}

void DequantAhead::begin(std::vector<Piece> pieces) {
  for (const Piece& p : pieces)
    if (p.rows * p.matrix.cols > slot_elements_)
      throw std::logic_error("gpu: dequant ahead: a piece larger than a slot");
  pieces_ = std::move(pieces);
  next_use_ = next_issue_ = 0;
  issue();
}

// Issues every piece whose slot's previous piece has been consumed: up to slots() pieces from the next one used.
void DequantAhead::issue() {
  while (next_issue_ < pieces_.size() && next_issue_ < next_use_ + slots_.size()) {
    const size_t i = next_issue_++, s = i % slots_.size();
    if (i >= slots_.size()) check(cudaStreamWaitEvent(stream_, free_[s]), "wait free");
    const Piece& p = pieces_[i];
    device::dequantize_f16(p.matrix, p.r0, p.rows, slots_[s], stream_);
    check(cudaEventRecord(ready_[s], stream_), "record ready");
  }
}

const void* DequantAhead::take(const device::MatrixRef& matrix, int64_t r0, int64_t rows, cudaStream_t compute) {
  if (!active()) throw std::logic_error("gpu: dequant ahead: no piece left");
  const Piece& p = pieces_[next_use_];
  if (p.matrix.data != matrix.data || p.r0 != r0 || p.rows != rows)
    throw std::logic_error("gpu: dequant ahead: the GEMMs run in another order than planned");
  const size_t s = next_use_ % slots_.size();
  check(cudaStreamWaitEvent(compute, ready_[s]), "wait ready");
  return slots_[s];
}

void DequantAhead::consumed(cudaStream_t compute) {
  const size_t s = next_use_ % slots_.size();
  check(cudaEventRecord(free_[s], compute), "record free");
  ++next_use_;
  issue();
}

void DequantAhead::end() {
  pieces_.clear();
  next_use_ = next_issue_ = 0;
}

}  // namespace tierlm::gpu

#endif
