#include "router/replica_dns.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shardlm {

absl::StatusOr<DnsTarget> ParseDnsTarget(absl::string_view value) {
  const size_t colon = value.rfind(':');
  DnsTarget t;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(value.substr(colon + 1), &t.port) || t.port < 1 ||
      t.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replicas-dns '", value,
                     "': expected NAME:PORT (a DNS name and the replicas' "
                     "gRPC port, 1..65535)"));
  }
  t.host = std::string(value.substr(0, colon));
  return t;
}

absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot resolve '", host, "': ", ::gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[NI_MAXHOST];
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof(text), nullptr, 0,
                      NI_NUMERICHOST) == 0) {
      out.emplace_back(text);
    }
  }
  ::freeaddrinfo(found);
  if (out.empty()) {
    return absl::NotFoundError(
        absl::StrCat("cannot resolve '", host, "': no addresses"));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> DnsReplicaAddresses(
    const DnsTarget& target, const HostResolver& resolve) {
  absl::StatusOr<std::vector<std::string>> ips = resolve(target.host);
  if (!ips.ok()) return ips.status();
  std::vector<std::string> out;
  for (const std::string& ip : *ips) {
    out.push_back(ip.find(':') != std::string::npos
                      ? absl::StrCat("[", ip, "]:", target.port)
                      : absl::StrCat(ip, ":", target.port));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.empty()) {
    return absl::NotFoundError(
        absl::StrCat("cannot resolve '", target.host, "': no addresses"));
  }
  return out;
}

bool ReplicaSources::Set(Source source, std::vector<std::string> addresses) {
  const std::vector<std::string> before = All();
  lists_[source] = std::move(addresses);
  return All() != before;
}

std::vector<std::string> ReplicaSources::All() const {
  std::vector<std::string> out;
  const auto add = [&out](const std::vector<std::string>& list) {
    for (const std::string& a : list) {
      if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
    }
  };
  add(flags_);
  add(lists_[kFile]);
  add(lists_[kDns]);
  return out;
}

}  // namespace shardlm
