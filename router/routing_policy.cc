#include "router/routing_policy.h"

#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace shardlm {

absl::StatusOr<RoutingPolicyKind> ParseRoutingPolicy(absl::string_view name) {
  if (name == "kv") return RoutingPolicyKind::kKv;
  if (name == "least-load") return RoutingPolicyKind::kLeastLoad;
  if (name == "round-robin") return RoutingPolicyKind::kRoundRobin;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown routing policy '", name, "' (kv, least-load or round-robin)"));
}

const char* RoutingPolicyName(RoutingPolicyKind kind) {
  switch (kind) {
    case RoutingPolicyKind::kKv:
      return "kv";
    case RoutingPolicyKind::kLeastLoad:
      return "least-load";
    case RoutingPolicyKind::kRoundRobin:
      return "round-robin";
  }
  return "?";
}

void PrefixIndex::Reset(absl::Span<const uint64_t> keys) {
  keys_.clear();
  keys_.insert(keys.begin(), keys.end());
}

int64_t PrefixIndex::LeadingHits(absl::Span<const uint64_t> block_keys) const {
  int64_t n = 0;
  for (uint64_t k : block_keys) {
    if (!keys_.contains(k)) break;
    ++n;
  }
  return n;
}

RouteDecision RoutingPolicy::Choose(absl::Span<const ReplicaView> replicas,
                                    absl::Span<const uint64_t> block_keys,
                                    int exclude) {
  const int n = static_cast<int>(replicas.size());
  const uint64_t turn = turn_++;
  RouteDecision d;
  if (n == 0) return d;
  const auto usable = [&](int r) { return r != exclude && replicas[r].ready; };
  // Replicas in rotated order: the first of equals wins.
  const auto nth = [&](int i) { return static_cast<int>((turn + i) % n); };

  if (options_.kind == RoutingPolicyKind::kRoundRobin) {
    for (int i = 0; i < n; ++i) {
      if (usable(nth(i))) {
        d.replica = nth(i);
        return d;
      }
    }
    return d;
  }

  int64_t least = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < n; ++r) {
    if (usable(r)) {
      least = std::min(least, replicas[r].running + replicas[r].waiting);
    }
  }
  if (least == std::numeric_limits<int64_t>::max()) return d;
  const bool kv = options_.kind == RoutingPolicyKind::kKv;
  const double bound = options_.load_factor * static_cast<double>(least) +
                       static_cast<double>(options_.load_slack);

  // Larger is better. kv: (cached blocks, -running, -waiting, -, -KV use),
  // equal hits ranked by running sequences first; least-load: (-, -load,
  // -running, -waiting, -KV use).
  using Score = std::tuple<int64_t, int64_t, int64_t, int64_t, double>;
  Score best;
  for (int i = 0; i < n; ++i) {
    const int r = nth(i);
    if (!usable(r)) continue;
    const ReplicaView& v = replicas[r];
    const int64_t load = v.running + v.waiting;
    int64_t hits = 0;
    if (kv) {
      if (static_cast<double>(load) > bound) continue;
      hits = v.index == nullptr ? 0 : v.index->LeadingHits(block_keys);
    }
    const Score s = kv ? Score{hits, -v.running, -v.waiting, 0, -v.kv_use}
                       : Score{0, -load, -v.running, -v.waiting, -v.kv_use};
    if (d.replica < 0 || s > best) {
      best = s;
      d.replica = r;
      d.cached_blocks = hits;
    }
  }
  return d;
}

}  // namespace shardlm
