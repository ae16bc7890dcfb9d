#include "launch/node_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace shardlm {
namespace {

std::string ReadLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string LinkTarget(const char* path) {
  char buf[256];
  const ssize_t n = readlink(path, buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

std::optional<uint32_t> ParseIpv4(const std::string& text) {
  in_addr a{};
  if (inet_pton(AF_INET, text.c_str(), &a) != 1) return std::nullopt;
  return ntohl(a.s_addr);
}

uint32_t Mask(int prefix) {
  return prefix <= 0 ? 0 : prefix >= 32 ? ~0u : ~0u << (32 - prefix);
}

std::string Cidr(const Ipv4Interface& i) {
  const uint32_t net = *ParseIpv4(i.address) & Mask(i.prefix);
  in_addr a{.s_addr = htonl(net)};
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return absl::StrCat(buf, "/", i.prefix);
}

// Whether `node` has an address inside `subnet`'s network.
bool HasAddressIn(const NodeInfo& node, const Ipv4Interface& subnet) {
  const uint32_t mask = Mask(subnet.prefix);
  const uint32_t net = *ParseIpv4(subnet.address) & mask;
  for (const Ipv4Interface& i : node.interfaces) {
    const std::optional<uint32_t> a = ParseIpv4(i.address);
    if (a && (*a & mask) == net) return true;
  }
  return false;
}

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                      absl::StrJoin(ranks, ", "));
}

}  // namespace

NodeInfo ThisNode() {
  NodeInfo node;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  node.hostname = host;
  const std::string boot = ReadLine("/proc/sys/kernel/random/boot_id");
  const std::string net = LinkTarget("/proc/self/ns/net");
  node.stack = boot.empty() || net.empty()
                   ? absl::StrCat("host:", node.hostname)
                   : absl::StrCat(boot, "/", net);
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET ||
          (i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) {
        continue;
      }
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr,
                buf, sizeof(buf));
      int prefix = 32;
      if (i->ifa_netmask != nullptr) {
        prefix = __builtin_popcount(
            reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr);
      }
      node.interfaces.push_back({i->ifa_name, buf, prefix});
    }
    freeifaddrs(list);
  }
  return node;
}

std::string EncodeNodeInfo(const NodeInfo& node) {
  std::string out = absl::StrCat(node.hostname, " ", node.stack);
  for (const Ipv4Interface& i : node.interfaces) {
    absl::StrAppend(&out, " ", i.name, "=", i.address, "/", i.prefix);
  }
  return out;
}

absl::StatusOr<NodeInfo> DecodeNodeInfo(const std::string& text) {
  const std::vector<std::string> words =
      absl::StrSplit(text, ' ', absl::SkipEmpty());
  if (words.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("node description '", text, "' lacks a host or stack"));
  }
  NodeInfo node{.hostname = words[0], .stack = words[1]};
  for (size_t w = 2; w < words.size(); ++w) {
    const std::vector<std::string> parts =
        absl::StrSplit(words[w], absl::ByAnyChar("=/"));
    int prefix = 0;
    if (parts.size() != 3 || !ParseIpv4(parts[1]) ||
        !absl::SimpleAtoi(parts[2], &prefix) || prefix < 0 || prefix > 32) {
      return absl::InvalidArgumentError(
          absl::StrCat("node description of ", words[0], ": bad interface '",
                       words[w], "' (want name=address/prefix)"));
    }
    node.interfaces.push_back({parts[0], parts[1], prefix});
  }
  return node;
}

std::string FirstAddress(const NodeInfo& node) {
  return node.interfaces.empty() ? "" : node.interfaces.front().address;
}

std::string KernelRouteSource(const std::string& destination) {
  const std::optional<uint32_t> dest = ParseIpv4(destination);
  if (!dest) return "";
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  // Connecting a UDP socket sends nothing: it only picks a route.
  sockaddr_in to{.sin_family = AF_INET, .sin_port = htons(9)};
  to.sin_addr.s_addr = htonl(*dest);
  sockaddr_in from{};
  socklen_t len = sizeof(from);
  std::string source;
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&from), &len) == 0) {
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &from.sin_addr, buf, sizeof(buf));
    source = buf;
  }
  close(fd);
  return source;
}

absl::StatusOr<AdvertisedAddress> ChooseAdvertisedAddress(
    const NodeInfo& self, const std::vector<NodeInfo>& peers, int first_rank,
    RouteSource route_source) {
  std::vector<int> remote;  // Indexes of peers on other hosts.
  for (int p = 0; p < static_cast<int>(peers.size()); ++p) {
    if (peers[p].stack != self.stack) remote.push_back(p);
  }
  if (remote.empty()) {
    return AdvertisedAddress{.host = "127.0.0.1",
                             .why = "every rank is on this host"};
  }
  // The interface whose subnet the most remote peers share.
  int best = -1, best_count = 0;
  for (int i = 0; i < static_cast<int>(self.interfaces.size()); ++i) {
    int count = 0;
    for (int p : remote) count += HasAddressIn(peers[p], self.interfaces[i]);
    if (count > best_count) best = i, best_count = count;
  }
  AdvertisedAddress out;
  if (best >= 0) {
    const Ipv4Interface& chosen = self.interfaces[best];
    out.host = chosen.address;
    for (int p : remote) {
      if (!HasAddressIn(peers[p], chosen))
        out.unreached.push_back(p + first_rank);
    }
    out.why = absl::StrCat(
        "on ", chosen.name, ", in ", Cidr(chosen), " with ",
        best_count == static_cast<int>(remote.size()) ? "every" : "most",
        " worker on another host");
    if (!out.unreached.empty()) {
      absl::StrAppend(&out.why, "; ", RankList(out.unreached),
                      " must route to it");
    }
    return out;
  }
  // No shared subnet: whatever address the kernel sends from to the first
  // remote peer (routed networks).
  const int p = remote.front();
  const std::string peer = FirstAddress(peers[p]);
  const std::string source = peer.empty() ? "" : route_source(peer);
  for (const Ipv4Interface& i : self.interfaces) {
    if (i.address != source) continue;
    out.host = source;
    out.why =
        absl::StrCat("on ", i.name, ", the route to rank ", p + first_rank,
                     " (", peer, "); no worker shares a subnet with this host");
    for (int r : remote) out.unreached.push_back(r + first_rank);
    return out;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot choose an address of ", self.hostname, " for the workers on ",
      "other hosts: it shares no subnet with them",
      peer.empty() ? " and they report no IPv4 address"
                   : absl::StrCat(" and has no route to rank ", p + first_rank,
                                  " (", peer, ")"),
      "; pass --advertise-address"));
}

}  // namespace shardlm
