// Dead workers in a running cluster (cluster_test_util.h): a lost stream,
// a silent worker, a hung step; slow is not dead; survivors are told.
#include <chrono>
#include <cstdio>
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

using cluster_testing::Clock;
using cluster_testing::ExpectUnavailable;
using cluster_testing::Options;
using cluster_testing::RandomConfig;
using cluster_testing::Requests;
using cluster_testing::Since;
using cluster_testing::TestCluster;

TEST(ClusterFailureTest, LostWorkerFailsTheCallAndStaysFailed) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  // Comms time out quickly so that rank 1 does not wait long on rank 2.
  TestCluster cluster(*source, Options(1, 2), absl::Seconds(3));
  absl::Notification kill;
  cluster.host(2).before_step = [&](int step) {
    if (step != 5) return;
    kill.Notify();  // The agent drops its stream, as if the process died.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  };
  cluster.StartWorker(cluster.AgentOptions(1));
  WorkerAgentOptions o2 = cluster.AgentOptions(2);
  o2.stop = &kill;
  cluster.StartWorker(o2);
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  Engine* engine = cluster.Keep(Engine::Create(std::move(*executor), {}));
  ASSERT_NE(engine, nullptr);
  const Clock::time_point start = Clock::now();
  auto got = engine->GenerateBatch(Requests(40));
  EXPECT_LT(Since(start), 10.0);
  ExpectUnavailable(got.status(), "worker rank 2 (pp 1, tp 0)");
  EXPECT_TRUE(absl::StrContains(got.status().message(), "stream closed"))
      << got.status();
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  ExpectUnavailable(engine->executor().Health(), "worker rank 2");
  ExpectUnavailable(cluster.service().Health(), "worker rank 2");
  // Refused without waiting on the dead rank: such a wait would end only
  // at the 3 s comm timeout (or later), and say it timed out. (The bound is
  // that timeout, not a guess at this machine's speed.)
  const Clock::time_point again = Clock::now();
  auto later = engine->GenerateBatch(Requests(4));
  EXPECT_LT(Since(again), 3.0);
  ExpectUnavailable(later.status(), "worker rank 2");
  EXPECT_FALSE(absl::StrContains(later.status().message(), "timed out"))
      << later.status();
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  std::vector<absl::Status> agents = cluster.Stop();
  // The survivor learns the cluster failed, whoever ended it first.
  EXPECT_EQ(agents[0].code(), absl::StatusCode::kUnavailable) << agents[0];
  EXPECT_TRUE(absl::StrContains(agents[0].message(), "worker rank 2"))
      << agents[0];
  EXPECT_EQ(agents[1].code(), absl::StatusCode::kCancelled) << agents[1];
}

// After a rank dies the survivors are told (Shutdown naming it), and one
// stuck in a collective with the dead rank is handed to on_abandon (which
// ends the process in `shardlm launch`) instead of waiting out the
// collective's timeout.
TEST(ClusterFailureTest, SurvivorsAreToldAndAStuckStepIsAbandoned) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  absl::Notification kill, release;
  TestCluster cluster(*source, Options(2, 1), absl::Seconds(4));
  // Rank 2's step ends before the cluster is stopped, also on failure.
  absl::Cleanup released = [&] {
    if (!release.HasBeenNotified()) release.Notify();
  };
  cluster.host(2).before_step = [&](int step) {
    if (step != 3) return;
    kill.Notify();  // Rank 2's stream drops; its step never joins rank 1's.
    release.WaitForNotification();
  };
  std::mutex mu;
  std::string abandoned;
  absl::Notification abandon;
  Clock::time_point abandoned_at;
  WorkerAgentOptions o1 = cluster.AgentOptions(1);
  o1.abandon_grace = absl::Milliseconds(500);
  o1.on_abandon = [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    abandoned = why;
    abandoned_at = Clock::now();
    abandon.Notify();
  };
  cluster.StartWorker(o1);
  WorkerAgentOptions o2 = cluster.AgentOptions(2);
  o2.stop = &kill;
  cluster.StartWorker(o2);
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  Engine* engine = cluster.Keep(Engine::Create(std::move(*executor), {}));
  ASSERT_NE(engine, nullptr);
  auto got = engine->Generate({.prompt = {1, 2, 3}, .max_tokens = 10});
  ExpectUnavailable(got.status(), "worker rank 2");
  const Clock::time_point failed = Clock::now();
  ASSERT_TRUE(abandon.WaitForNotificationWithTimeout(absl::Seconds(3)))
      << "rank 1 still waits in its step";
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(absl::StrContains(abandoned, "worker rank 1: a step still"))
        << abandoned;
    EXPECT_TRUE(absl::StrContains(abandoned,
                                  "the cluster failed: worker rank 2 (pp 0, "
                                  "tp 1)"))
        << abandoned;
    EXPECT_LT(std::chrono::duration<double>(abandoned_at - failed).count(),
              2.5);
  }
  std::move(released).Invoke();
  std::vector<absl::Status> agents = cluster.Stop();
  // Told the cluster failed: the survivor leaves with an error naming why.
  EXPECT_EQ(agents[0].code(), absl::StatusCode::kUnavailable) << agents[0];
  EXPECT_TRUE(absl::StrContains(agents[0].message(),
                                "ended the cluster: the cluster failed: "
                                "worker rank 2"))
      << agents[0];
}

