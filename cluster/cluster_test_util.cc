#include "cluster/cluster_test_util.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "collectives/fake_communicator.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "kernels/threading.h"
#include "model/shard_plan.h"
#include "worker/kv_pool.h"
#include "worker/llama_weights.h"
#include "worker/sample_step.h"

namespace shardlm::cluster_testing {

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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

absl::StatusOr<KvPoolConfig> TestHost::Load(const WorkerAssignment& a) {
  assignment = a;
  registered = true;
  if (!load_error.ok()) return load_error;
  absl::SleepFor(load_delay);
  SetCpuThreads(a.threads);
  reports_ =
      SamplingShard(a.tp, a.pp, a.cp) ==
      RankIndex(
          {.tp_rank = a.tp_rank, .cp_rank = a.cp_rank, .pp_rank = a.pp_rank},
          a.tp, a.cp);
  ASSIGN_OR_RETURN(ShardPlan plan, PlanShards(source_, a.tp, a.pp));
  ShardSpec spec = plan.at(a.pp_rank, a.tp_rank);
  spec.cp_rank = a.cp_rank;
  spec.cp_size = a.cp;
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

absl::StatusOr<StepOutput> TestHost::Step(const StepInput& step) {
  if (before_step) before_step(steps_);
  ++steps_;
  ASSIGN_OR_RETURN(Tensor logits, runner_->Forward(step));
  if (!reports_) return StepOutput{};
  return SampleStep(step, std::move(logits));
}

TestCluster::TestCluster(const WeightSource& source, ClusterOptions options,
                         absl::Duration comm_timeout, ControlTls tls)
    : source_(source), service_(options), tls_(std::move(tls)) {
  // Rank index (p * cp + c) * tp + t (PlaceOfRank).
  const int tp = options.tp, pp = options.pp, cp = options.cp;
  const auto index = [&](int p, int c, int t) { return (p * cp + c) * tp + t; };
  const auto cp_name = [&](int c) {
    return cp > 1 ? absl::StrCat(" cp ", c) : std::string();
  };
  comms_.resize(tp * pp * cp);
  if (tp > 1) {
    for (int p = 0; p < pp; ++p) {
      for (int c = 0; c < cp; ++c) {
        auto g =
            MakeFakeGroup(tp, absl::StrCat("tp group of stage ", p, cp_name(c)),
                          {.timeout = comm_timeout});
        for (int t = 0; t < tp; ++t) {
          comms_[index(p, c, t)].tp = g[t].get();
          owned_.push_back(std::move(g[t]));
        }
      }
    }
  }
  if (cp > 1) {
    for (int p = 0; p < pp; ++p) {
      for (int t = 0; t < tp; ++t) {
        auto g =
            MakeFakeGroup(cp, absl::StrCat("cp group of stage ", p, " tp ", t),
                          {.timeout = comm_timeout});
        for (int c = 0; c < cp; ++c) {
          comms_[index(p, c, t)].cp = g[c].get();
          owned_.push_back(std::move(g[c]));
        }
      }
    }
  }
  if (pp > 1) {
    for (int c = 0; c < cp; ++c) {
      for (int t = 0; t < tp; ++t) {
        auto g =
            MakeFakeGroup(pp, absl::StrCat("pp chain of tp ", t, cp_name(c)),
                          {.timeout = comm_timeout});
        for (int p = 0; p < pp; ++p) {
          comms_[index(p, c, t)].pp = g[p].get();
          owned_.push_back(std::move(g[p]));
        }
      }
    }
  }
  for (int r = 1; r <= tp * pp * cp; ++r) {
    hosts_.push_back(std::make_unique<TestHost>(source, comms_[r - 1]));
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", ControlServerCredentials(tls_),
                           &port_);
  AddControlService(builder, &service_);
  server_ = builder.BuildAndStart();
  statuses_.resize(tp * pp * cp + 8);
}

std::string TestCluster::address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

WorkerAgentOptions TestCluster::AgentOptions(int rank) const {
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

void TestCluster::StartWorker(WorkerAgentOptions o, int host_rank) {
  const size_t slot = threads_.size();
  TestHost* host = hosts_[(host_rank ? host_rank : o.rank) - 1].get();
  threads_.emplace_back([this, o, host, slot] {
    SetCpuThreads(1);
    statuses_[slot] = RunWorkerAgent(o, *host);
  });
}

void TestCluster::StartAll() {
  for (int r = 1; r <= service_.num_workers(); ++r) {
    StartWorker(AgentOptions(r));
  }
}

std::vector<absl::Status> TestCluster::Stop() {
  if (stopped_) return statuses_;
  stopped_ = true;
  engines_.Close();
  service_.Shutdown("test done");
  for (std::thread& t : threads_) t.join();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server_->Wait();
  statuses_.resize(threads_.size());
  return statuses_;
}

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

void ExpectUnavailable(const absl::Status& s, const std::string& who) {
  std::printf("%s\n", s.ToString().c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), who)) << s;
}

}  // namespace shardlm::cluster_testing
