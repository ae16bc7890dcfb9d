// The replicas behind a router (DESIGN.md section 1): one gRPC channel
// each, and one watcher thread each that checks the replica's model
// (GetModelInfo) and then follows its shardlm.v1.ReplicaState stream into
// this set's view of it (load, readiness, cached prefix keys).
//
// A replica takes new requests only while its stream is up, its last
// update said ready, and that update is younger than stale_after (the
// replica sends heartbeats every 250 ms): a killed replica drops out when
// its stream breaks, a hung one within stale_after.
//
// Thread-safe.
#ifndef SHARDLM_ROUTER_REPLICA_SET_H_
#define SHARDLM_ROUTER_REPLICA_SET_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "router/routing_policy.h"
#include "shardlm/v1/inference.grpc.pb.h"

namespace shardlm {

struct ReplicaSetOptions {
  std::vector<std::string> addresses;  // host:port, at least one.
  // Sent as "authorization: Bearer <key>" on the set's own calls
  // (GetModelInfo, WatchState); empty: none.
  std::string api_key;
  // A replica whose last update is older than this takes no new requests.
  absl::Duration stale_after = absl::Seconds(1);
  // Each GetModelInfo call (startup and every reconnection).
  absl::Duration call_timeout = absl::Seconds(2);
  // Between reconnection attempts to a replica that is down.
  absl::Duration retry_every = absl::Milliseconds(200);
  // The channels' credentials (TLS to the replicas); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

// Figures for /metrics, per replica.
struct ReplicaCounters {
  std::atomic<int64_t> requests{0};              // Generate calls sent to it.
  std::atomic<int64_t> predicted_hit_blocks{0};  // kv's prediction, summed.
  std::atomic<int64_t> failures{0};  // Calls that ended UNAVAILABLE.
};

class ReplicaSet {
 public:
  // Asks every replica for its model (each within call_timeout) and
  // starts the watchers. InvalidArgument naming both replicas and both
  // models when two answering replicas serve different models. Replicas
  // that do not answer are watched all the same; the first model seen
  // (here or later) is the one every replica must serve: a replica serving
  // another is refused (never routed to), and the log names both models.
  static absl::StatusOr<std::unique_ptr<ReplicaSet>> Start(
      ReplicaSetOptions options);
  ~ReplicaSet();  // Stops the watchers.
  ReplicaSet(const ReplicaSet&) = delete;
  ReplicaSet& operator=(const ReplicaSet&) = delete;

  // Replicas known (removed ones included: indices never change).
  int size() const { return count_.load(std::memory_order_acquire); }
  const std::string& address(int i) const { return replicas_[i]->address; }
  v1::Inference::Stub& stub(int i) { return *replicas_[i]->stub; }
  ReplicaCounters& counters(int i) { return replicas_[i]->counters; }
  // The model every replica must serve; empty until one answered.
  std::string model() const;
  // Its context length (as that replica reported it); 0 until one answered.
  int64_t context_length() const;
  // How its chat template writes tool calls (ModelInfo.tool_call_format,
  // from the same replica); empty until one answered or when it renders
  // none.
  std::string tool_call_format() const;
  // How it writes its reasoning (ModelInfo.reasoning_format).
  std::string reasoning_format() const;

  // Chooses a replica with `policy` for a request whose prompt is
  // `prompt` (empty: unknown; kv then ranks by load alone), never
  // `exclude` (-1: none). -1 when none is ready.
  RouteDecision Route(RoutingPolicy& policy, absl::Span<const int32_t> prompt,
                      int exclude = -1);
  // Makes `addresses` the replicas (a re-read --replicas-file): new ones
  // are added and watched (their model checked as they connect), missing
  // ones removed (no new requests; calls in flight run on), and a removed
  // one that comes back is watched again. InvalidArgument, changing
  // nothing, past kMaxReplicas addresses ever known.
  absl::Status SetAddresses(const std::vector<std::string>& addresses);
  static constexpr int kMaxReplicas = 1024;

  // Time since replica i's last state update (infinite before the first).
  absl::Duration SilentFor(int i) const;
  // Whether replica i was taken out of the list (it is no longer watched,
  // so its silence says nothing).
  bool Removed(int i) const;
  // Replicas that take new requests now.
  int ready_count() const;
  // Why each replica is not ready ("a:1 (connecting: ...)"), for errors.
  std::string Describe() const;

 private:
  struct Replica {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Inference::Stub> stub;
    ReplicaCounters counters;
    std::thread watcher;
    // Guarded by ReplicaSet::mu_.
    bool up = false;     // Its state stream is open.
    bool ready = false;  // Its last update said ready.
    absl::Time last_update = absl::InfinitePast();
    int64_t running = 0, waiting = 0;
    double kv_use = 0;
    int32_t block_size = 0;
    PrefixIndex index;
    std::string problem;                   // Why it is not up (for Describe).
    grpc::ClientContext* watch = nullptr;  // The open stream's context.
    bool removed = false;                  // No longer in the replica list.
    bool watching = false;                 // Its watcher thread runs.
  };

  explicit ReplicaSet(ReplicaSetOptions options);
  // A replica for `address`, not yet watched.
  Replica* Add(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts r's watcher (joining one that ended).
  void StartWatching(Replica* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Watch(Replica* r);
  // GetModelInfo on `r`: the model's name, or why not. Notes its context
  // length when it serves the set's model (or none is set yet).
  absl::StatusOr<std::string> ModelOf(Replica& r);

  bool Usable(const Replica& r, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ReplicaSetOptions options_;
  // Reserved for kMaxReplicas and only appended to (under mu_), so that an
  // element, once counted in count_, stays put for lock-free readers.
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::atomic<int> count_{0};
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string model_ ABSL_GUARDED_BY(mu_);
  int64_t context_length_ ABSL_GUARDED_BY(mu_) = 0;
  std::string tool_call_format_ ABSL_GUARDED_BY(mu_);
  std::string reasoning_format_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardlm

#endif  // SHARDLM_ROUTER_REPLICA_SET_H_
