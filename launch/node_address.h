// Where each rank of a launch runs, and the address the coordinator
// advertises to its workers (docs/multinode.md).
//
// On one host every address works, loopback included. Across hosts a host
// name often does not (it may resolve to 127.0.1.1, or nowhere), and the
// coordinator's hostname is what it used to advertise. So every rank
// describes its network stack (which hosts share loopback) and its IPv4
// interfaces, and the coordinator picks one of its own addresses that the
// workers can reach: the one on the subnet the most other hosts share.
#ifndef SHARDLM_LAUNCH_NODE_ADDRESS_H_
#define SHARDLM_LAUNCH_NODE_ADDRESS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardlm {

struct Ipv4Interface {
  std::string name;     // eth0
  std::string address;  // 10.0.0.5
  int prefix = 32;      // 24 for 10.0.0.5/24

  bool operator==(const Ipv4Interface&) const = default;
};

struct NodeInfo {
  std::string hostname;
  // Equal for two processes exactly when they share a network stack (the
  // same boot of the same machine and the same network namespace), so that
  // loopback reaches one from the other.
  std::string stack;
  // Up, non-loopback IPv4 interfaces, in the kernel's order.
  std::vector<Ipv4Interface> interfaces;

  bool operator==(const NodeInfo&) const = default;
};

// This process's node (getifaddrs, /proc/sys/kernel/random/boot_id and
// /proc/self/ns/net; the host name alone where /proc lacks them).
NodeInfo ThisNode();

// One line of text and back, for exchanging over MPI: "hostname stack
// name=address/prefix ...". Decode rejects malformed text.
std::string EncodeNodeInfo(const NodeInfo& node);
absl::StatusOr<NodeInfo> DecodeNodeInfo(const std::string& text);

// The first interface address of `node` ("" when it has none).
std::string FirstAddress(const NodeInfo& node);

struct AdvertisedAddress {
  std::string host;  // An IPv4 address of `self` (127.0.0.1 on one host).
  std::string why;   // For the log: how it was chosen.
  // Ranks (indexes into `peers`, plus first_rank) on other hosts that
  // share no subnet with `host`: they must route to it.
  std::vector<int> unreached;
};

// The address of `self` that `peers` (ranks first_rank, first_rank + 1,
// ...) can dial: loopback when they all share self's stack; else the
// address on the subnet that the most peers on other hosts have an address
// in (the first such interface on ties); else, when no peer shares a
// subnet, the source address the kernel would use to reach the first
// remote peer. FailedPrecondition when self has no usable address.
// `route_source` answers "which local address would the kernel send from
// to this IPv4 address" ("" when none); the default asks the kernel.
using RouteSource = std::string (*)(const std::string& destination);
std::string KernelRouteSource(const std::string& destination);
absl::StatusOr<AdvertisedAddress> ChooseAdvertisedAddress(
    const NodeInfo& self, const std::vector<NodeInfo>& peers,
    int first_rank = 1, RouteSource route_source = KernelRouteSource);

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_NODE_ADDRESS_H_
