// StepExecutors that run in this process: a single runner, or a TP x PP
// cluster of runners on threads joined by fake communicators. The threaded
// one exercises exactly the sharded code paths of the real cluster, which
// makes TP/PP equivalence testable in one process.
#include <algorithm>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "collectives/fake_communicator.h"
#include "coordinator/step_executor.h"
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
  return PoolConfigForShard(w.config, w.spec, o.block_size, o.kv_cache_dtype,
                            o.kv_cache_bytes, o.cpu_offload_bytes);
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

// Rank threads wait for a step, run it, and report; Forward() hands the
// step out and waits for every rank.
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

  std::vector<RunnerStats> RankStats() const override {
    std::lock_guard<std::mutex> lock(mu_);  // Not during a step.
    std::vector<RunnerStats> stats;
    for (const auto& r : runners_) stats.push_back(r->stats());
    return stats;
  }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    std::unique_lock<std::mutex> lock(mu_);
    step_ = &step;
    pending_ = static_cast<int>(runners_.size());
    status_ = absl::OkStatus();
    ++generation_;
    cv_.notify_all();
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    step_ = nullptr;
    if (!status_.ok()) return status_;
    return SampleStep(step, std::move(logits_));
  }

 private:
  void Loop(size_t r) {
    SetCpuThreads(threads_per_rank_);  // Per-thread OpenMP setting.
    uint64_t seen = 0;
    // The logits come from the last stage's TP rank 0.
    const bool reports = r == static_cast<size_t>((pp_ - 1) * tp_);
    while (true) {
      const StepInput* step;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        step = step_;
      }
      absl::StatusOr<Tensor> out = runners_[r]->Forward(*step);
      std::lock_guard<std::mutex> lock(mu_);
      if (!out.ok() && status_.ok()) {
        status_ =
            absl::Status(out.status().code(),
                         absl::StrCat("rank pp ", r / tp_, " tp ", r % tp_,
                                      ": ", out.status().message()));
      }
      if (out.ok() && reports) logits_ = std::move(*out);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  const int threads_per_rank_;
  std::vector<std::unique_ptr<Communicator>> comms_;  // Outlive runners.
  std::vector<std::unique_ptr<ShardRunner>> runners_;
  PoolBlocks blocks_;
  int tp_, pp_;
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const StepInput* step_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  absl::Status status_;
  Tensor logits_;
  std::vector<std::thread> threads_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StepExecutor>> CreateInProcessExecutor(
    const WeightSource& source, const ExecutorOptions& o) {
  if (o.block_size <= 0 || o.kv_cache_bytes < 0 || o.cpu_offload_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_size (", o.block_size, ") must be positive, kv_cache_bytes (",
        o.kv_cache_bytes, ") and cpu_offload_bytes (", o.cpu_offload_bytes,
        ") not negative"));
  }
  ASSIGN_OR_RETURN(ShardPlan plan, PlanShards(source, o.tp, o.pp));
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
