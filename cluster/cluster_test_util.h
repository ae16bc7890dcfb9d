// The control plane end to end in one process, for the cluster tests
// (cluster_*_test.cc, worker_agent_test.cc): a real gRPC server with the
// ControlService on 127.0.0.1, worker agents on threads whose shards talk
// through fake communicators, and the helpers those tests share.
#ifndef SHARDLM_CLUSTER_CLUSTER_TEST_UTIL_H_
#define SHARDLM_CLUSTER_CLUSTER_TEST_UTIL_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cluster/control_service.h"
#include "collectives/communicator.h"
#include "engine/engine.h"
#include "engine/engine_leak_check.h"
#include "grpcpp/grpcpp.h"
#include "model/model_config.h"
#include "model/weight_source.h"
#include "step/control_channel.h"
#include "worker/model_runner.h"
#include "worker/worker_agent.h"

namespace shardlm::cluster_testing {

using Clock = std::chrono::steady_clock;

// Seconds since t.
double Since(Clock::time_point t);

// Polls `done` every 10 ms until it holds (true) or 30 s pass (false), so
// that a broken cluster fails the test instead of hanging it.
bool WaitFor(const std::function<bool()>& done);

// A small random Llama (4 layers, GQA 8 / 4, vocab 311).
ModelConfig RandomConfig();

// n token ids below `vocab`, different for each salt.
std::vector<int32_t> Prompt(int n, int salt, int vocab);

// A shard over fake communicators. Hooks let tests break it.
class TestHost : public ShardHost {
 public:
  TestHost(const WeightSource& source, ShardComms comms)
      : source_(source), comms_(comms) {}

  absl::StatusOr<KvPoolConfig> Load(const WorkerAssignment& a) override;
  absl::StatusOr<StepOutput> Step(const StepInput& step) override;

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
// on threads: the TP group of each stage (and CP rank), the CP group of
// each stage and TP index (ClusterOptions::cp > 1) and the PP chain of each
// TP (and CP) index joined by fake communicators, as in
// in_process_executor.cc.
class TestCluster {
 public:
  TestCluster(const WeightSource& source, ClusterOptions options,
              absl::Duration comm_timeout = absl::Seconds(30),
              ControlTls tls = {});
  ~TestCluster() { Stop(); }

  ControlService& service() { return service_; }
  // Engines over these workers (or any other engine of the test) live
  // until Stop(), which first checks that each got all its KV blocks back
  // and ends it while the workers still run.
  Engine* Keep(absl::StatusOr<std::unique_ptr<Engine>> engine) {
    return engines_.Keep(std::move(engine));
  }
  std::string address() const;
  TestHost& host(int rank) { return *hosts_[rank - 1]; }

  WorkerAgentOptions AgentOptions(int rank) const;

  // Runs an agent for `rank` on a thread, with the host of `host_rank`.
  void StartWorker(WorkerAgentOptions o, int host_rank = 0);
  void StartAll();

  // Closes the kept engines (the leak check), shuts the workers down,
  // joins them and stops the server. Returns the agents' statuses in start
  // order.
  std::vector<absl::Status> Stop();

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

// A tp x pp cluster's options with short heartbeats and timeouts.
ClusterOptions Options(int tp, int pp);

// Eight requests of different lengths, with prompt logits and logprobs.
std::vector<GenerateRequest> Requests(int max_tokens);

// `s` is UNAVAILABLE and names `who`.
void ExpectUnavailable(const absl::Status& s, const std::string& who);

}  // namespace shardlm::cluster_testing

#endif  // SHARDLM_CLUSTER_CLUSTER_TEST_UTIL_H_
