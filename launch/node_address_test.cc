#include "launch/node_address.h"

#include "gtest/gtest.h"

namespace shardlm {
namespace {

NodeInfo Node(std::string host, std::string stack,
              std::vector<Ipv4Interface> interfaces) {
  return {std::move(host), std::move(stack), std::move(interfaces)};
}

std::string NoRoute(const std::string&) { return ""; }
std::string RouteViaEth1(const std::string&) { return "192.168.7.2"; }

TEST(NodeAddressTest, EncodingRoundTripsAndRejectsGarbage) {
  const NodeInfo n =
      Node("node1", "boot/net:[1]",
           {{"eth0", "10.1.2.3", 24}, {"ib0", "172.16.0.9", 16}});
  auto back = DecodeNodeInfo(EncodeNodeInfo(n));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, n);
  EXPECT_FALSE(DecodeNodeInfo("").ok());
  EXPECT_FALSE(DecodeNodeInfo("node1").ok());
  EXPECT_FALSE(DecodeNodeInfo("node1 s eth0=10.1.2.300/24").ok());
  EXPECT_FALSE(DecodeNodeInfo("node1 s eth0=10.1.2.3/33").ok());
  EXPECT_FALSE(DecodeNodeInfo("node1 s eth0=10.1.2.3").ok());
}

TEST(NodeAddressTest, ThisNodeDescribesItsOwnStack) {
  const NodeInfo n = ThisNode();
  EXPECT_FALSE(n.hostname.empty());
  EXPECT_FALSE(n.stack.empty());
  EXPECT_EQ(ThisNode().stack, n.stack);
  for (const Ipv4Interface& i : n.interfaces) {
    EXPECT_NE(i.address.rfind("127.", 0), 0u) << "loopback listed: " << i.name;
  }
  auto back = DecodeNodeInfo(EncodeNodeInfo(n));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, n);
}

TEST(NodeAddressTest, OneHostUsesLoopbackWhateverTheHostNames) {
  const NodeInfo self = Node("a", "s", {{"eth0", "10.0.0.1", 24}});
  auto c =
      ChooseAdvertisedAddress(self, {Node("b", "s", {}), self}, 1, NoRoute);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "127.0.0.1");
}

TEST(NodeAddressTest, SameHostNameOnAnotherStackIsAnotherHost) {
  // Containers or namespaces often share a host name: it proves nothing.
  const NodeInfo self =
      Node("vm", "boot/net:[1]", {{"eth0", "198.18.0.1", 24}});
  auto c = ChooseAdvertisedAddress(
      self, {Node("vm", "boot/net:[2]", {{"eth0", "198.18.0.2", 24}})}, 1,
      NoRoute);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "198.18.0.1");
  EXPECT_TRUE(c->unreached.empty());
  EXPECT_NE(c->why.find("198.18.0.0/24"), std::string::npos) << c->why;
}

TEST(NodeAddressTest, PicksTheSubnetTheWorkersShareNotTheFirstInterface) {
  // eth0 is the management network; the workers are on the fabric.
  const NodeInfo self = Node(
      "head", "s0", {{"eth0", "192.168.1.10", 24}, {"fab0", "10.8.0.1", 16}});
  std::vector<NodeInfo> peers = {
      Node("w1", "s1",
           {{"eth0", "192.168.2.11", 24}, {"fab0", "10.8.3.1", 16}}),
      Node("w2", "s2", {{"fab0", "10.8.4.1", 16}}),
      Node("head", "s0", {}),  // A worker beside the coordinator.
  };
  auto c = ChooseAdvertisedAddress(self, peers, 1, NoRoute);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "10.8.0.1");
  EXPECT_TRUE(c->unreached.empty());
  EXPECT_NE(c->why.find("fab0"), std::string::npos) << c->why;
}

TEST(NodeAddressTest, NamesTheRanksThatMustRoute) {
  const NodeInfo self = Node("head", "s0", {{"eth0", "10.0.0.1", 24}});
  std::vector<NodeInfo> peers = {
      Node("w1", "s1", {{"eth0", "10.0.0.2", 24}}),
      Node("w2", "s2", {{"eth0", "10.0.9.2", 24}}),
  };
  auto c = ChooseAdvertisedAddress(self, peers, 1, NoRoute);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "10.0.0.1");
  EXPECT_EQ(c->unreached, std::vector<int>{2});
  EXPECT_NE(c->why.find("rank 2 must route"), std::string::npos) << c->why;
}

TEST(NodeAddressTest, RoutedNetworksUseTheKernelsSourceAddress) {
  const NodeInfo self = Node(
      "head", "s0", {{"eth0", "10.0.0.1", 24}, {"eth1", "192.168.7.2", 24}});
  std::vector<NodeInfo> peers = {
      Node("w1", "s1", {{"eth0", "172.20.0.5", 24}})};
  auto c = ChooseAdvertisedAddress(self, peers, 1, RouteViaEth1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "192.168.7.2");
  EXPECT_NE(c->why.find("route to rank 1 (172.20.0.5)"), std::string::npos)
      << c->why;
}

TEST(NodeAddressTest, NoUsableAddressIsAClearError) {
  const NodeInfo self = Node("head", "s0", {{"eth0", "10.0.0.1", 24}});
  std::vector<NodeInfo> peers = {
      Node("w1", "s1", {{"eth0", "172.20.0.5", 24}})};
  auto c = ChooseAdvertisedAddress(self, peers, 1, NoRoute);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--advertise-address"),
            std::string::npos);
  EXPECT_NE(c.status().message().find("rank 1 (172.20.0.5)"),
            std::string::npos);
  auto none =
      ChooseAdvertisedAddress(Node("head", "s0", {}), peers, 1, NoRoute);
  EXPECT_FALSE(none.ok());
}

TEST(NodeAddressTest, KernelRouteSourceOfLoopbackIsLoopback) {
  EXPECT_EQ(KernelRouteSource("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(KernelRouteSource("not an address"), "");
}

}  // namespace
}  // namespace shardlm
