// The control plane end to end in one process: a real gRPC server with the
// ControlService on 127.0.0.1, worker agents on threads whose shards talk
// through fake communicators, and an Engine over the RemoteExecutor.
// Checks TP x PP equivalence with an in-process TP = PP = 1 engine, dead
// workers (stream lost, silent, hung) and bad startups.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "collectives/fake_communicator.h"
#include "coordinator/control_service.h"
#include "coordinator/engine.h"
#include "coordinator/engine_leak_check.h"
#include "coordinator/remote_executor.h"
#include "core/max_abs_diff.h"
#include "core/status.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "kernels/threading.h"
#include "model/in_memory_weights.h"
#include "model/shard_plan.h"
#include "step/step_codec.h"
#include "worker/control_channel.h"
#include "worker/kv_pool.h"
#include "worker/worker_agent.h"

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Polls `done` every 10 ms until it holds (true) or 30 s pass (false), so
// that a broken cluster fails the test instead of hanging it.
bool WaitFor(const std::function<bool()>& done) {
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (!done()) {
    if (absl::Now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

ModelConfig RandomConfig() {
  ModelConfig c;
  c.n_layers = 4;
  c.hidden = 64;
  c.ffn_hidden = 160;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.head_dim = 8;
  c.vocab_size = 311;
  c.context_length = 512;
  c.rope_theta = 10000.0f;
  c.rope_style = RopeStyle::kRotateHalf;
  return c;
}

std::vector<int32_t> Prompt(int n, int salt, int vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 7919 + salt * 104729) % vocab);
  return p;
}

// A shard over fake communicators. Hooks let tests break it.
class TestHost : public ShardHost {
 public:
  TestHost(const WeightSource& source, ShardComms comms)
      : source_(source), comms_(comms) {}

  absl::StatusOr<KvPoolConfig> Load(const WorkerAssignment& a) override {
    assignment = a;
    registered = true;
    if (!load_error.ok()) return load_error;
    absl::SleepFor(load_delay);
    SetCpuThreads(a.threads);
    reports_ = SamplingShard(a.tp, a.pp) == a.pp_rank * a.tp + a.tp_rank;
    ASSIGN_OR_RETURN(ShardPlan plan, PlanShards(source_, a.tp, a.pp));
    const ShardSpec& spec = plan.at(a.pp_rank, a.tp_rank);
    ASSIGN_OR_RETURN(LlamaWeights w, LoadLlamaWeights(source_, spec));
    ASSIGN_OR_RETURN(
        KvPoolConfig kv,
        PoolConfigForShard(w.config, spec, a.kv.block_size, a.kv.DTypeOnCpu(),
                           a.kv.kv_cache_bytes, a.kv.cpu_offload_bytes));
    ASSIGN_OR_RETURN(std::unique_ptr<KvPool> pool, KvPool::Create(kv));
    runner_ =
        std::make_unique<ModelRunner>(std::move(w), std::move(pool), comms_);
    if (reported_blocks.has_value()) kv.num_blocks = *reported_blocks;
    return kv;
  }

  absl::StatusOr<StepOutput> Step(const StepInput& step) override {
    if (before_step) before_step(steps_);
    ++steps_;
    ASSIGN_OR_RETURN(Tensor logits, runner_->Forward(step));
    if (!reports_) return StepOutput{};
    return SampleStep(step, std::move(logits));
  }

  WorkerAssignment assignment;          // The last one received.
  std::atomic<bool> registered{false};  // An assignment came.
  absl::Status load_error;
  absl::Duration load_delay;
  std::function<void(int)> before_step;  // Called with the step count.
  // Reported to the coordinator instead of the pool's real block count.
  std::optional<int64_t> reported_blocks;

 private:
  const WeightSource& source_;
  ShardComms comms_;
  bool reports_ = false;
  int steps_ = 0;
  std::unique_ptr<ModelRunner> runner_;
};

// A ControlService behind a gRPC server on a free port, and worker agents
// on threads: the TP group of each stage and the PP chain of each TP index
// joined by fake communicators, as in in_process_executor.cc.
class TestCluster {
 public:
  TestCluster(const WeightSource& source, ClusterOptions options,
              absl::Duration comm_timeout = absl::Seconds(30),
              ControlTls tls = {})
      : source_(source), service_(options), tls_(std::move(tls)) {
    const int tp = options.tp, pp = options.pp;
    comms_.resize(tp * pp);
    if (tp > 1) {
      for (int p = 0; p < pp; ++p) {
        auto g = MakeFakeGroup(tp, absl::StrCat("tp group of stage ", p),
                               {.timeout = comm_timeout});
        for (int t = 0; t < tp; ++t) {
          comms_[p * tp + t].tp = g[t].get();
          owned_.push_back(std::move(g[t]));
        }
      }
    }
    if (pp > 1) {
      for (int t = 0; t < tp; ++t) {
        auto g = MakeFakeGroup(pp, absl::StrCat("pp chain of tp ", t),
                               {.timeout = comm_timeout});
        for (int p = 0; p < pp; ++p) {
          comms_[p * tp + t].pp = g[p].get();
          owned_.push_back(std::move(g[p]));
        }
      }
    }
    for (int r = 1; r <= tp * pp; ++r) {
      hosts_.push_back(std::make_unique<TestHost>(source, comms_[r - 1]));
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", ControlServerCredentials(tls_),
                             &port_);
    AddControlService(builder, &service_);
    server_ = builder.BuildAndStart();
    statuses_.resize(tp * pp + 8);
  }
  ~TestCluster() { Stop(); }

  ControlService& service() { return service_; }
  // Engines over these workers (or any other engine of the test) live
  // until Stop(), which first checks that each got all its KV blocks back
  // and ends it while the workers still run.
  Engine* Keep(absl::StatusOr<std::unique_ptr<Engine>> engine) {
    return engines_.Keep(std::move(engine));
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  TestHost& host(int rank) { return *hosts_[rank - 1]; }

  WorkerAgentOptions AgentOptions(int rank) const {
    return {.coordinator = address(),
            .rank = rank,
            .model_path = "/models/random",
            .model_bytes = 1000,
            .model_digest = "0123456789abcdef",
            .heartbeat_interval = absl::Milliseconds(100),
            .coordinator_timeout = absl::Seconds(5),
            .connect_timeout = absl::Seconds(5),
            .tls = tls_};
  }

  // Runs an agent for `rank` on a thread, with the host of `host_rank`.
  void StartWorker(WorkerAgentOptions o, int host_rank = 0) {
    const size_t slot = threads_.size();
    TestHost* host = hosts_[(host_rank ? host_rank : o.rank) - 1].get();
    threads_.emplace_back([this, o, host, slot] {
      SetCpuThreads(1);
      statuses_[slot] = RunWorkerAgent(o, *host);
    });
  }
  void StartAll() {
    for (int r = 1; r <= service_.num_workers(); ++r) {
      StartWorker(AgentOptions(r));
    }
  }

  // Closes the kept engines (the leak check), shuts the workers down,
  // joins them and stops the server. Returns the agents' statuses in start
  // order.
  std::vector<absl::Status> Stop() {
    if (stopped_) return statuses_;
    stopped_ = true;
    engines_.Close();
    service_.Shutdown("test done");
    for (std::thread& t : threads_) t.join();
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
    server_->Wait();
    statuses_.resize(threads_.size());
    return statuses_;
  }

 private:
  const WeightSource& source_;
  ControlService service_;
  const ControlTls tls_;  // The server's; the agents' by default.
  std::vector<std::unique_ptr<Communicator>> owned_;
  std::vector<ShardComms> comms_;
  std::vector<std::unique_ptr<TestHost>> hosts_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::thread> threads_;
  std::vector<absl::Status> statuses_;
  bool stopped_ = false;
  EngineLeakCheck engines_;
};

ClusterOptions Options(int tp, int pp) {
  return {.tp = tp,
          .pp = pp,
          .heartbeat_interval = absl::Milliseconds(100),
          .worker_timeout = absl::Seconds(2),
          .step_timeout = absl::Seconds(20)};
}

std::vector<GenerateRequest> Requests(int max_tokens) {
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    reqs.push_back({.prompt = Prompt(1 + 9 * i, i, 311),
                    .max_tokens = max_tokens,
                    .return_prompt_logits = true,
                    .logprobs = i % 3 * 3});
  }
  return reqs;
}

TEST(BlockTableDeltasTest, SendsOnlyNewBlocks) {
  BlockTableDeltas d;
  std::vector<int32_t> delta;
  d.Delta(7, {3, 4}, &delta);
  EXPECT_EQ(delta, (std::vector<int32_t>{3, 4}));
  d.Delta(7, {3, 4}, &delta);
  EXPECT_TRUE(delta.empty());
  d.Delta(7, {3, 4, 9}, &delta);
  EXPECT_EQ(delta, (std::vector<int32_t>{9}));
  EXPECT_TRUE(d.TakeReleased().empty());
  // A table that is not an extension: released, then resent whole.
  d.Delta(7, {5}, &delta);
  EXPECT_EQ(delta, (std::vector<int32_t>{5}));
  EXPECT_EQ(d.TakeReleased(), (std::vector<int64_t>{7}));
  d.Release(7);
  d.Release(8);  // Never sent: nothing to tell the workers.
  EXPECT_EQ(d.TakeReleased(), (std::vector<int64_t>{7}));
  EXPECT_EQ(d.tracked(), 0u);
  d.Delta(7, {5}, &delta);
  EXPECT_EQ(delta, (std::vector<int32_t>{5}));
}

TEST(ModelDigestTest, CatchesDifferentFiles) {
  const auto dir = std::filesystem::temp_directory_path() /
                   absl::StrCat("shardlm_digest_", getpid());
  std::filesystem::create_directories(dir);
  const auto write = [](const std::filesystem::path& p, size_t n, char last) {
    std::ofstream out(p, std::ios::binary);
    std::string s(n, 'x');
    s.back() = last;
    out << s;
  };
  write(dir / "a.gguf", 3 << 20, 'a');
  uint64_t bytes = 0;
  auto d1 = ModelDigest((dir / "a.gguf").string(), &bytes);
  ASSERT_TRUE(d1.ok()) << d1.status();
  EXPECT_EQ(bytes, 3u << 20);
  write(dir / "a.gguf", 3 << 20, 'b');  // Same size, last byte differs.
  auto d2 = ModelDigest((dir / "a.gguf").string(), &bytes);
  ASSERT_TRUE(d2.ok());
  EXPECT_NE(*d1, *d2);
  write(dir / "model.safetensors", 100, 'c');
  write(dir / "config.json", 10, '}');
  auto d3 = ModelDigest(dir.string(), &bytes);
  ASSERT_TRUE(d3.ok()) << d3.status();
  EXPECT_EQ(bytes, 110u);  // The .gguf is not part of a safetensors model.
  auto missing = ModelDigest((dir / "nope").string(), &bytes);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "nope"));
  std::filesystem::remove_all(dir);
}

