// A worker's shard under mpirun: MPI communicators for its TP group and PP
// chain, its slice of the weights, its KV pool, and a ModelRunner.
#ifndef SHARDLM_LAUNCH_MPI_SHARD_HOST_H_
#define SHARDLM_LAUNCH_MPI_SHARD_HOST_H_

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "collectives/mpi_communicator.h"
#include "model/weight_source.h"
#include "worker/model_runner.h"
#include "worker/worker_agent.h"

namespace shardlm {

class MpiShardHost : public ShardHost {
 public:
  // Splits `workers` (every worker rank, in rank order; a collective call
  // on all of them) into this rank's TP group and PP chain for a tp x pp
  // layout. `source` must outlive the host.
  static absl::StatusOr<std::unique_ptr<MpiShardHost>> Create(
      const WeightSource* source, MpiCommunicator& workers, int tp, int pp);

  // Loads the shard the coordinator assigned (it must be the one this
  // rank's position implies) and allocates its KV pool.
  absl::StatusOr<KvPoolConfig> Load(const WorkerAssignment& a) override;
  // Runs the step; the last stage's TP rank 0 samples.
  absl::StatusOr<StepOutput> Step(const StepInput& step) override;
  // None before Load.
  std::optional<RunnerStats> stats() const override {
    if (!runner_) return std::nullopt;
    return runner_->stats();
  }
  int64_t weight_bytes() const override {
    return runner_ ? runner_->weight_bytes() : 0;
  }

 private:
  MpiShardHost(const WeightSource* source, int tp, int pp, int tp_rank,
               int pp_rank)
      : source_(source),
        tp_(tp),
        pp_(pp),
        tp_rank_(tp_rank),
        pp_rank_(pp_rank) {}

  const WeightSource* source_;
  int tp_, pp_, tp_rank_, pp_rank_;
  std::unique_ptr<MpiCommunicator> tp_comm_, pp_comm_;
  std::unique_ptr<ModelRunner> runner_;
};

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_MPI_SHARD_HOST_H_
