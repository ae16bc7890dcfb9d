// Mutual TLS on the control plane (cluster_test_util.h), with
// certificates made by openssl for the test.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/cluster_test_util.h"
#include "cluster/remote_executor.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"

namespace shardlm {
namespace {

using cluster_testing::Options;
using cluster_testing::RandomConfig;
using cluster_testing::TestCluster;

absl::StatusOr<std::filesystem::path> MakeTestPki() {
  const auto dir = std::filesystem::temp_directory_path() /
                   absl::StrCat("shardlm_control_pki_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string script = absl::StrCat(
      "cd '", dir.string(), "' && exec >openssl.log 2>&1 && ",
      "printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && ",
      "for ca in ca other-ca; do openssl req -x509 -newkey rsa:2048 -nodes "
      "-days 2 -subj \"/CN=$ca\" -keyout $ca.key -out $ca.pem || exit 1; "
      "done && ",
      "for n in node:ca other:other-ca; do name=${n%%:*}; ca=${n#*:}; "
      "openssl req -newkey rsa:2048 -nodes -subj \"/CN=$name\" -keyout "
      "$name.key -out $name.csr && openssl x509 -req -in $name.csr -CA "
      "$ca.pem -CAkey $ca.key -CAcreateserial -days 2 -extfile san.ext -out "
      "$name.pem || exit 1; done");
  if (std::system(script.c_str()) != 0) {
    std::ifstream log(dir / "openssl.log");
    const std::string text(std::istreambuf_iterator<char>(log), {});
    std::filesystem::remove_all(dir);
    return absl::FailedPreconditionError(
        absl::StrCat("openssl could not make the test certificates "
                     "(scripts/install-deps.sh installs openssl): ",
                     text));
  }
  return dir;
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

ControlTls TlsFrom(const std::filesystem::path& dir, const std::string& name,
                   const std::string& ca = "ca") {
  return {.ca_pem = ReadFile(dir / (ca + ".pem")),
          .cert_chain_pem = ReadFile(dir / (name + ".pem")),
          .private_key_pem = ReadFile(dir / (name + ".key"))};
}

// Mutual TLS on the control plane: workers with the cluster CA's
// certificate form the cluster and serve; a worker without a certificate
// (plaintext), one with another CA's, and one that trusts the right CA
// but shows no certificate are refused and change nothing.
TEST(ClusterTlsTest, MutualTlsClusterServesAndStrangersAreRefused) {
  const absl::StatusOr<std::filesystem::path> pki = MakeTestPki();
  ASSERT_TRUE(pki.ok()) << pki.status();
  absl::Cleanup remove = [&] { std::filesystem::remove_all(*pki); };
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  ClusterOptions options = Options(2, 1);
  options.cluster_token = "the-cluster-token";
  TestCluster cluster(*source, options, absl::Seconds(30),
                      TlsFrom(*pki, "node"));
  const auto stranger = [&](ControlTls tls) {
    WorkerAgentOptions o = cluster.AgentOptions(1);
    o.cluster_token = "the-cluster-token";
    o.connect_timeout = absl::Seconds(2);
    o.tls = std::move(tls);
    return o;
  };
  cluster.StartWorker(stranger({}));  // Plaintext.
  cluster.StartWorker(stranger(TlsFrom(*pki, "other", "other-ca")));
  // Trusts the coordinator but shows another CA's certificate.
  cluster.StartWorker(stranger(TlsFrom(*pki, "other", "ca")));
  ControlTls no_cert = TlsFrom(*pki, "node");
  no_cert.cert_chain_pem = no_cert.private_key_pem = "";
  {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = no_cert.ca_pem;
    auto channel =
        grpc::CreateChannel(cluster.address(), grpc::SslCredentials(o));
    EXPECT_FALSE(channel->WaitForConnected(std::chrono::system_clock::now() +
                                           std::chrono::seconds(2)))
        << "a TLS client without a certificate got a connection";
  }
  for (int r = 1; r <= 2; ++r) {
    WorkerAgentOptions o = cluster.AgentOptions(r);
    o.cluster_token = "the-cluster-token";
    cluster.StartWorker(o);
  }
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  Engine* engine = cluster.Keep(Engine::Create(std::move(*executor), {}));
  ASSERT_NE(engine, nullptr);
  auto r = engine->Generate({.prompt = {1, 2, 3}, .max_tokens = 3});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens.size(), 3u);
  std::vector<absl::Status> agents = cluster.Stop();
  for (int i : {0, 1, 2}) {
    std::printf("stranger %d: %s\n", i, agents[i].ToString().c_str());
    EXPECT_EQ(agents[i].code(), absl::StatusCode::kUnavailable) << agents[i];
    EXPECT_TRUE(
        absl::StrContains(agents[i].message(), "port accepts connections"))
        << agents[i];
  }
  EXPECT_TRUE(absl::StrContains(agents[0].message(), "--control-tls-cert"))
      << agents[0];
  EXPECT_TRUE(agents[3].ok()) << agents[3];
  EXPECT_TRUE(agents[4].ok()) << agents[4];
}

}  // namespace
}  // namespace shardlm
