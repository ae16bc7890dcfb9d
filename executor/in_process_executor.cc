// StepExecutors that run in this process: a single runner, or a TP x PP
// cluster of runners on threads joined by fake communicators. The threaded
// one exercises exactly the sharded code paths of the real cluster, which
// makes TP/PP equivalence testable in one process.
#include "executor/in_process_executor.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "collectives/fake_communicator.h"
#include "core/status.h"
#include "kernels/threading.h"
#include "model/shard_plan.h"
#include "worker/shard.h"

namespace shardlm {
namespace {

class SingleExecutor : public StepExecutor {
 public:
  explicit SingleExecutor(std::unique_ptr<Shard> shard)
      : shard_(std::move(shard)) {}
  const ModelConfig& config() const override { return shard_->config(); }
  int64_t num_kv_blocks() const override { return shard_->blocks().device; }
  int64_t num_host_kv_blocks() const override { return shard_->blocks().host; }
  DType kv_cache_dtype() const override { return shard_->kv_dtype(); }
  int64_t weight_bytes() const override { return shard_->weight_bytes(); }
  std::vector<RunnerStats> RankStats() const override {
    return {shard_->stats()};
  }
  absl::StatusOr<StepOutput> Forward(const StepInput& step) override {
    return shard_->Step(step);
  }

 private:
  std::unique_ptr<Shard> shard_;
};

// Rank threads run the submitted steps in order, each at its own pace, and
// report; Collect() waits for every rank of the oldest step. With PP > 1
// up to pp steps are in flight: stage 0 runs step k + 1 while stage 1 runs
// step k (the fake communicators match messages in order).
class ThreadedExecutor : public StepExecutor {
 public:
  ThreadedExecutor(std::vector<std::unique_ptr<Communicator>> comms,
                   std::vector<std::unique_ptr<Shard>> shards,
                   int threads_per_rank)
      : threads_per_rank_(threads_per_rank),
        comms_(std::move(comms)),
        shards_(std::move(shards)),
        blocks_(shards_[0]->blocks()),
        tp_(shards_[0]->spec().tp_size),
        pp_(shards_[0]->spec().pp_size),
        cp_(shards_[0]->spec().cp_size) {
    for (const auto& s : shards_) stats_.push_back(s->stats());
    for (size_t r = 0; r < shards_.size(); ++r) {
      threads_.emplace_back([this, r] { Loop(r); });
    }
  }
  ~ThreadedExecutor() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : threads_) t.join();
  }

  const ModelConfig& config() const override { return shards_[0]->config(); }
  // The CP group's: each CP rank holds blocks_ of them.
  int64_t num_kv_blocks() const override { return blocks_.device * cp_; }
  int64_t num_host_kv_blocks() const override { return blocks_.host * cp_; }
  DType kv_cache_dtype() const override { return shards_[0]->kv_dtype(); }
  int64_t weight_bytes() const override {
    int64_t total = 0;
    for (const auto& s : shards_) total += s->weight_bytes();
    return total;
  }

  // As of each rank's last finished step (copied by the rank thread: a
  // runner updates its figures while it steps).
  std::vector<RunnerStats> RankStats() const override {
    absl::MutexLock lock(&mu_);
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
    job->pending = static_cast<int>(shards_.size());
    absl::MutexLock lock(&mu_);
    jobs_.push_back(std::move(job));
    return absl::OkStatus();
  }
  absl::StatusOr<StepOutput> Collect() override {
    std::shared_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      if (jobs_.empty()) {
        return absl::FailedPreconditionError("Collect with no step in flight");
      }
      job = jobs_.front();
      const auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return job->pending == 0;
      };
      mu_.Await(absl::Condition(&done));
      jobs_.pop_front();
      ++collected_;
    }
    if (!job->status.ok()) return job->status;
    return std::move(job->output);
  }

 private:
  struct Job {
    StepInput step;
    int pending = 0;  // Ranks that have not finished it.
    absl::Status status;
    StepOutput output;  // The sampling shard's.
  };

  void Loop(size_t r) {
    SetCpuThreads(threads_per_rank_);  // Per-thread OpenMP setting.
    uint64_t next = 0;  // The number of the next step this rank runs.
    while (true) {
      std::shared_ptr<Job> job;
      {
        absl::MutexLock lock(&mu_);
        const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || next < collected_ + jobs_.size();
        };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        job = jobs_[next - collected_];
      }
      absl::StatusOr<StepOutput> out = shards_[r]->Step(job->step);
      const RunnerStats stats = shards_[r]->stats();
      absl::MutexLock lock(&mu_);
      stats_[r] = stats;
      if (!out.ok() && job->status.ok()) {
        const ShardSpec& spec = shards_[r]->spec();
        job->status = absl::Status(
            out.status().code(),
            absl::StrCat("rank pp ", spec.pp_rank, " tp ", spec.tp_rank,
                         cp_ > 1 ? absl::StrCat(" cp ", spec.cp_rank) : "",
                         ": ", out.status().message()));
      }
      if (out.ok() && shards_[r]->spec().samples()) {
        job->output = std::move(*out);
      }
      ++next;
      --job->pending;
    }
  }

  const int threads_per_rank_;
  std::vector<std::unique_ptr<Communicator>> comms_;  // Outlive shards.
  std::vector<std::unique_ptr<Shard>> shards_;
  const KvBlockCounts blocks_;  // Every shard's.
  int tp_, pp_, cp_;
  // Waiters wait on conditions over these (Mutex::Await), re-checked
  // whenever the mutex is released. A Job's fields are guarded by it too.
  mutable absl::Mutex mu_;
  // Submitted and not collected, oldest first; step number collected_ + i.
  std::deque<std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t collected_ ABSL_GUARDED_BY(mu_) = 0;
  // Per rank, after its last step.
  std::vector<RunnerStats> stats_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StepExecutor>> CreateInProcessExecutor(
    const WeightSource& source, const ExecutorOptions& o) {
  if (o.cp < 1 || o.cp > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cp must be in [1, 64], got ", o.cp));
  }
  RETURN_IF_ERROR(CheckContextParallel(source.config(), o.cp));
  ASSIGN_OR_RETURN(ShardPlan plan, PlanShards(source, o.tp, o.pp,
                                              o.moe_sharding, o.pp_balance));
  // Every shard loads, then every one gets the blocks all of them hold.
  // Rank (pp_rank * cp + cp_rank) * tp + tp_rank.
  std::vector<std::unique_ptr<Shard>> shards;
  KvBlockCounts blocks = KvBlockCounts::Unbounded();
  for (int p = 0; p < o.pp; ++p) {
    for (int c = 0; c < o.cp; ++c) {
      for (int t = 0; t < o.tp; ++t) {
        const ShardSpec spec =
            plan.ForRank({.tp_rank = t, .cp_rank = c, .pp_rank = p}, o.cp);
        ASSIGN_OR_RETURN(
            std::unique_ptr<Shard> shard,
            LoadCpuShard(source,
                         {.spec = spec,
                          .kv = o.kv,
                          .limits = o.limits,
                          .threads = o.threads_per_rank,
                          .name = absl::StrCat(
                              "shard pp ", p, " tp ", t,
                              o.cp > 1 ? absl::StrCat(" cp ", c) : "")}));
        ASSIGN_OR_RETURN(const KvBlockCounts available,
                         shard->BlocksAvailable());
        blocks = blocks.Min(available);
        shards.push_back(std::move(shard));
      }
    }
  }
  if (shards.size() == 1) {
    RETURN_IF_ERROR(shards[0]->InitializeCache(blocks, {}));
    return std::make_unique<SingleExecutor>(std::move(shards[0]));
  }
  InProcessComms comms = MakeInProcessComms(o.tp, o.pp, nullptr, o.cp);
  for (size_t r = 0; r < shards.size(); ++r) {
    RETURN_IF_ERROR(shards[r]->InitializeCache(blocks, comms.per_rank[r]));
  }
  return NewThreadedExecutor(std::move(comms.owned), std::move(shards),
                             std::max(1, o.threads_per_rank));
}

