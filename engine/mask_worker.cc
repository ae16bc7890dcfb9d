#include "engine/mask_worker.h"

#include <utility>

#include "grammar/token_constraint.h"

namespace shardlm {

std::vector<RowMask> ComputeMasks(absl::Span<const MaskRow> rows, int64_t vocab,
                                  double* seconds) {
  std::vector<RowMask> out;
  out.reserve(rows.size());
  *seconds = 0;
  for (const MaskRow& r : rows) {
    // Timed by the constraint (as its metrics are).
    const double before = r.constraint->mask_seconds();
    RowMask& m = out.emplace_back();
    m.row = r.row;
    r.constraint->Allowed(vocab, m.allowed);
    *seconds += r.constraint->mask_seconds() - before;
  }
  return out;
}

MaskWorker::MaskWorker(int64_t vocab)
    : vocab_(vocab), thread_([this] { Loop(); }) {}

MaskWorker::~MaskWorker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

std::shared_ptr<LateMasks> MaskWorker::Start(std::vector<MaskRow> rows) {
  if (rows.empty()) return nullptr;
  auto masks = std::make_shared<LateMasks>();
  absl::MutexLock lock(&mu_);
  jobs_.push_back({.rows = std::move(rows), .masks = masks});
  return masks;
}

void MaskWorker::Loop() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !jobs_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (jobs_.empty()) return;  // Stopping, every job done.
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    double seconds = 0;
    std::vector<RowMask> masks = ComputeMasks(job.rows, vocab_, &seconds);
    job.masks->Set(std::move(masks), seconds);
  }
}

}  // namespace shardlm