class ClusterEquivalenceTest
    : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(ClusterEquivalenceTest, SameTokensAsOneProcess) {
  const auto [tp, pp] = GetParam();
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  const std::vector<GenerateRequest> reqs = Requests(12);
  // f32 KV on both sides, so that the bound is f32's reordering (1e-6
  // here) with room to spare: f16 KV adds rounding steps that the machine's
  // BLAS summation order decides (parallel_equivalence_test bounds those),
  // and its 1e-4 moves are no sign of a wrong cluster. The swap test below
  // runs the cluster on the default f16.
  EngineLeakCheck base_engines;
  Engine* base_engine = base_engines.Keep(
      Engine::Create(*source, {.kv = {.dtype = DType::kF32},
                               .limits = {.max_batched_tokens = 13},
                               .threads = 1}));
  ASSERT_NE(base_engine, nullptr);
  auto base = base_engine->GenerateBatch(reqs);
  ASSERT_TRUE(base.ok()) << base.status();

  ClusterOptions options = Options(tp, pp);
  options.kv.dtype = DType::kF32;
  TestCluster cluster(*source, options);
  cluster.StartAll();
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  const RemoteExecutor* remote = executor->get();
  EXPECT_EQ(remote->num_kv_blocks(), 512 / 16);
  EXPECT_TRUE(remote->Health().ok()) << remote->Health();
  Engine* engine = cluster.Keep(Engine::Create(
      std::move(*executor), {.limits = {.max_batched_tokens = 13}}));
  ASSERT_NE(engine, nullptr);
  auto got = engine->GenerateBatch(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  int64_t blocks = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*got)[i].tokens, (*base)[i].tokens) << "request " << i;
    ASSERT_EQ((*got)[i].prompt_logits.size(), (*base)[i].prompt_logits.size());
    const double err =
        MaxAbsDiff((*got)[i].prompt_logits, (*base)[i].prompt_logits);
    EXPECT_LT(err, 1e-4) << "request " << i;
    // Log-probabilities cross the control plane row by row.
    ASSERT_EQ((*got)[i].logprobs.size(), (*base)[i].logprobs.size());
    EXPECT_EQ((*got)[i].logprobs.size(),
              reqs[i].logprobs > 0 ? (*got)[i].tokens.size() : 0u);
    for (size_t t = 0; t < (*base)[i].logprobs.size(); ++t) {
      const TokenLogprobs& a = (*got)[i].logprobs[t];
      const TokenLogprobs& b = (*base)[i].logprobs[t];
      EXPECT_NEAR(a.sampled, b.sampled, 1e-4) << "request " << i;
      ASSERT_EQ(a.top.size(), static_cast<size_t>(reqs[i].logprobs));
      ASSERT_EQ(a.top.size(), b.top.size());
      for (size_t k = 0; k < a.top.size(); ++k) {
        EXPECT_EQ(a.top[k].token, b.top[k].token) << "request " << i;
        EXPECT_NEAR(a.top[k].logprob, b.top[k].logprob, 1e-4);
      }
    }
    // Blocks are taken as the KV grows: the last token's is never computed.
    blocks += (reqs[i].prompt.size() + (*got)[i].tokens.size() - 1 + 15) / 16;
  }
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  // Every block id went out once: plans carry deltas, not whole tables.
  const RemoteExecutorStats stats = remote->stats();
  EXPECT_EQ(stats.blocks_sent, blocks);
  EXPECT_GT(stats.steps, 12);
  std::printf("[tp%d pp%d] %lld steps, %lld block ids, %lld plan bytes\n", tp,
              pp, static_cast<long long>(stats.steps),
              static_cast<long long>(stats.blocks_sent),
              static_cast<long long>(stats.plan_bytes));
  // A second batch reuses the workers' tables cleanly.
  auto again = engine->GenerateBatch({reqs[3]});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[0].tokens, (*base)[3].tokens);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  for (const absl::Status& s : cluster.Stop()) EXPECT_TRUE(s.ok()) << s;
}

