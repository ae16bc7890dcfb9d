// --replicas-dns: parsing the flag, turning a resolution into replica
// addresses, and replicas added and removed as the answer changes (a fake
// resolver; the real one on "localhost").
#include "router/replica_dns.h"

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "router/replica_set.h"

namespace shardlm {
namespace {

using Addresses = std::vector<std::string>;

TEST(ParseDnsTargetTest, TakesNameAndPort) {
  absl::StatusOr<DnsTarget> t =
      ParseDnsTarget("shardlm-leader.default.svc.cluster.local:50051");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->host, "shardlm-leader.default.svc.cluster.local");
  EXPECT_EQ(t->port, 50051);
}

TEST(ParseDnsTargetTest, RefusesWhatIsNotNamePortNamingTheValue) {
  for (const char* bad : {"leader", "leader:", ":50051", "leader:0",
                          "leader:65536", "leader:5x"}) {
    absl::StatusOr<DnsTarget> t = ParseDnsTarget(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(std::string("'") + bad + "'"),
              std::string::npos)
        << t.status();
  }
}

TEST(DnsReplicaAddressesTest, SortsDeduplicatesAndBracketsIpv6) {
  const HostResolver fake = [](const std::string& host) {
    EXPECT_EQ(host, "leaders");
    return absl::StatusOr<Addresses>(
        Addresses{"10.0.0.9", "10.0.0.2", "fd00::1", "10.0.0.9"});
  };
  absl::StatusOr<Addresses> a = DnsReplicaAddresses({"leaders", 7}, fake);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (Addresses{"10.0.0.2:7", "10.0.0.9:7", "[fd00::1]:7"}));
}

TEST(DnsReplicaAddressesTest, PassesTheResolversErrorOn) {
  const HostResolver fake = [](const std::string& host) {
    return absl::StatusOr<Addresses>(
        absl::NotFoundError("cannot resolve '" + host + "'"));
  };
  absl::StatusOr<Addresses> a = DnsReplicaAddresses({"gone", 7}, fake);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(a.status().message().find("'gone'"), std::string::npos);
}

TEST(ResolveHostTest, LocalhostIsLoopbackAndNonsenseIsNamed) {
  absl::StatusOr<Addresses> a = ResolveHost("localhost");
  ASSERT_TRUE(a.ok()) << a.status();
  bool loopback = false;
  for (const std::string& ip : *a) loopback |= ip == "127.0.0.1" || ip == "::1";
  EXPECT_TRUE(loopback) << a->front();
  // RFC 6761: .invalid never resolves.
  absl::StatusOr<Addresses> none = ResolveHost("no-such-replica.invalid");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("'no-such-replica.invalid'"),
            std::string::npos)
      << none.status();
}

TEST(ReplicaSourcesTest, UnionInOrderEachOnce) {
  ReplicaSources s({"a:1", "b:1"});
  EXPECT_FALSE(s.Set(ReplicaSources::kFile, {"b:1"}));
  EXPECT_TRUE(s.Set(ReplicaSources::kDns, {"c:1", "a:1"}));
  EXPECT_EQ(s.All(), (Addresses{"a:1", "b:1", "c:1"}));
  EXPECT_FALSE(s.Set(ReplicaSources::kDns, {"a:1", "c:1"}));
  EXPECT_TRUE(s.Set(ReplicaSources::kDns, {}));
  EXPECT_EQ(s.All(), (Addresses{"a:1", "b:1"}));
}

// The router's loop in small: each resolution's union goes to
// ReplicaSet::SetAddresses. Nothing listens on these ports; the set watches
// them all the same, which is all this checks.
TEST(DnsReplicasTest, ReplicasFollowTheARecords) {
  std::vector<Addresses> answers = {{"127.0.0.1", "127.0.0.2"},
                                    {"127.0.0.2", "127.0.0.3"},
                                    {"127.0.0.1", "127.0.0.2", "127.0.0.3"}};
  size_t turn = 0;
  const HostResolver fake = [&](const std::string&) {
    return absl::StatusOr<Addresses>(answers[turn]);
  };
  const DnsTarget target{"leaders", 1};
  ReplicaSources sources({});
  absl::StatusOr<Addresses> first = DnsReplicaAddresses(target, fake);
  ASSERT_TRUE(first.ok());
  sources.Set(ReplicaSources::kDns, *first);
  ReplicaSetOptions o;
  o.addresses = sources.All();
  o.call_timeout = absl::Milliseconds(200);
  auto set = ReplicaSet::Start(o);
  ASSERT_TRUE(set.ok()) << set.status();
  const auto live = [&] {
    std::map<std::string, bool> out;
    for (int i = 0; i < (*set)->size(); ++i) {
      out[(*set)->address(i)] = !(*set)->Removed(i);
    }
    return out;
  };
  EXPECT_EQ(live(), (std::map<std::string, bool>{{"127.0.0.1:1", true},
                                                 {"127.0.0.2:1", true}}));
  turn = 1;  // .1 gone, .3 new.
  ASSERT_TRUE(
      sources.Set(ReplicaSources::kDns, *DnsReplicaAddresses(target, fake)));
  ASSERT_TRUE((*set)->SetAddresses(sources.All()).ok());
  EXPECT_EQ(live(), (std::map<std::string, bool>{{"127.0.0.1:1", false},
                                                 {"127.0.0.2:1", true},
                                                 {"127.0.0.3:1", true}}));
  turn = 2;  // .1 back.
  ASSERT_TRUE(
      sources.Set(ReplicaSources::kDns, *DnsReplicaAddresses(target, fake)));
  ASSERT_TRUE((*set)->SetAddresses(sources.All()).ok());
  EXPECT_EQ(live(), (std::map<std::string, bool>{{"127.0.0.1:1", true},
                                                 {"127.0.0.2:1", true},
                                                 {"127.0.0.3:1", true}}));
  // The same answer again changes nothing.
  EXPECT_FALSE(
      sources.Set(ReplicaSources::kDns, *DnsReplicaAddresses(target, fake)));
}

}  // namespace
}  // namespace shardlm
