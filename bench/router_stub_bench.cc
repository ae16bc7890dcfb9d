// The router's own ceiling (issue #36, bench/router_stub.py drives it): a
// stub replica that answers at once, and a closed-loop gRPC load generator.
//
//   router_stub_bench stub --listen 127.0.0.1:PORT
//     shardlm.v1.Inference (GetModelInfo; Generate: one response with one
//     token and finish_reason "length", at once) and
//     shardlm.v1.ReplicaState/WatchState (ready, idle; every 250 ms), until
//     SIGINT/SIGTERM.
//   router_stub_bench load --target ADDR --concurrency C --seconds S
//     [--channels N] [--prompt-tokens T]
//     C threads each send Generate calls one after another for S seconds
//     (after a 1 s warm-up); prints one JSON line: requests, errors,
//     requests/s, latency p50/p90/p99/max in microseconds. Exits 1 when any
//     call failed or the stream was not the stub's one response.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"
#include "launch/flags.h"
#include "nlohmann/json.hpp"
#include "shardlm/v1/inference.grpc.pb.h"
#include "shardlm/v1/replica_state.grpc.pb.h"

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

class Stub final : public v1::Inference::Service,
                   public v1::ReplicaState::Service {
 public:
  grpc::Status GetModelInfo(grpc::ServerContext*,
                            const v1::GetModelInfoRequest*,
                            v1::ModelInfo* info) override {
    info->set_name("router-stub");
    info->set_context_length(8192);
    info->set_block_size(16);
    return grpc::Status::OK;
  }
  grpc::Status Generate(
      grpc::ServerContext*, const v1::GenerateRequest* request,
      grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    v1::GenerateResponse r;
    r.add_token_ids(1);
    r.set_text("x");
    r.set_finish_reason("length");
    r.mutable_usage()->set_prompt_tokens(request->prompt_token_ids_size());
    r.mutable_usage()->set_completion_tokens(1);
    writer->WriteLast(r, grpc::WriteOptions());
    return grpc::Status::OK;
  }
  grpc::Status WatchState(
      grpc::ServerContext* context, const v1::WatchStateRequest*,
      grpc::ServerWriter<v1::ReplicaStateUpdate>* writer) override {
    v1::ReplicaStateUpdate u;
    u.set_ready(true);
    u.set_block_size(16);
    u.set_kv_total_blocks(1000);
    u.set_reset(true);
    while (!context->IsCancelled() && !stopping.load()) {
      if (!writer->Write(u)) break;
      u.set_reset(false);
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return grpc::Status::OK;
  }
  std::atomic<bool> stopping{false};
};

int RunStub(const std::string& listen) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  Stub stub;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  b.RegisterService(static_cast<v1::Inference::Service*>(&stub));
  b.RegisterService(static_cast<v1::ReplicaState::Service*>(&stub));
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "router_stub_bench stub: cannot listen on %s\n",
                 listen.c_str());
    return 1;
  }
  std::fprintf(stderr, "[stub] on port %d\n", port);
  int sig = 0;
  sigwait(&stop, &sig);
  stub.stopping = true;
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(500));
  return 0;
}