// Swaps to the host tier, cached-prefix hits and spills are block copies in
// the plans; every worker runs them on its own slice.
TEST(ClusterKvTiersTest, SwapsAndPrefixHitsCrossTheControlPlane) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  const std::vector<GenerateRequest> reqs = Requests(24);
  EngineLeakCheck base_engines;
  Engine* base_engine = base_engines.Keep(
      Engine::Create(*source, {.kv = {.prefix_caching = false},
                               .limits = {.max_batched_tokens = 13},
                               .threads = 1}));
  ASSERT_NE(base_engine, nullptr);
  auto base = base_engine->GenerateBatch(reqs);
  ASSERT_TRUE(base.ok()) << base.status();

  // One block of a shard at TP=2 x PP=2: K and V, 2 layers, 16 tokens, 2 KV
  // heads of 8 values, f16 (the default KV dtype).
  constexpr int64_t kShardBlock = 2 * 2 * 16 * 2 * 8 * 2;
  ClusterOptions options = Options(2, 2);
  options.kv.kv_cache_bytes = 8 * kShardBlock;
  options.kv.cpu_offload_bytes = 60 * kShardBlock;
  TestCluster cluster(*source, options);
  cluster.StartAll();
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  EXPECT_EQ((*executor)->num_kv_blocks(), 8);
  EXPECT_EQ((*executor)->num_host_kv_blocks(), 60);
  Engine* engine = cluster.Keep(Engine::Create(
      std::move(*executor), {.limits = {.max_batched_tokens = 13}}));
  ASSERT_NE(engine, nullptr);
  auto got = engine->GenerateBatch(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*got)[i].tokens, (*base)[i].tokens) << "request " << i;
  }
  // The longest prompt again: its full blocks are cached (on either tier).
  const SchedulerStats before = engine->stats();
  auto again = engine->GenerateBatch({reqs[7]});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[0].tokens, (*base)[7].tokens);
  const SchedulerStats after = engine->stats();
  EXPECT_GT(before.preempted_swap, 0);
  EXPECT_EQ(after.blocks.prefix_hit_tokens - before.blocks.prefix_hit_tokens,
            (reqs[7].prompt.size() - 1) / 16 * 16);
  EXPECT_EQ(engine->blocks().used_blocks(), 0);
  std::printf(
      "cluster tp2 pp2, 8 device blocks: %lld swap preemptions, %lld "
      "blocks out, %lld in, %lld spilled\n",
      static_cast<long long>(after.preempted_swap),
      static_cast<long long>(after.blocks.swapped_out),
      static_cast<long long>(after.blocks.swapped_in),
      static_cast<long long>(after.blocks.spilled));
  for (const absl::Status& s : cluster.Stop()) EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ClusterEquivalenceTest,
                         ::testing::Values(std::pair{1, 1}, std::pair{2, 1},
                                           std::pair{1, 2}, std::pair{2, 2}),
                         [](const auto& info) {
                           return absl::StrCat("tp", info.param.first, "_pp",
                                               info.param.second);
                         });

