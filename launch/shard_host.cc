#include "launch/shard_host.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/threading.h"
#include "model/shard_plan.h"
#include "worker/kv_pool.h"
#include "worker/llama_weights.h"

namespace shardlm {

absl::StatusOr<std::unique_ptr<CommShardHost>> MpiShardHost(
    const WeightSource* source, MpiCommunicator& workers, int tp, int pp) {
  if (workers.size() != tp * pp) {
    return absl::InvalidArgumentError(
        absl::StrCat(workers.size(), " workers for tp ", tp, " x pp ", pp));
  }
  const int tp_rank = workers.rank() % tp, pp_rank = workers.rank() / tp;
  // Every worker takes part in both splits, in the same order.
  auto split = std::make_shared<ShardCommunicators>();
  ASSIGN_OR_RETURN(split->tp,
                   workers.Split(pp_rank, tp_rank,
                                 absl::StrCat("tp group of stage ", pp_rank)));
  ASSIGN_OR_RETURN(split->pp,
                   workers.Split(tp_rank, pp_rank,
                                 absl::StrCat("pp chain of tp ", tp_rank)));
  auto connect =
      [=](const WorkerAssignment& a) -> absl::StatusOr<ShardCommunicators> {
    if (a.tp != tp || a.pp != pp || a.tp_rank != tp_rank ||
        a.pp_rank != pp_rank) {
      return absl::FailedPreconditionError(
          absl::StrCat("assigned tp ", a.tp_rank, "/", a.tp, " pp ", a.pp_rank,
                       "/", a.pp, " but this MPI rank is tp ", tp_rank, "/", tp,
                       " pp ", pp_rank, "/", pp));
    }
    if (split->tp == nullptr) {
      return absl::FailedPreconditionError("assigned twice");
    }
    return std::move(*split);
  };
  return std::make_unique<CommShardHost>(source, std::move(connect));
}

absl::StatusOr<KvPoolConfig> CommShardHost::Load(const WorkerAssignment& a) {
  if (runner_ != nullptr) {
    return absl::FailedPreconditionError("the shard is loaded already");
  }
  ASSIGN_OR_RETURN(comms_, connect_(a));
  assignment_ = a;
  SetCpuThreads(a.threads);
  ASSIGN_OR_RETURN(ShardPlan plan,
                   PlanShards(*source_, a.tp, a.pp, a.moe_sharding));
  const ShardSpec& spec = plan.at(a.pp_rank, a.tp_rank);
  ASSIGN_OR_RETURN(
      LlamaWeights weights,
      LoadLlamaWeights(*source_, spec,
                       LogLoadProgress(absl::StrCat("worker (pp ", a.pp_rank,
                                                    ", tp ", a.tp_rank, ")"))));
  ASSIGN_OR_RETURN(KvPoolConfig kv,
                   PoolConfigForShard(weights.config, spec, a.kv.block_size,
                                      a.kv.DTypeOnCpu(), a.kv.kv_cache_bytes,
                                      a.kv.cpu_offload_bytes));
  ASSIGN_OR_RETURN(std::unique_ptr<KvPool> pool, KvPool::Create(kv));
  ShardComms comms{.tp = a.tp > 1 ? comms_.tp.get() : nullptr,
                   .pp = a.pp > 1 ? comms_.pp.get() : nullptr};
  runner_ =
      std::make_unique<ModelRunner>(std::move(weights), std::move(pool), comms);
  // Steps may run on another thread than this one (OpenMP is per thread).
  runner_->set_cpu_threads(a.threads);
  loaded_ = true;
  return kv;
}

absl::StatusOr<StepOutput> CommShardHost::Step(const StepInput& step) {
  if (runner_ == nullptr) {
    return absl::FailedPreconditionError("step before the shard was loaded");
  }
  ASSIGN_OR_RETURN(Tensor logits, runner_->Forward(step));
  if (assignment_.pp_rank != assignment_.pp - 1 || assignment_.tp_rank != 0) {
    return StepOutput{};
  }
  return SampleStep(step, std::move(logits));
}

}  // namespace shardlm