TEST(ClusterFailureTest, HungStepTimesOut) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  ClusterOptions options = Options(1, 1);
  options.step_timeout = absl::Seconds(2);
  TestCluster cluster(*source, options);
  absl::Notification release;
  cluster.host(1).before_step = [&](int step) {
    if (step == 3) release.WaitForNotification();
  };
  cluster.StartAll();
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  Engine* engine = cluster.Keep(Engine::Create(std::move(*executor), {}));
  ASSERT_NE(engine, nullptr);
  const Clock::time_point start = Clock::now();
  auto got = engine->Generate({.prompt = {1, 2, 3}, .max_tokens = 10});
  EXPECT_LT(Since(start), 10.0);
  ExpectUnavailable(got.status(), "worker rank 1");
  EXPECT_TRUE(absl::StrContains(got.status().message(), "no result for step 4"))
      << got.status();
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  release.Notify();
  std::vector<absl::Status> agents = cluster.Stop();
  EXPECT_FALSE(agents[0].ok());  // Its stream was cancelled.
}

// With steps in flight, a step waits in stage 0's queue behind the one
// before it: its timeout counts from when it is waited for (the step before
// it done), not from its send, or a pipeline of slow healthy steps (long
// prompts' chunks on CPUs) would be taken for a hang.
TEST(ClusterFailureTest, StepQueuedBehindASlowStepIsNotHung) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  ClusterOptions options = Options(1, 2);
  // The shape that tells the two clocks apart: a step's own time S under
  // the timeout T, two steps' time 2S over it; T = 1.5 S leaves S / 2 on
  // both sides (1.2 s: a loaded 2-core machine's scheduling is well
  // within it; 0.7 and 0.6 s were not always).
  options.step_timeout = absl::Milliseconds(3600);
  TestCluster cluster(*source, options);
  // Stage 0 takes 2.4 s over each of four steps: a step sent while the one
  // before it is there has its results 4.8 s after its send.
  cluster.host(1).before_step = [](int step) {
    if (step >= 3 && step <= 6) absl::SleepFor(absl::Milliseconds(2400));
  };
  cluster.StartAll();
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  (*executor)->set_max_steps_in_flight(2);
  Engine* engine = cluster.Keep(Engine::Create(std::move(*executor), {}));
  ASSERT_NE(engine, nullptr);
  // Two sequences: their steps alternate, two in flight.
  auto got = engine->GenerateBatch({{.prompt = {1, 2, 3}, .max_tokens = 4},
                                    {.prompt = {4, 5}, .max_tokens = 4}});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].tokens.size(), 4u);
  EXPECT_EQ((*got)[1].tokens.size(), 4u);
  std::vector<absl::Status> agents = cluster.Stop();
  for (const absl::Status& a : agents) EXPECT_TRUE(a.ok()) << a;
}

// Workers heartbeat while they load and step: a load or a step longer than
// worker_timeout is not death.
TEST(ClusterFailureTest, SlowLoadAndStepAreNotDeath) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  ClusterOptions options = Options(1, 1);
  // Long enough that a heartbeat delayed by a loaded 2-core machine is not
  // taken for death; the load and the step take well over it.
  options.worker_timeout = absl::Milliseconds(1500);
  TestCluster cluster(*source, options);
  cluster.host(1).load_delay = absl::Milliseconds(3500);
  cluster.host(1).before_step = [](int step) {
    if (step == 1) absl::SleepFor(absl::Milliseconds(3500));
  };
  cluster.StartAll();
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  Engine* engine = cluster.Keep(Engine::Create(std::move(*executor), {}));
  ASSERT_NE(engine, nullptr);
  auto got = engine->Generate({.prompt = {1, 2, 3}, .max_tokens = 4});
  EXPECT_TRUE(got.ok()) << got.status();
  for (const absl::Status& s : cluster.Stop()) EXPECT_TRUE(s.ok()) << s;
}

// A worker that registers and reports ready, then says nothing more.
TEST(ClusterFailureTest, SilentWorkerIsDead) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  ClusterOptions options = Options(1, 1);
  options.worker_timeout = absl::Seconds(1);
  TestCluster cluster(*source, options);
  auto channel = grpc::CreateChannel(cluster.address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Control::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->Connect(&context);
  v1::WorkerMessage msg;
  msg.mutable_register_()->set_rank(1);
  msg.mutable_register_()->set_host("silent");
  ASSERT_TRUE(stream->Write(msg));
  v1::CoordinatorMessage in;
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_TRUE(in.has_assignment());
  msg.mutable_ready()->set_kv_blocks(32);
  ASSERT_TRUE(stream->Write(msg));
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  Engine* engine = cluster.Keep(Engine::Create(std::move(*executor), {}));
  ASSERT_NE(engine, nullptr);
  const Clock::time_point start = Clock::now();
  auto got = engine->Generate({.prompt = {1, 2, 3}, .max_tokens = 4});
  EXPECT_LT(Since(start), 5.0);
  ExpectUnavailable(got.status(), "worker rank 1 (pp 0, tp 0) at silent:0");
  EXPECT_TRUE(absl::StrContains(got.status().message(), "no heartbeat for 1s"))
      << got.status();
  while (stream->Read(&in)) {
  }
  stream->Finish();
  cluster.Stop();
}

}  // namespace
}  // namespace shardlm