// Expects `s` to be Unavailable naming `who`.
void ExpectUnavailable(const absl::Status& s, const std::string& who) {
  std::printf("%s\n", s.ToString().c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), who)) << s;
}

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

TEST(ClusterStartupTest, DifferentModelFilesNameBothRanks) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  TestCluster cluster(*source, Options(2, 1));
  cluster.StartWorker(cluster.AgentOptions(1));
  // Rank 2 starts once rank 1 is in, so that rank 1 is the reference.
  ASSERT_TRUE(WaitFor([&] {
    return !absl::StrContains(cluster.service().Health().message(),
                              "waiting for worker ranks 1,");
  })) << "rank 1 never joined: "
      << cluster.service().Health();
  WorkerAgentOptions o2 = cluster.AgentOptions(2);
  o2.model_digest = "fedcba9876543210";
  cluster.StartWorker(o2);
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_FALSE(executor.ok());
  const absl::Status& s = executor.status();
  std::printf("%s\n", s.ToString().c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "model files differ")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 2")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "fedcba9876543210")) << s;
  std::vector<absl::Status> agents = cluster.Stop();
  EXPECT_EQ(agents[1].code(), absl::StatusCode::kFailedPrecondition)
      << agents[1];
}

TEST(ClusterStartupTest, DuplicateAndOutOfRangeRanksAreRejected) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  {
    TestCluster cluster(*source, Options(2, 1));
    cluster.StartWorker(cluster.AgentOptions(1));
    cluster.StartWorker(cluster.AgentOptions(1), 2);
    auto executor = RemoteExecutor::WaitForWorkers(
        cluster.service(), source->config(), absl::Seconds(30));
    ASSERT_FALSE(executor.ok());
    EXPECT_EQ(executor.status().code(), absl::StatusCode::kAlreadyExists)
        << executor.status();
    EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                  "registered as rank 1, which worker at"))
        << executor.status();
    std::vector<absl::Status> agents = cluster.Stop();
    EXPECT_TRUE(agents[0].code() == absl::StatusCode::kAlreadyExists ||
                agents[1].code() == absl::StatusCode::kAlreadyExists);
  }
  {
    TestCluster cluster(*source, Options(2, 1));
    cluster.StartWorker(cluster.AgentOptions(3), 2);
    auto executor = RemoteExecutor::WaitForWorkers(
        cluster.service(), source->config(), absl::Seconds(30));
    ASSERT_FALSE(executor.ok());
    EXPECT_EQ(executor.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                  "registered as rank 3, but worker ranks "
                                  "are 1..2 (tp 2 x pp 1)"))
        << executor.status();
    std::vector<absl::Status> agents = cluster.Stop();
    EXPECT_EQ(agents[0].code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(agents[0].message(), "registered as rank 3"))
        << agents[0];
  }
}