int RunLoad(const std::string& target, int concurrency, double seconds,
            int channels, int prompt_tokens) {
  std::vector<std::shared_ptr<grpc::Channel>> chans;
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments args;
    // Separate connections, not one shared subchannel.
    args.SetInt("shardlm.bench.channel", i);
    chans.push_back(grpc::CreateCustomChannel(
        target, grpc::InsecureChannelCredentials(), args));
    if (!chans.back()->WaitForConnected(std::chrono::system_clock::now() +
                                        std::chrono::seconds(10))) {
      std::fprintf(stderr, "router_stub_bench load: %s not reachable in 10 s\n",
                   target.c_str());
      return 1;
    }
  }
  v1::GenerateRequest req;
  for (int i = 0; i < prompt_tokens; ++i) req.add_prompt_token_ids(i % 1000);
  req.set_max_tokens(1);
  std::atomic<bool> measuring{false}, done{false};
  std::atomic<int64_t> errors{0}, bad{0};
  std::vector<std::vector<int64_t>> latencies(concurrency);  // Microseconds.
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&, t] {
      auto stub = v1::Inference::NewStub(chans[t % chans.size()]);
      std::vector<int64_t>& mine = latencies[t];
      mine.reserve(1 << 16);
      while (!done.load(std::memory_order_relaxed)) {
        const Clock::time_point start = Clock::now();
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
        auto reader = stub->Generate(&ctx, req);
        v1::GenerateResponse r;
        int n = 0;
        bool last = false;
        while (reader->Read(&r)) {
          ++n;
          last = r.finish_reason() == "length";
        }
        const grpc::Status s = reader->Finish();
        const int64_t us =
            std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() -
                                                                  start)
                .count();
        if (!measuring.load(std::memory_order_relaxed)) continue;
        if (!s.ok()) {
          if (errors++ == 0) {
            std::fprintf(stderr, "first error: %s\n",
                         s.error_message().c_str());
          }
        } else if (n != 1 || !last) {
          ++bad;
        } else {
          mine.push_back(us);
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));  // Warm-up.
  measuring = true;
  const Clock::time_point t0 = Clock::now();
  std::this_thread::sleep_for(
      std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
  measuring = false;
  const double elapsed =
      std::chrono::duration<double>(Clock::now() - t0).count();
  done = true;
  for (std::thread& t : threads) t.join();
  std::vector<int64_t> all;
  for (const auto& v : latencies) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  const auto pct = [&all](double p) -> int64_t {
    if (all.empty()) return 0;
    return all[std::min(
        all.size() - 1,
        static_cast<size_t>(p * static_cast<double>(all.size())))];
  };
  nlohmann::json out = {{"target", target},
                        {"concurrency", concurrency},
                        {"channels", channels},
                        {"seconds", elapsed},
                        {"requests", all.size()},
                        {"errors", errors.load()},
                        {"malformed", bad.load()},
                        {"rps", static_cast<double>(all.size()) / elapsed},
                        {"p50_us", pct(0.50)},
                        {"p90_us", pct(0.90)},
                        {"p99_us", pct(0.99)},
                        {"max_us", all.empty() ? 0 : all.back()}};
  std::printf("%s\n", out.dump().c_str());
  return (errors.load() == 0 && bad.load() == 0 && !all.empty()) ? 0 : 1;
}

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) {
  using shardlm::FlagSet;
  const std::string mode = argc > 1 ? argv[1] : "";
  std::string listen = "127.0.0.1:0", target;
  int64_t concurrency = 1, channels = 0, prompt_tokens = 32;
  double seconds = 5;
  FlagSet flags(
      "usage: router_stub_bench stub --listen HOST:PORT\n"
      "       router_stub_bench load --target HOST:PORT --concurrency C "
      "--seconds S");
  flags.Add("listen", &listen, "stub: address to serve");
  flags.Add("target", &target, "load: the router's or a stub's address");
  flags.Add("concurrency", &concurrency, "load: calls in flight");
  flags.Add("seconds", &seconds, "load: measured seconds (after 1 s warm-up)");
  flags.Add("channels", &channels,
            "load: gRPC channels (0: one per 8 threads)");
  flags.Add("prompt-tokens", &prompt_tokens,
            "load: prompt_token_ids per request (kv routing hashes them)");
  if (mode != "stub" && mode != "load") {
    std::fprintf(stderr, "%s\n", flags.Usage().c_str());
    return 2;
  }
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "router_stub_bench: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  if (mode == "stub") return shardlm::RunStub(listen);
  if (target.empty() || concurrency < 1 || concurrency > 4096 ||
      !(seconds > 0) || prompt_tokens < 0 || channels < 0) {
    std::fprintf(stderr,
                 "router_stub_bench load: give --target, --concurrency "
                 "1..4096, --seconds > 0\n");
    return 2;
  }
  if (channels == 0) channels = (concurrency + 7) / 8;
  return shardlm::RunLoad(target, static_cast<int>(concurrency), seconds,
                          static_cast<int>(channels),
                          static_cast<int>(prompt_tokens));
}
