// The coordinator's side of the control plane (DESIGN.md section 1): the
// gRPC service every worker rank opens one bidirectional stream to.
//
// Per stream: Register -> Assignment -> (the worker loads its shard) Ready
// or Failure -> StepPlans in, StepResults out, heartbeats both ways ->
// Shutdown. A stream that ends or breaks, or a worker silent for
// `worker_timeout`, makes that rank DEAD for good; the reason names it
// ("worker rank 3 (pp 1, tp 0) at host:pid: stream closed"; with CP
// ranks, "(pp 1, tp 0, cp 1)"). Recovery is
// not supported: a cluster with a dead rank stays unavailable.
#ifndef SHARDLM_CLUSTER_CONTROL_SERVICE_H_
#define SHARDLM_CLUSTER_CONTROL_SERVICE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/step_executor.h"
#include "grpcpp/server_builder.h"
#include "kernels/precision.h"
#include "model/shard_plan.h"
#include "shardlm/v1/control.grpc.pb.h"
#include "step/batch_limits.h"
#include "step/control_channel.h"
#include "step/kv_cache.h"

namespace shardlm {

struct ClusterOptions {
  // Every worker's KV cache (its dtype resolved: set) and the step limits
  // CUDA workers reserve activations for before sizing their KV pool.
  KvCacheOptions kv;
  BatchLimits limits;
  int tp = 1;
  int pp = 1;
  // Context parallel (CPU workers): each stage's ranks form TP x CP, worker
  // rank r at index r - 1 = (pp_rank * cp + cp_rank) * tp + tp_rank; CP
  // rank c holds the KV block ids g with g % cp == c.
  int cp = 1;
  // How the TP group splits a mixture of experts (sent to every worker).
  MoeSharding moe_sharding = MoeSharding::kAuto;
  // What PP's stage boundaries balance (sent to every worker).
  PpBalance pp_balance = PpBalance::kDecode;
  // Batch-invariant kernels on every worker (sent to every worker).
  bool batch_invariant = false;
  // The precision of the workers' CPU matrix products (sent to every
  // worker).
  Precision precision = Precision::kExact;
  // Workers must register with this token (compared in constant time);
  // others are refused with UNAUTHENTICATED and do not disturb startup.
  // Empty accepts any worker: tests only.
  std::string cluster_token;
  int threads_per_worker = 1;
  // The prefix of the data plane's rendezvous keys (Gloo addresses, NCCL
  // ids; Assignment.rendezvous_prefix).
  std::string rendezvous_prefix = "cluster";
  // Where every worker must run its shard: "cpu" or "cuda"
  // (Register.device); a worker of the other kind is refused.
  std::string device = "cpu";
  // CUDA: two workers on one GPU (the same Register.gpu_uuid) are refused
  // naming both, unless this is set (tests: NCCL itself refuses two ranks
  // of one communicator on one GPU).
  bool allow_shared_gpu = false;
  // Sent to a worker after this long without another message to it.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // No message from a worker for this long: it is dead. Workers heartbeat
  // also while loading and stepping, so this does not bound a step's time.
  absl::Duration worker_timeout = absl::Seconds(5);
  // Default wait for every rank to register and load (WaitUntilReady).
  absl::Duration register_timeout = absl::Seconds(120);
  // A step without every rank's result after this long: the ranks still
  // missing are dead (hung).
  absl::Duration step_timeout = absl::Seconds(300);
  // A rank lost after startup: false, the watchdog stops the survivors
  // (the cluster has failed for good); true, they stay until Reform().
  bool rejoin = false;
};

// Thread-safe. One Connect handler thread per worker stream stays in the
// handler for the stream's life (gRPC sync server); writes to a stream are
// serialized by a per-worker mutex. The grpc::Server must be shut down
// (Shutdown + Wait) before the service is destroyed.
//
// Every call must carry the cluster token in its metadata
// (kClusterTokenMetadata), checked when the call arrives and before any of
// its messages is read: gRPC's message limit is per server and is enforced
// only once a whole message is buffered, so a stranger's first message
// must never be read at all. StoreSet and StoreGet are "streamed unary"
// handlers for that reason (a plain unary handler runs only after gRPC has
// read its request).
class ControlService final : public v1::Control::StreamedUnaryService {
 public:
  explicit ControlService(ClusterOptions options);
  ~ControlService() override;

  const ClusterOptions& options() const { return options_; }
  int num_workers() const { return options_.tp * options_.pp * options_.cp; }

  grpc::Status Connect(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>*
          stream) override;

  // The rendezvous store of the data plane (see control.proto); bounded:
  // keys of at most 512 bytes, values of at most 64 KiB, 4096 keys.
  grpc::Status StreamedStoreSet(
      grpc::ServerContext* context,
      grpc::ServerUnaryStreamer<v1::StoreSetRequest, v1::StoreSetResponse>*
          stream) override;
  grpc::Status StreamedStoreGet(
      grpc::ServerContext* context,
      grpc::ServerUnaryStreamer<v1::StoreGetRequest, v1::StoreGetResponse>*
          stream) override;

  // Waits until every rank has reported Ready. Errors: the first startup
  // failure (model files differing between workers, naming both ranks; a
  // rejected rank; a worker's Failure with its message and code; a worker
  // lost before it was ready), or DeadlineExceeded naming the ranks that
  // never registered or are still loading.
  absl::Status WaitUntilReady(absl::Duration timeout);