// GPU clusters: a worker reports its device and GPU at registration; the
// coordinator refuses a worker of another kind than the cluster's, and two
// workers on one GPU (naming both), unless allow_shared_gpu. (The shards
// here run on the CPU: what is tested is the coordinator's bookkeeping.)
TEST(ClusterStartupTest, GpuWorkersOnOneGpuAreRefusedNamingBoth) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  const auto gpu_worker = [](TestCluster& c, int rank, std::string uuid) {
    WorkerAgentOptions o = c.AgentOptions(rank);
    o.device = "cuda";
    o.gpu_uuid = std::move(uuid);
    o.gpu_ordinal = rank - 1;
    return o;
  };
  ClusterOptions options = Options(2, 1);
  options.device = "cuda";
  {
    TestCluster cluster(*source, options);
    cluster.StartWorker(gpu_worker(cluster, 1, "GPU-aaaa"));
    ASSERT_TRUE(WaitFor([&] {
      return !absl::StrContains(cluster.service().Health().message(),
                                "waiting for worker ranks 1,");
    })) << "rank 1 never joined: "
        << cluster.service().Health();
    cluster.StartWorker(gpu_worker(cluster, 2, "GPU-aaaa"));
    auto executor = RemoteExecutor::WaitForWorkers(
        cluster.service(), source->config(), absl::Seconds(30));
    ASSERT_FALSE(executor.ok());
    const absl::Status& s = executor.status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "worker rank 2")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "worker rank 1")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "both use GPU GPU-aaaa")) << s;
    cluster.Stop();
  }
  {  // Distinct GPUs form; the assignment carries the GPU sizing settings.
    options.limits.max_batched_tokens = 96;
    options.limits.max_seqs = 7;
    options.kv.gpu_memory_utilization = 0.5;
    TestCluster cluster(*source, options);
    cluster.StartWorker(gpu_worker(cluster, 1, "GPU-aaaa"));
    cluster.StartWorker(gpu_worker(cluster, 2, "GPU-bbbb"));
    auto executor = RemoteExecutor::WaitForWorkers(
        cluster.service(), source->config(), absl::Seconds(30));
    ASSERT_TRUE(executor.ok()) << executor.status();
    EXPECT_STREQ((*executor)->backend(), "cuda");
    for (int r = 1; r <= 2; ++r) {
      const WorkerAssignment& a = cluster.host(r).assignment;
      EXPECT_EQ(a.limits.max_batched_tokens, 96);
      EXPECT_EQ(a.limits.max_seqs, 7);
      EXPECT_EQ(a.kv.gpu_memory_utilization, 0.5);
      EXPECT_EQ(a.step_timeout, options.step_timeout);
      EXPECT_EQ(a.rendezvous_prefix, options.rendezvous_prefix);
    }
    cluster.Stop();
  }
  {  // allow_shared_gpu (tests): one GPU may hold both.
    options.allow_shared_gpu = true;
    TestCluster cluster(*source, options);
    cluster.StartWorker(gpu_worker(cluster, 1, "GPU-aaaa"));
    cluster.StartWorker(gpu_worker(cluster, 2, "GPU-aaaa"));
    auto executor = RemoteExecutor::WaitForWorkers(
        cluster.service(), source->config(), absl::Seconds(30));
    EXPECT_TRUE(executor.ok()) << executor.status();
    cluster.Stop();
  }
}

