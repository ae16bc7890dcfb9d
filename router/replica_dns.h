// Where the router's replica list comes from (docs/router.md): --replica
// flags, a --replicas-file re-read on change, and --replicas-dns NAME:PORT,
// re-resolved periodically (a LeaderWorkerSet's leader headless service
// answers one A record per ready leader pod). No threads here: the router
// command polls and hands the union to ReplicaSet::SetAddresses, which adds
// and removes replicas.
#ifndef SHARDLM_ROUTER_REPLICA_DNS_H_
#define SHARDLM_ROUTER_REPLICA_DNS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardlm {

// A --replicas-dns value: a host name and the replicas' gRPC port.
struct DnsTarget {
  std::string host;
  int port = 0;
};

// "NAME:PORT" parsed, or InvalidArgument naming the flag and the value.
absl::StatusOr<DnsTarget> ParseDnsTarget(absl::string_view value);

// A host name to its IP addresses (IPv4 dotted, IPv6 without brackets);
// NotFound naming the host when it has none. The real one asks the system
// resolver (getaddrinfo); tests pass a fake.
using HostResolver = std::function<absl::StatusOr<std::vector<std::string>>(
    const std::string& host)>;
absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host);

// The replica addresses `target` resolves to now: "ip:port" ("[ip]:port"
// for IPv6), sorted, each once. The resolver's error, naming the host.
absl::StatusOr<std::vector<std::string>> DnsReplicaAddresses(
    const DnsTarget& target, const HostResolver& resolve);

// The union of the replica sources, in order (flags, file, DNS), each
// address once.
class ReplicaSources {
 public:
  enum Source { kFile = 0, kDns = 1 };
  explicit ReplicaSources(std::vector<std::string> flags)
      : flags_(std::move(flags)) {}
  // Replaces one source's addresses; true when the union changed.
  bool Set(Source source, std::vector<std::string> addresses);
  std::vector<std::string> All() const;

 private:
  std::vector<std::string> flags_;
  std::vector<std::string> lists_[2];
};

}  // namespace shardlm

#endif  // SHARDLM_ROUTER_REPLICA_DNS_H_
