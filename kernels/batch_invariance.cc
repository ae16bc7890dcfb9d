#include "kernels/batch_invariance.h"

#include <atomic>

namespace shardlm {
namespace {

std::atomic<bool> batch_invariant{false};

}  // namespace

void SetBatchInvariant(bool on) { batch_invariant.store(on); }

bool BatchInvariant() {
  return batch_invariant.load(std::memory_order_relaxed);
}

}  // namespace shardlm