TEST(ClusterStartupTest, WorkerOfAnotherDeviceKindIsRefused) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  ClusterOptions options = Options(1, 1);
  options.device = "cuda";
  TestCluster cluster(*source, options);
  cluster.StartWorker(cluster.AgentOptions(1));  // A CPU worker.
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_FALSE(executor.ok());
  EXPECT_EQ(executor.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                "runs on cpu but this cluster's workers run "
                                "on cuda (the coordinator's --device)"))
      << executor.status();
  std::vector<absl::Status> agents = cluster.Stop();
  EXPECT_EQ(agents[0].code(), absl::StatusCode::kFailedPrecondition)
      << agents[0];
}

TEST(ClusterStartupTest, StrangersWithoutTheTokenAreRefusedAndStartupGoesOn) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  ClusterOptions options = Options(2, 1);
  options.cluster_token = "the-cluster-token";
  TestCluster cluster(*source, options);
  // A stranger claims rank 1 first, without the token, then with a wrong
  // one; the real workers come after.
  WorkerAgentOptions stranger = cluster.AgentOptions(1);
  cluster.StartWorker(stranger);
  stranger.cluster_token = "the-cluster-tokeX";
  cluster.StartWorker(stranger);
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
  for (int i : {0, 1}) {
    EXPECT_EQ(agents[i].code(), absl::StatusCode::kUnauthenticated)
        << agents[i];
    EXPECT_TRUE(absl::StrContains(agents[i].message(), "cluster token"))
        << agents[i];
  }
  EXPECT_TRUE(agents[2].ok()) << agents[2];
  EXPECT_TRUE(agents[3].ok()) << agents[3];
}

