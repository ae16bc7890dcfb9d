// A worker's shard over communicators between processes: its TP group and
// PP chain, and its Shard (worker/shard.h) on the CPU. The
// communicators come from MPI (shardlm launch under mpirun) or Gloo
// (shardlm worker, rendezvous through the coordinator).
#ifndef SHARDLM_WORKER_SHARD_HOST_H_
#define SHARDLM_WORKER_SHARD_HOST_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "collectives/mpi_communicator.h"
#include "model/weight_source.h"
#include "worker/shard.h"
#include "worker/worker_agent.h"

namespace shardlm {

// The groups one shard talks in.
struct ShardCommunicators {
  std::unique_ptr<Communicator> tp;  // This stage's (and CP rank's) TP group.
  std::unique_ptr<Communicator> pp;  // The PP chain of this TP (and CP) index.
  // This stage's CP group of this TP index (context parallel; null at cp 1).
  std::unique_ptr<Communicator> cp;
};

// Makes a shard's communicators for its assignment. Every worker calls it
// when its assignment arrives; it may wait for the others (a rendezvous).
using ConnectShard =
    std::function<absl::StatusOr<ShardCommunicators>(const WorkerAssignment&)>;

class CommShardHost : public ShardHost {
 public:
  // `source` must outlive the host.
  CommShardHost(const WeightSource* source, ConnectShard connect)
      : source_(source), connect_(std::move(connect)) {}

  // Connects the communicators, loads the assigned shard and allocates its
  // KV pool.
  absl::StatusOr<KvPoolConfig> Load(const WorkerAssignment& a) override;
  // Runs the step; the last stage's TP rank 0 samples.
  absl::StatusOr<StepOutput> Step(const StepInput& step) override;
  // None before Load.
  std::optional<RunnerStats> stats() const override {
    if (!loaded_) return std::nullopt;
    return shard_->stats();
  }
  int64_t weight_bytes() const override {
    return loaded_ ? shard_->weight_bytes() : 0;
  }
  bool loaded() const override { return loaded_.load(); }

 private:
  const WeightSource* source_;
  ConnectShard connect_;
  ShardCommunicators comms_;  // Outlive the shard.
  std::unique_ptr<Shard> shard_;
  std::atomic<bool> loaded_{false};
};

// Under mpirun: splits `workers` (every worker rank, in rank order; a
// collective call on all of them) into this rank's TP group, CP group
// (cp > 1) and PP chain for a tp x cp x pp layout now (worker index
// (pp_rank * cp + cp_rank) * tp + tp_rank, PlaceOfRank); Load checks that
// the assignment is the one this rank's position implies.
absl::StatusOr<std::unique_ptr<CommShardHost>> MpiShardHost(
    const WeightSource* source, MpiCommunicator& workers, int tp, int pp,
    int cp = 1);

}  // namespace shardlm

#endif  // SHARDLM_WORKER_SHARD_HOST_H_