absl::StatusOr<InProcessComms> MakeGroupComms(int tp, int pp,
                                              const MakeGroupMember& make) {
  const int ranks = tp * pp;
  InProcessComms out;
  out.per_rank.resize(ranks);
  std::vector<std::vector<std::unique_ptr<Communicator>>> made(ranks);
  std::vector<absl::Status> status(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      std::vector<GroupMember> members;
      for (const ShardGroup& g :
           ShardGroups(PlaceOfRank(r, tp, 1), tp, 1, pp)) {
        if (g.size() == 1) continue;
        members.push_back({.group = g.name,
                           .rank = g.rank,
                           .size = g.size(),
                           .cluster_rank = r});
      }
      for (const GroupMember& m : members) {
        absl::StatusOr<std::unique_ptr<Communicator>> c = make(m);
        if (!c.ok()) {
          status[r] = absl::Status(
              c.status().code(), absl::StrCat(m.group, ", rank ", m.rank, ": ",
                                              c.status().message()));
          return;
        }
        made[r].push_back(*std::move(c));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // The cause first: a member that failed outright makes its peers wait
  // out their deadlines.
  for (const absl::Status& s : status) {
    if (!s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded) return s;
  }
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  for (int r = 0; r < ranks; ++r) {
    size_t i = 0;
    if (tp > 1) out.per_rank[r].tp = made[r][i++].get();
    if (pp > 1) out.per_rank[r].pp = made[r][i++].get();
    for (auto& c : made[r]) out.owned.push_back(std::move(c));
  }
  return out;
}

InProcessComms MakeInProcessComms(
    int tp, int pp,
    const std::function<
        std::unique_ptr<Communicator>(std::unique_ptr<Communicator>)>& wrap,
    int cp) {
  const auto add = [&](std::unique_ptr<Communicator> c, InProcessComms& out) {
    Communicator* raw = nullptr;
    if (wrap) c = wrap(std::move(c));
    raw = c.get();
    out.owned.push_back(std::move(c));
    return raw;
  };
  // Each group (ShardGroups) made when its first member comes up; groups
  // of one are left out (null: a group of one).
  InProcessComms out;
  const int ranks = tp * pp * cp;
  out.per_rank.resize(ranks);
  std::map<std::string, std::vector<std::unique_ptr<Communicator>>> groups;
  for (int r = 0; r < ranks; ++r) {
    for (const ShardGroup& g :
         ShardGroups(PlaceOfRank(r, tp, cp), tp, cp, pp)) {
      if (g.size() == 1) continue;
      auto& group = groups[g.name];
      if (group.empty()) group = MakeFakeGroup(g.size(), g.name);
      Communicator* c = add(std::move(group[g.rank]), out);
      switch (g.kind) {
        case GroupKind::kTp:
          out.per_rank[r].tp = c;
          break;
        case GroupKind::kCp:
          out.per_rank[r].cp = c;
          break;
        case GroupKind::kPp:
          out.per_rank[r].pp = c;
          break;
      }
    }
  }
  return out;
}

std::unique_ptr<StepExecutor> NewThreadedExecutor(
    std::vector<std::unique_ptr<Communicator>> comms,
    std::vector<std::unique_ptr<Shard>> shards, int threads_per_rank) {
  return std::make_unique<ThreadedExecutor>(std::move(comms), std::move(shards),
                                            threads_per_rank);
}

}  // namespace shardlm