// A call to `method` of the control service opened as a bidirectional
// stream from which nothing is sent: only its headers (with `token` as
// the cluster token's metadata, unless empty) reach the coordinator.
// Returns how the call ended, or DEADLINE_EXCEEDED if the coordinator
// waited for a message until `deadline` instead of refusing the call.
grpc::Status OpenWithoutMessage(const std::string& address, const char* method,
                                const std::string& token,
                                std::chrono::seconds deadline) {
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  if (!token.empty()) context.AddMetadata(kClusterTokenMetadata, token);
  const grpc::internal::RpcMethod rpc(
      method, grpc::internal::RpcMethod::BIDI_STREAMING, channel);
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::StoreGetRequest, v1::StoreGetResponse>>
      call(grpc::internal::ClientReaderWriterFactory<
           v1::StoreGetRequest, v1::StoreGetResponse>::Create(channel.get(),
                                                              rpc, &context));
  v1::StoreGetResponse ignored;
  while (call->Read(&ignored)) {
  }
  return call->Finish();
}

// The token is checked from the call's headers, before any message of the
// call is read (gRPC buffers a whole message before it applies its size
// limit): a stranger's first message, however large, is never buffered or
// parsed, on Connect and on the store's calls alike.
TEST(ClusterStartupTest, TheTokenIsCheckedBeforeAnyMessageIsRead) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  ClusterOptions options = Options(2, 1);
  options.cluster_token = "the-cluster-token";
  TestCluster cluster(*source, options);
  for (const char* method :
       {"/shardlm.v1.Control/Connect", "/shardlm.v1.Control/StoreSet",
        "/shardlm.v1.Control/StoreGet"}) {
    for (const std::string token : {"", "the-cluster-tokeX"}) {
      // Refused at once: long before the call's deadline (generous, so
      // that a slow machine's connection setup cannot reach it).
      const Clock::time_point start = Clock::now();
      const grpc::Status s = OpenWithoutMessage(
          cluster.address(), method, token, std::chrono::seconds(30));
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << method << " token '" << token << "': " << s.error_message();
      EXPECT_TRUE(absl::StrContains(s.error_message(), "cluster token"))
          << s.error_message();
      EXPECT_LT(Since(start), 10.0) << method;
    }
  }
  // With the right token the coordinator does wait for the message.
  EXPECT_EQ(
      OpenWithoutMessage(cluster.address(), "/shardlm.v1.Control/StoreGet",
                         "the-cluster-token", std::chrono::seconds(3))
          .error_code(),
      grpc::StatusCode::DEADLINE_EXCEEDED);

  // A 64 MiB Register, with the right token inside it but not in the
  // call's metadata: refused without being read.
  {
    auto channel = grpc::CreateCustomChannel(
        cluster.address(), grpc::InsecureChannelCredentials(), [] {
          grpc::ChannelArguments args;
          args.SetMaxSendMessageSize(-1);
          return args;
        }());
    auto stub = v1::Control::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    auto stream = stub->Connect(&context);
    v1::WorkerMessage msg;
    msg.mutable_register_()->set_rank(1);
    msg.mutable_register_()->set_cluster_token("the-cluster-token");
    msg.mutable_register_()->set_host(std::string(64 << 20, 'x'));
    stream->Write(msg);  // May fail: the coordinator has refused the call.
    stream->WritesDone();
    v1::CoordinatorMessage in;
    EXPECT_FALSE(stream->Read(&in));
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << s.error_message();
  }
  // The real workers start the cluster, which serves.
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
  for (const absl::Status& s : cluster.Stop()) EXPECT_TRUE(s.ok()) << s;
}

