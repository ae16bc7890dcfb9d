// The worker's side of the control plane (DESIGN.md section 1): one gRPC
// stream to the coordinator. Register -> Assignment -> load the shard ->
// Ready{kv_blocks, host_kv_blocks} -> StepPlans in, StepResults out, heartbeats
// both ways
// -> Shutdown. How the shard runs (MPI or NCCL communicators, or fakes in
// tests) is behind ShardHost.
#ifndef SHARDLM_WORKER_WORKER_AGENT_H_
#define SHARDLM_WORKER_WORKER_AGENT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "kernels/precision.h"
#include "step/batch_limits.h"
#include "step/control_channel.h"
#include "step/kv_cache.h"
#include "worker/model_runner.h"

namespace shardlm {

struct WorkerAssignment {
  // The KV cache (its dtype set) and the step limits: GPU workers reserve
  // activations for steps of limits.max_batched_tokens tokens and
  // limits.max_seqs sequences, then KV blocks take gpu_memory_utilization
  // of the GPU (when kv_cache_bytes is 0).
  KvCacheOptions kv;
  BatchLimits limits;
  int tp = 1, pp = 1, tp_rank = 0, pp_rank = 0;
  // Context parallel: the stage's ranks form TP x CP (worker rank - 1 =
  // (pp_rank * cp + cp_rank) * tp + tp_rank); this rank holds the KV
  // blocks whose id is cp_rank mod cp.
  int cp = 1, cp_rank = 0;
  int threads = 1;
  // The prefix of this cluster's rendezvous keys (Gloo addresses, NCCL ids).
  std::string rendezvous_prefix;
  // The coordinator's step timeout; zero: none given.
  absl::Duration step_timeout;
  MoeSharding moe_sharding = MoeSharding::kAuto;  // Mixtures of experts.
  PpBalance pp_balance = PpBalance::kDecode;      // PP's stage boundaries.
  // Batch-invariant kernels in this process (SetBatchInvariant).
  bool batch_invariant = false;
  // The precision of this process's CPU matrix products (SetPrecision).
  Precision precision = Precision::kExact;
};

// One shard of the model on this worker. Called from the agent's thread
// only (the thread that called RunWorkerAgent).
class ShardHost {
 public:
  virtual ~ShardHost() = default;
  // Loads the assigned shard and allocates its KV pool; returns the pool's
  // configuration (the blocks of each tier it holds).
  virtual absl::StatusOr<KvPoolConfig> Load(const WorkerAssignment& a) = 0;
  // ModelRunner::Forward, then (last stage, TP rank 0 only) SampleStep.
  virtual absl::StatusOr<StepOutput> Step(const StepInput& step) = 0;
  // After Load: the bytes of the shard's weights in memory (0: unknown).
  virtual int64_t weight_bytes() const { return 0; }
  // Step figures so far (none before Load); for heartbeats.
  virtual std::optional<RunnerStats> stats() const { return std::nullopt; }
  // Whether Load succeeded (any thread: readiness probes ask).
  virtual bool loaded() const { return false; }
};

struct WorkerAgentOptions {
  std::string coordinator;  // host:port
  int rank = 0;             // 1 .. tp * pp * cp.
  std::string model_path;   // Reported at registration, with:
  uint64_t model_bytes = 0;
  std::string model_digest;  // ModelDigest(): files must match across nodes.
  std::string
      cluster_token;  // The coordinator's ClusterOptions::cluster_token.
  // Where this worker runs its shard ("cpu" or "cuda") and, on CUDA, its
  // GPU, reported at registration (the coordinator refuses another kind
  // than the cluster's, and two workers on one GPU).
  std::string device = "cpu";
  std::string gpu_uuid;
  int gpu_ordinal = 0;
  // Sent after this long without another message to the coordinator (also
  // while loading or stepping: the coordinator takes silence for death).
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // No message from the coordinator for this long: it is gone.
  absl::Duration coordinator_timeout = absl::Seconds(30);
  // Connection attempts are retried for this long.
  absl::Duration connect_timeout = absl::Seconds(60);
  // When the stream ends (Shutdown, cancelled, the coordinator silent)
  // while a step runs and that step has not returned abandon_grace later,
  // on_abandon is called once with the reason, from the agent's watchdog
  // thread (a step cannot be interrupted: it may wait in a collective for
  // a peer that is gone). It should end the process; null: the agent
  // waits for the step (whose collectives have their own timeouts).
  std::function<void(const std::string& reason)> on_abandon;
  absl::Duration abandon_grace = absl::Seconds(2);
  // When notified, the agent drops its stream and returns Cancelled (e.g.
  // on SIGTERM; tests use it to kill a worker). May be null.
  const absl::Notification* stop = nullptr;
  // Mutual TLS to the coordinator (its control plane must have it too);
  // empty: plaintext.
  ControlTls tls;
};

// Serves one worker's stream until the coordinator sends Shutdown (OK;
// Unavailable with its reason when the cluster failed; Aborted when it
// re-forms and the worker should drop its shard and register again).
// Errors: the coordinator unreachable, rejecting the registration (its
// status), silent for coordinator_timeout, or the stream breaking (each
// naming the coordinator's address); a Load failure (reported to the
// coordinator as Failure, then returned). A failed step is reported in its
// StepResult and the agent keeps serving.
absl::Status RunWorkerAgent(const WorkerAgentOptions& options, ShardHost& host);

// A cheap fingerprint of the model at `model_path` (a file, or a directory
// whose *.safetensors and config.json count): sizes, names and a 64-bit
// FNV-1a hash over the first and last MiB of each file. Sets *bytes to the
// total size. NotFound naming the path when it is missing.
absl::StatusOr<std::string> ModelDigest(const std::string& model_path,
                                        uint64_t* bytes);

}  // namespace shardlm

#endif  // SHARDLM_WORKER_WORKER_AGENT_H_
