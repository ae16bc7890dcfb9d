// StepExecutors that run in this process: a single runner, or a TP x PP
// cluster of runners on threads joined by fake communicators. The threaded
// one exercises exactly the sharded code paths of the real cluster, which
// makes TP/PP equivalence testable in one process.
#include "coordinator/in_process_executor.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "collectives/fake_communicator.h"
#include "core/status.h"
#include "kernels/threading.h"
#include "model/shard_plan.h"
#include "worker/model_runner.h"

namespace shardlm {
namespace {

// Every rank gets the same block counts (the minimum over ranks), so that
// a block id means the same slot everywhere.
struct PoolBlocks {
  int64_t device = std::numeric_limits<int64_t>::max();
  int64_t host = std::numeric_limits<int64_t>::max();
};

absl::StatusOr<KvPoolConfig> PoolConfig(const LlamaWeights& w,
                                        const ExecutorOptions& o) {
  return PoolConfigForShard(w.config, w.spec, o.kv.block_size,
                            o.kv.DTypeOnCpu(), o.kv.kv_cache_bytes,
                            o.kv.cpu_offload_bytes);
}

absl::StatusOr<std::unique_ptr<KvPool>> MakePool(const LlamaWeights& w,
                                                 const ExecutorOptions& o,
                                                 PoolBlocks blocks) {
  ASSIGN_OR_RETURN(KvPoolConfig kv, PoolConfig(w, o));
  kv.num_blocks = blocks.device;
  kv.num_host_blocks = blocks.host;
  return KvPool::Create(kv);
}

class SingleExecutor : public StepExecutor {
 public:
  SingleExecutor(std::unique_ptr<ModelRunner> runner, int threads)
      : runner_(std::move(runner)) {
    // The scheduler's loop thread runs the steps, not the creating one.
    runner_->set_cpu_threads(threads);
  }
  const ModelConfig& config() const override { return runner_->config(); }
  int64_t num_kv_blocks() const override {
    return runner_->kv().config().num_blocks;
  }
  int64_t num_host_kv_blocks() const override {
    return runner_->kv().config().num_host_blocks;
  }
  DType kv_cache_dtype() const override { return runner_->kv_dtype(); }
  int64_t weight_bytes() const override { return runner_->weights().bytes(); }
  std::vector<RunnerStats> RankStats() const override {
    return {runner_->stats()};
  }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    ASSIGN_OR_RETURN(Tensor logits, runner_->Forward(step));
    return SampleStep(step, std::move(logits));
  }

 private:
  std::unique_ptr<ModelRunner> runner_;
};

// Rank threads run the submitted steps in order, each at its own pace, and
// report; Collect() waits for every rank of the oldest step. With PP > 1
// up to pp steps are in flight: stage 0 runs step k + 1 while stage 1 runs
// step k (the fake communicators match messages in order).
class ThreadedExecutor : public StepExecutor {
 public:
  ThreadedExecutor(std::vector<std::unique_ptr<Communicator>> comms,
                   std::vector<std::unique_ptr<ShardRunner>> runners,
                   PoolBlocks blocks, int tp, int pp, int threads_per_rank)
      : threads_per_rank_(threads_per_rank),
        comms_(std::move(comms)),
        runners_(std::move(runners)),
        blocks_(blocks),
        tp_(tp),
        pp_(pp) {
    for (const auto& r : runners_) stats_.push_back(r->stats());
    for (size_t r = 0; r < runners_.size(); ++r) {
      threads_.emplace_back([this, r] { Loop(r); });
    }
  }
  ~ThreadedExecutor() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  const ModelConfig& config() const override { return runners_[0]->config(); }
  int64_t num_kv_blocks() const override { return blocks_.device; }
  int64_t num_host_kv_blocks() const override { return blocks_.host; }
  DType kv_cache_dtype() const override { return runners_[0]->kv_dtype(); }
  int64_t weight_bytes() const override {
    int64_t total = 0;
    for (const auto& r : runners_) total += r->weight_bytes();
    return total;
  }

  // As of each rank's last finished step (copied by the rank thread: a
  // runner updates its figures while it steps).
  std::vector<RunnerStats> RankStats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    RETURN_IF_ERROR(Submit(step));
    return Collect();
  }
  int max_steps_in_flight() const override { return pp_; }
  absl::Status Submit(const StepInput& step) override {
    auto job = std::make_shared<Job>();
    job->step = step;
    job->pending = static_cast<int>(runners_.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_all();
    return absl::OkStatus();
  }
  absl::StatusOr<StepOutput> Collect() override {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (jobs_.empty()) {
        return absl::FailedPreconditionError("Collect with no step in flight");
      }
      job = jobs_.front();
      done_cv_.wait(lock, [&] { return job->pending == 0; });
      jobs_.pop_front();
      ++collected_;
    }
    if (!job->status.ok()) return job->status;
    return SampleStep(job->step, std::move(job->logits));
  }

 private:
  struct Job {
    StepInput step;
    int pending = 0;  // Ranks that have not finished it.
    absl::Status status;
    Tensor logits;
  };