TEST(ClusterStartupTest, OutOfRangeBlockCountsAreRefused) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  for (int64_t blocks : {int64_t{-5}, int64_t{0}, int64_t{1} << 50}) {
    TestCluster cluster(*source, Options(2, 1));
    cluster.host(2).reported_blocks = blocks;
    cluster.StartAll();
    auto executor = RemoteExecutor::WaitForWorkers(
        cluster.service(), source->config(), absl::Seconds(30));
    ASSERT_FALSE(executor.ok()) << blocks;
    EXPECT_EQ(executor.status().code(), absl::StatusCode::kInvalidArgument)
        << executor.status();
    EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                  absl::StrCat("worker rank 2 (pp 0, tp 1)")))
        << executor.status();
    EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                  absl::StrCat("reported ", blocks, " device")))
        << executor.status();
    cluster.Stop();
  }
}

TEST(ClusterStartupTest, LoadFailureIsReported) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  TestCluster cluster(*source, Options(2, 1));
  cluster.host(2).load_error =
      absl::NotFoundError("cannot open /models/x.gguf: no such file");
  cluster.StartAll();
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_FALSE(executor.ok());
  EXPECT_EQ(executor.status().code(), absl::StatusCode::kNotFound)
      << executor.status();
  EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                "worker rank 2 (pp 0, tp 1)"))
      << executor.status();
  EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                "cannot open /models/x.gguf"))
      << executor.status();
  std::vector<absl::Status> agents = cluster.Stop();
  EXPECT_EQ(agents[1].code(), absl::StatusCode::kNotFound);
}

TEST(ClusterStartupTest, RegistrationTimeoutNamesMissingRanks) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  TestCluster cluster(*source, Options(2, 2));
  cluster.StartWorker(cluster.AgentOptions(2));
  // Rank 2 in before the short wait starts, however slow this machine.
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (!cluster.host(2).registered && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(cluster.host(2).registered);
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(1));
  ASSERT_FALSE(executor.ok());
  EXPECT_EQ(executor.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                "ranks 1, 3, 4 never registered"))
      << executor.status();
  cluster.Stop();
}

// Certificates made by the openssl command in a fresh directory: the
// cluster CA (ca.pem), a certificate for 127.0.0.1 it signed (node.pem,
// node.key), and another CA's (other.pem, other.key). Nullopt when openssl
// is missing or fails.
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

TEST(WorkerAgentTest, UnreachableCoordinatorIsNamed) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  TestHost host(*source, {});
  const Clock::time_point start = Clock::now();
  absl::Status s = RunWorkerAgent({.coordinator = "127.0.0.1:1",
                                   .rank = 1,
                                   .connect_timeout = absl::Milliseconds(500)},
                                  host);
  EXPECT_LT(Since(start), 5.0);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), "127.0.0.1:1")) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "does not resolve")) << s;
}

// A coordinator that assigns and then goes silent.
class SilentCoordinator final : public v1::Control::Service {
 public:
  grpc::Status Connect(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>*
          stream) override {
    v1::WorkerMessage in;
    if (!stream->Read(&in)) return grpc::Status::OK;
    v1::CoordinatorMessage out;
    out.mutable_assignment()->set_tp(1);
    out.mutable_assignment()->set_pp(1);
    out.mutable_assignment()->set_threads(1);
    EncodeKvCacheOptions({.dtype = DType::kF16},
                         out.mutable_assignment()->mutable_kv());
    EncodeBatchLimits({}, out.mutable_assignment()->mutable_limits());
    stream->Write(out);
    while (stream->Read(&in)) {
    }
    return grpc::Status::OK;
  }
};

TEST(WorkerAgentTest, SilentCoordinatorIsDetected) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  SilentCoordinator coordinator;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&coordinator);
  auto server = builder.BuildAndStart();
  TestHost host(*source, {});
  const std::string address = absl::StrCat("127.0.0.1:", port);
  absl::Status s =
      RunWorkerAgent({.coordinator = address,
                      .rank = 1,
                      .heartbeat_interval = absl::Milliseconds(100),
                      .coordinator_timeout = absl::Seconds(1)},
                     host);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), address)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "no message for 1s")) << s;
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
}

}  // namespace
}  // namespace shardlm
