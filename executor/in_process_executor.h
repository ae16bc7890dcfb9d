// StepExecutors that run in this process: a single shard, or a TP x PP
// cluster of shards on threads joined by in-process communicators.
#ifndef SHARDLM_EXECUTOR_IN_PROCESS_EXECUTOR_H_
#define SHARDLM_EXECUTOR_IN_PROCESS_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "engine/step_executor.h"
#include "model/shard_plan.h"
#include "model/weight_source.h"
#include "step/kv_cache.h"
#include "worker/shard.h"

namespace shardlm {

struct ExecutorOptions {
  KvCacheOptions kv;  // Its dtype unset: the CPU default.
  // max_seqs sizes hybrid models' state slots on every rank.
  BatchLimits limits;
  int tp = 1;
  int pp = 1;
  // Context parallel: each stage's ranks form TP x CP, the CP ranks
  // holding the same weights and each 1/cp of the KV blocks (block id g on
  // CP rank g % cp): the block count is cp times one rank's, in each tier
  // (a host block stays on its rank: BlockManager::set_interleave).
  int cp = 1;
  MoeSharding moe_sharding = MoeSharding::kAuto;  // Mixtures of experts.
  PpBalance pp_balance = PpBalance::kDecode;      // PP's stage boundaries.
  // CPU threads each rank's kernels use (on whichever thread calls
  // Forward); 0 leaves the caller's OpenMP setting (one rank) or uses 1
  // (ranks on threads).
  int threads_per_rank = 0;
};

// One shard in this process when tp * pp * cp == 1; otherwise tp * pp *
// cp shards on threads, exchanging activations through in-process
// communicators, each loading only its part of the weights.
absl::StatusOr<std::unique_ptr<StepExecutor>> CreateInProcessExecutor(
    const WeightSource& source, const ExecutorOptions& options);

// The communicators of a TP x CP x PP cluster on threads of this process:
// a fake group per TP group, per CP group (the CP ranks of one stage and
// TP index) and per PP chain (one per CP and TP index), each passed
// through `wrap` when it is set (e.g. to stage device tensors through the
// host).
struct InProcessComms {
  std::vector<std::unique_ptr<Communicator>> owned;
  // Rank r = (pp_rank * cp + cp_rank) * tp + tp_rank.
  std::vector<ShardComms> per_rank;
};
InProcessComms MakeInProcessComms(
    int tp, int pp,
    const std::function<std::unique_ptr<Communicator>(
        std::unique_ptr<Communicator>)>& wrap = nullptr,
    int cp = 1);

// One rank's member of one group, as MakeGroupComms asks a factory for it.
struct GroupMember {
  std::string group;  // "tp group of stage P" or "pp chain of tp T".
  int rank = 0;       // Within the group.
  int size = 1;
  int cluster_rank = 0;  // pp_rank * tp + tp_rank.
};
using MakeGroupMember =
    std::function<absl::StatusOr<std::unique_ptr<Communicator>>(
        const GroupMember&)>;

// The communicators of a TP x PP cluster on threads of this process, made
// one member at a time by `make` (NCCL: each member joins its group with
// ncclCommInitRank, which returns only when the whole group has arrived).
// Each rank's members are made on a thread of its own, in the order every
// rank uses (its TP group, then its PP chain), all ranks at once. Once
// every thread is done, the first error that is not a peer's deadline (the
// cause, not its echo), naming its group and rank, is returned.
absl::StatusOr<InProcessComms> MakeGroupComms(int tp, int pp,
                                              const MakeGroupMember& make);

// tp * pp * cp shards (their caches set up, one block count for all) on
// threads of their own, each running every step; the sampling shard's
// tokens are the step's. `comms` outlive the shards.
std::unique_ptr<StepExecutor> NewThreadedExecutor(
    std::vector<std::unique_ptr<Communicator>> comms,
    std::vector<std::unique_ptr<Shard>> shards, int threads_per_rank);

}  // namespace shardlm

#endif  // SHARDLM_EXECUTOR_IN_PROCESS_EXECUTOR_H_
