#include "launch/mpi_shard_host.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/threading.h"
#include "model/shard_plan.h"
#include "worker/kv_pool.h"
#include "worker/llama_weights.h"

namespace shardlm {

absl::StatusOr<std::unique_ptr<MpiShardHost>> MpiShardHost::Create(
    const WeightSource* source, MpiCommunicator& workers, int tp, int pp) {
  if (workers.size() != tp * pp) {
    return absl::InvalidArgumentError(
        absl::StrCat(workers.size(), " workers for tp ", tp, " x pp ", pp));
  }
  const int tp_rank = workers.rank() % tp, pp_rank = workers.rank() / tp;
  std::unique_ptr<MpiShardHost> host(
      new MpiShardHost(source, tp, pp, tp_rank, pp_rank));
  // Every worker takes part in both splits, in the same order.
  ASSIGN_OR_RETURN(host->tp_comm_,
                   workers.Split(pp_rank, tp_rank,
                                 absl::StrCat("tp group of stage ", pp_rank)));
  ASSIGN_OR_RETURN(host->pp_comm_,
                   workers.Split(tp_rank, pp_rank,
                                 absl::StrCat("pp chain of tp ", tp_rank)));
  return host;
}

absl::StatusOr<KvPoolConfig> MpiShardHost::Load(const WorkerAssignment& a) {
  if (a.tp != tp_ || a.pp != pp_ || a.tp_rank != tp_rank_ ||
      a.pp_rank != pp_rank_) {
    return absl::FailedPreconditionError(
        absl::StrCat("assigned tp ", a.tp_rank, "/", a.tp, " pp ", a.pp_rank,
                     "/", a.pp, " but this MPI rank is tp ", tp_rank_, "/", tp_,
                     " pp ", pp_rank_, "/", pp_));
  }
  SetCpuThreads(a.threads);
  ASSIGN_OR_RETURN(ShardPlan plan, PlanShards(*source_, tp_, pp_));
  const ShardSpec& spec = plan.at(pp_rank_, tp_rank_);
  ASSIGN_OR_RETURN(
      LlamaWeights weights,
      LoadLlamaWeights(*source_, spec,
                       LogLoadProgress(absl::StrCat("worker (pp ", pp_rank_,
                                                    ", tp ", tp_rank_, ")"))));
  ASSIGN_OR_RETURN(
      KvPoolConfig kv,
      PoolConfigForShard(weights.config, spec, a.block_size, a.kv_cache_dtype,
                         a.kv_cache_bytes, a.cpu_offload_bytes));
  ASSIGN_OR_RETURN(std::unique_ptr<KvPool> pool, KvPool::Create(kv));
  ShardComms comms{.tp = tp_ > 1 ? tp_comm_.get() : nullptr,
                   .pp = pp_ > 1 ? pp_comm_.get() : nullptr};
  runner_ =
      std::make_unique<ModelRunner>(std::move(weights), std::move(pool), comms);
  // Steps may run on another thread than this one (OpenMP is per thread).
  runner_->set_cpu_threads(a.threads);
  return kv;
}

absl::StatusOr<StepOutput> MpiShardHost::Step(const StepInput& step) {
  if (runner_ == nullptr) {
    return absl::FailedPreconditionError("step before the shard was loaded");
  }
  ASSIGN_OR_RETURN(Tensor logits, runner_->Forward(step));
  if (pp_rank_ != pp_ - 1 || tp_rank_ != 0) return StepOutput{};
  return SampleStep(step, std::move(logits));
}

}  // namespace shardlm