  // The smallest KV block count over the workers' Ready (0 before).
  int64_t min_kv_blocks() const;
  int64_t min_host_kv_blocks() const;

  // Sends `plan` to every worker and waits for every worker's result of
  // plan.step_id. Returns the results indexed by rank - 1. Unavailable
  // naming the rank when one is (or becomes) dead, or misses step_timeout;
  // a worker's own error (StepResult.error) with its code, naming it.
  // SendStep then WaitStep.
  absl::StatusOr<std::vector<v1::StepResult>> RunStep(const v1::StepPlan& plan);
  // Steps in flight: SendStep sends `plan` to every worker and returns;
  // WaitStep(plan.step_id) waits for that step's results (with the same
  // errors as RunStep; its step timeout counts from the send or from the
  // wait, whichever is later: a step in flight queues behind the ones
  // sent before it). Every sent
  // step must be waited for once, in any order; from one thread.
  absl::Status SendStep(const v1::StepPlan& plan);
  absl::StatusOr<std::vector<v1::StepResult>> WaitStep(uint64_t step_id);

  // OK when every rank is ready and alive; Unavailable naming the first
  // dead (or still missing) rank otherwise, or after Shutdown.
  absl::Status Health() const;

  // Every rank's figures (its latest heartbeat, its Ready), rank order.
  std::vector<RankReport> Reports() const;

  // After a rank was lost (with ClusterOptions::rejoin): tells every
  // connected worker to leave and register again (Shutdown{rejoin}), waits
  // for their streams to end, and empties every slot, so that the ranks
  // (survivors and replacements) register, load and meet under the new
  // `rendezvous_prefix`; WaitUntilReady then waits for them again.
  // Registrations that arrive meanwhile wait for it to finish.
  absl::Status Reform(const std::string& rendezvous_prefix);

  // Sends Shutdown{reason} to every connected worker; they close their
  // streams (with an error when `cluster_failed`, or when a rank was lost
  // after startup). Idempotent; later streams are rejected.
  void Shutdown(const std::string& reason, bool cluster_failed = false);

 private:
  struct Worker;
  enum class State { kEmpty, kLoading, kReady, kDead, kDone };

  // Whether the call's metadata carries the cluster token (exactly once;
  // compared in constant time). Any call when the token is empty.
  bool Authorized(const grpc::ServerContext& context) const;
  // The store's work, once the token was checked and the request read.
  grpc::Status SetInStore(const v1::StoreSetRequest& request);
  grpc::Status GetFromStore(grpc::ServerContext* context,
                            const v1::StoreGetRequest& request,
                            v1::StoreGetResponse* response);
  // Sends `msg` on w's stream if it is still open. False when it is closed
  // or the write fails.
  bool Write(Worker& w, const v1::CoordinatorMessage& msg);
  // Validates a Register and claims its slot; an error rejects the stream.
  absl::StatusOr<Worker*> Claim(grpc::ServerContext* context,
                                const v1::Register& reg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkDead(Worker& w, const std::string& reason,
                absl::StatusCode code = absl::StatusCode::kUnavailable)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartupFailed(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Watchdog();

  // A worker stream's life (Connect): its Register checked and its slot
  // claimed (waiting while the cluster re-forms), its assignment sent, each
  // later message taken in, and its end.
  struct Joined {
    Worker* worker = nullptr;
    uint64_t generation = 0;  // The slot's, when claimed.
    std::string rendezvous_prefix;
  };
  absl::StatusOr<Joined> Join(grpc::ServerContext* context,
                              const v1::WorkerMessage& in);
  void Assign(Worker& w, const std::string& rendezvous_prefix);
  void Receive(Worker& w, v1::WorkerMessage& in)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  grpc::Status Ended(Worker& w, uint64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClusterOptions options_;
  std::vector<std::unique_ptr<Worker>> workers_;  // Index rank - 1; fixed.

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // Signalled on any state change or result.
  int first_rank_ ABSL_GUARDED_BY(mu_) = 0;  // Whose model others must match.
  absl::Status startup_error_ ABSL_GUARDED_BY(mu_);
  std::string first_dead_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_watchdog_ ABSL_GUARDED_BY(mu_) = false;
  bool reforming_ ABSL_GUARDED_BY(mu_) = false;
  // Steps sent and not yet waited for, with their deadlines.
  absl::flat_hash_map<uint64_t, absl::Time> step_deadlines_
      ABSL_GUARDED_BY(mu_);
  uint64_t claims_ ABSL_GUARDED_BY(mu_) = 0;  // Generations of slots.
  std::string rendezvous_prefix_ ABSL_GUARDED_BY(mu_);
  std::thread watchdog_;

  // The rendezvous store (StoreSet / StoreGet).
  absl::Mutex store_mu_;
  absl::CondVar store_cv_;
  absl::flat_hash_map<std::string, std::string> store_
      ABSL_GUARDED_BY(store_mu_);
};

// Registers `service` on `builder`, lifting gRPC's 4 MiB message limit
// (plans of long prompts and returned logits can be larger: only peers with
// the token get a message read), and caps what a peer gets before its token
// is checked: the server's threads (one per open stream) at a few more than
// the workers need, streams per connection at 8, request headers at 16 KiB.
// The listening port's credentials are ControlServerCredentials().
void AddControlService(grpc::ServerBuilder& builder, ControlService* service);

}  // namespace shardlm

#endif  // SHARDLM_CLUSTER_CONTROL_SERVICE_H_
