#include "worker/shard_host.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/batch_invariance.h"
#include "kernels/precision.h"
#include "kernels/threading.h"
#include "model/shard_plan.h"
#include "worker/shard.h"

namespace shardlm {

absl::StatusOr<std::unique_ptr<CommShardHost>> MpiShardHost(
    const WeightSource* source, MpiCommunicator& workers, int tp, int pp,
    int cp) {
  if (workers.size() != tp * pp * cp) {
    return absl::InvalidArgumentError(
        absl::StrCat(workers.size(), " workers for tp ", tp, " x pp ", pp,
                     cp > 1 ? absl::StrCat(" x cp ", cp) : ""));
  }
  const RankPlace me = PlaceOfRank(workers.rank(), tp, cp);
  const int tp_rank = me.tp_rank, pp_rank = me.pp_rank, cp_rank = me.cp_rank;
  // Every worker takes part in every split, in the same order
  // (ShardGroups: TP group, CP group, PP chain).
  auto split = std::make_shared<ShardCommunicators>();
  for (const ShardGroup& g : ShardGroups(me, tp, cp, pp)) {
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> c,
                     workers.Split(g.color, g.rank, g.name));
    switch (g.kind) {
      case GroupKind::kTp:
        split->tp = std::move(c);
        break;
      case GroupKind::kCp:
        split->cp = std::move(c);
        break;
      case GroupKind::kPp:
        split->pp = std::move(c);
        break;
    }
  }
  auto connect =
      [=](const WorkerAssignment& a) -> absl::StatusOr<ShardCommunicators> {
    if (a.tp != tp || a.pp != pp || a.cp != cp || a.tp_rank != tp_rank ||
        a.pp_rank != pp_rank || a.cp_rank != cp_rank) {
      return absl::FailedPreconditionError(absl::StrCat(
          "assigned tp ", a.tp_rank, "/", a.tp, " pp ", a.pp_rank, "/", a.pp,
          " cp ", a.cp_rank, "/", a.cp, " but this MPI rank is tp ", tp_rank,
          "/", tp, " pp ", pp_rank, "/", pp, " cp ", cp_rank, "/", cp));
    }
    if (split->tp == nullptr) {
      return absl::FailedPreconditionError("assigned twice");
    }
    return std::move(*split);
  };
  return std::make_unique<CommShardHost>(source, std::move(connect));
}

absl::StatusOr<KvPoolConfig> CommShardHost::Load(const WorkerAssignment& a) {
  if (shard_ != nullptr) {
    return absl::FailedPreconditionError("the shard is loaded already");
  }
  ASSIGN_OR_RETURN(comms_, connect_(a));
  SetCpuThreads(a.threads);
  SetBatchInvariant(a.batch_invariant);
  SetPrecision(a.precision);
  ASSIGN_OR_RETURN(ShardPlan plan, PlanShards(*source_, a.tp, a.pp,
                                              a.moe_sharding, a.pp_balance));
  const ShardSpec mine = plan.ForRank(
      {.tp_rank = a.tp_rank, .cp_rank = a.cp_rank, .pp_rank = a.pp_rank}, a.cp);
  ASSIGN_OR_RETURN(
      std::unique_ptr<Shard> shard,
      LoadCpuShard(
          *source_,
          {.spec = mine,
           .kv = a.kv,
           .limits = a.limits,
           .threads = a.threads,
           .name = absl::StrCat(
               "worker (pp ", a.pp_rank, ", tp ", a.tp_rank,
               a.cp > 1 ? absl::StrCat(", cp ", a.cp_rank, " of ", a.cp) : "",
               ")")}));
  // Each worker allocates what its own budget holds; the coordinator uses
  // the fewest any worker reports (ControlService), so a block id means
  // the same slot on every worker.
  ASSIGN_OR_RETURN(const KvBlockCounts blocks, shard->BlocksAvailable());
  RETURN_IF_ERROR(shard->InitializeCache(
      blocks, {.tp = a.tp > 1 ? comms_.tp.get() : nullptr,
               .pp = a.pp > 1 ? comms_.pp.get() : nullptr,
               .cp = a.cp > 1 ? comms_.cp.get() : nullptr}));
  shard_ = std::move(shard);
  loaded_ = true;
  const ModelConfig& c = shard_->config();
  const ShardSpec& spec = shard_->spec();
  KvPoolConfig kv = PoolShapeForShard(c, spec);
  kv.block_size = a.kv.block_size;
  kv.num_blocks = blocks.device;
  kv.num_host_blocks = blocks.host;
  kv.dtype = shard_->kv_dtype();
  return kv;
}

absl::StatusOr<StepOutput> CommShardHost::Step(const StepInput& step) {
  if (shard_ == nullptr) {
    return absl::FailedPreconditionError("step before the shard was loaded");
  }
  return shard_->Step(step);
}

}  // namespace shardlm
