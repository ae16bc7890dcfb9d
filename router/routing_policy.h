// The router's routing policy (DESIGN.md section 1): replica states in, a
// replica index out. No threads, no sockets, no clock: `shardlm router`
// feeds it what the replicas' WatchState streams said, and a simulator can
// feed it simulated replicas.
//
// Policies:
//   kv          the replica holding the longest cached prefix of the
//               request, in full KV blocks keyed as the prefix cache keys
//               them (engine/prefix_hash.h), among the replicas whose
//               load is within a bound over the least loaded one; ties by
//               fewest running sequences, then fewest waiting, then KV use.
//   least-load  the replica with the fewest sequences (running + waiting);
//               ties as for kv.
//   round-robin the next ready replica in turn.
// A replica that is not ready is never chosen. Remaining ties rotate (the
// n-th decision prefers replica n mod N first), so idle replicas share
// work instead of replica 0 taking all.
#ifndef SHARDLM_ROUTER_ROUTING_POLICY_H_
#define SHARDLM_ROUTER_ROUTING_POLICY_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shardlm {

enum class RoutingPolicyKind { kKv, kLeastLoad, kRoundRobin };

// "kv", "least-load" or "round-robin"; InvalidArgument naming the choices.
absl::StatusOr<RoutingPolicyKind> ParseRoutingPolicy(absl::string_view name);
const char* RoutingPolicyName(RoutingPolicyKind kind);

// The prefix-cache keys one replica holds, as its state stream reported
// them (insertions and evictions, or a whole set on reset).
class PrefixIndex {
 public:
  void Reset(absl::Span<const uint64_t> keys);
  void Insert(uint64_t key) { keys_.insert(key); }
  void Evict(uint64_t key) { keys_.erase(key); }
  void Clear() { keys_.clear(); }
  bool Contains(uint64_t key) const { return keys_.contains(key); }
  size_t size() const { return keys_.size(); }
  // How many of `block_keys` (a request's full-block keys, block 0 first)
  // are cached from the start: the prefix cache stops at the first miss,
  // so a cached block after a missing one does not count.
  int64_t LeadingHits(absl::Span<const uint64_t> block_keys) const;

 private:
  absl::flat_hash_set<uint64_t> keys_;
};

// One replica as the policy sees it.
struct ReplicaView {
  bool ready = false;
  int64_t running = 0;  // Sequences running.
  int64_t waiting = 0;  // Queued (including preempted).
  double kv_use = 0;    // Device KV blocks held by sequences / total.
  const PrefixIndex* index = nullptr;  // Null: nothing cached known.
};

struct RoutingOptions {
  RoutingPolicyKind kind = RoutingPolicyKind::kKv;
  // kv: a replica is eligible while its load (running + waiting) is at
  // most load_factor * least + load_slack, where least is the least loaded
  // ready replica's load.
  double load_factor = 1.5;
  int64_t load_slack = 4;
};

struct RouteDecision {
  int replica = -1;           // -1: no replica is ready.
  int64_t cached_blocks = 0;  // The chosen replica's leading hits (kv).
};

class RoutingPolicy {
 public:
  explicit RoutingPolicy(RoutingOptions options) : options_(options) {}
  const RoutingOptions& options() const { return options_; }

  // Picks a replica for a request whose full-block keys are `block_keys`
  // (unused but by kv). `exclude`: a replica index not to choose (the one
  // a retry comes from), or -1.
  RouteDecision Choose(absl::Span<const ReplicaView> replicas,
                       absl::Span<const uint64_t> block_keys, int exclude = -1);

 private:
  RoutingOptions options_;
  uint64_t turn_ = 0;  // Decisions made: the rotation of remaining ties.
};

}  // namespace shardlm

#endif  // SHARDLM_ROUTER_ROUTING_POLICY_H_