  void Loop(size_t r) {
    SetCpuThreads(threads_per_rank_);  // Per-thread OpenMP setting.
    uint64_t next = 0;  // The number of the next step this rank runs.
    // The logits come from the last stage's TP rank 0.
    const bool reports = r == static_cast<size_t>((pp_ - 1) * tp_);
    while (true) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock,
                 [&] { return stop_ || next < collected_ + jobs_.size(); });
        if (stop_) return;
        job = jobs_[next - collected_];
      }
      absl::StatusOr<Tensor> out = runners_[r]->Forward(job->step);
      const RunnerStats stats = runners_[r]->stats();
      std::lock_guard<std::mutex> lock(mu_);
      stats_[r] = stats;
      if (!out.ok() && job->status.ok()) {
        job->status =
            absl::Status(out.status().code(),
                         absl::StrCat("rank pp ", r / tp_, " tp ", r % tp_,
                                      ": ", out.status().message()));
      }
      if (out.ok() && reports) job->logits = std::move(*out);
      ++next;
      if (--job->pending == 0) done_cv_.notify_all();
    }
  }

  const int threads_per_rank_;
  std::vector<std::unique_ptr<Communicator>> comms_;  // Outlive runners.
  std::vector<std::unique_ptr<ShardRunner>> runners_;
  PoolBlocks blocks_;
  int tp_, pp_;
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  // Submitted and not collected, oldest first; step number collected_ + i.
  std::deque<std::shared_ptr<Job>> jobs_;
  uint64_t collected_ = 0;
  std::vector<RunnerStats> stats_;  // Per rank, after its last step.
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StepExecutor>> CreateInProcessExecutor(
    const WeightSource& source, const ExecutorOptions& o) {
  if (o.kv.block_size <= 0 || o.kv.kv_cache_bytes < 0 ||
      o.kv.cpu_offload_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_size (", o.kv.block_size, ") must be positive, kv_cache_bytes (",
        o.kv.kv_cache_bytes, ") and cpu_offload_bytes (",
        o.kv.cpu_offload_bytes, ") not negative"));
  }
  ASSIGN_OR_RETURN(ShardPlan plan,
                   PlanShards(source, o.tp, o.pp, o.moe_sharding));
  std::vector<LlamaWeights> weights;
  PoolBlocks blocks;
  for (const ShardSpec& spec : plan.shards) {
    ASSIGN_OR_RETURN(
        LlamaWeights w,
        LoadLlamaWeights(source, spec,
                         LogLoadProgress(absl::StrCat("shard pp ", spec.pp_rank,
                                                      " tp ", spec.tp_rank))));
    ASSIGN_OR_RETURN(KvPoolConfig kv, PoolConfig(w, o));
    blocks.device = std::min(blocks.device, kv.num_blocks);
    blocks.host = std::min(blocks.host, kv.num_host_blocks);
    weights.push_back(std::move(w));
  }
  if (plan.shards.size() == 1) {
    ASSIGN_OR_RETURN(auto pool, MakePool(weights[0], o, blocks));
    return std::make_unique<SingleExecutor>(
        std::make_unique<ModelRunner>(std::move(weights[0]), std::move(pool)),
        o.threads_per_rank);
  }
  InProcessComms comms = MakeInProcessComms(o.tp, o.pp);
  std::vector<std::unique_ptr<ShardRunner>> runners;
  for (size_t r = 0; r < weights.size(); ++r) {
    ASSIGN_OR_RETURN(auto pool, MakePool(weights[r], o, blocks));
    runners.push_back(std::make_unique<ModelRunner>(
        std::move(weights[r]), std::move(pool), comms.per_rank[r]));
  }
  return NewThreadedExecutor(std::move(comms.owned), std::move(runners),
                             blocks.device, blocks.host, o.tp, o.pp,
                             std::max(1, o.threads_per_rank));
}

InProcessComms MakeInProcessComms(
    int tp, int pp,
    const std::function<
        std::unique_ptr<Communicator>(std::unique_ptr<Communicator>)>& wrap) {
  const auto add = [&](std::unique_ptr<Communicator> c, InProcessComms& out) {
    Communicator* raw = nullptr;
    if (wrap) c = wrap(std::move(c));
    raw = c.get();
    out.owned.push_back(std::move(c));
    return raw;
  };
  // One TP group per stage, one PP chain per TP index.
  InProcessComms out;
  out.per_rank.resize(static_cast<size_t>(tp) * pp);
  if (tp > 1) {
    for (int p = 0; p < pp; ++p) {
      auto group = MakeFakeGroup(tp, absl::StrCat("tp group of stage ", p));
      for (int t = 0; t < tp; ++t) {
        out.per_rank[p * tp + t].tp = add(std::move(group[t]), out);
      }
    }
  }
  if (pp > 1) {
    for (int t = 0; t < tp; ++t) {
      auto chain = MakeFakeGroup(pp, absl::StrCat("pp chain of tp ", t));
      for (int p = 0; p < pp; ++p) {
        out.per_rank[p * tp + t].pp = add(std::move(chain[p]), out);
      }
    }
  }
  return out;
}

std::unique_ptr<StepExecutor> NewThreadedExecutor(
    std::vector<std::unique_ptr<Communicator>> comms,
    std::vector<std::unique_ptr<ShardRunner>> runners, int64_t device_blocks,
    int64_t host_blocks, int tp, int pp, int threads_per_rank) {
  return std::make_unique<ThreadedExecutor>(
      std::move(comms), std::move(runners),
      PoolBlocks{.device = device_blocks, .host = host_blocks}, tp, pp,
      threads_per_rank);
}

}  // namespace shardlm
