#include "worker/worker_agent.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "core/log.h"
#include "core/process_memory.h"
#include "core/status.h"
#include "grpcpp/grpcpp.h"
#include "model/shard_plan.h"
#include "shardlm/v1/control.grpc.pb.h"
#include "step/step_codec.h"

namespace shardlm {
namespace {

std::chrono::system_clock::time_point ToChrono(absl::Time t) {
  return absl::ToChronoTime(t);
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

// Why `address` (host:port, [v6]:port) may be unreachable, when the cause
// is plain: its host name does not resolve here. Else "".
std::string ResolveHint(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc == 0) {
    freeaddrinfo(found);
    return "";
  }
  return absl::StrCat(" (the name '", host, "' does not resolve on ",
                      HostName(), ": ", gai_strerror(rc),
                      "; the coordinator's --advertise-address sets what "
                      "workers dial)");
}

// One stream's life. Threads: the caller's (handles messages: load, steps),
// a reader (queues what arrives) and a watchdog (heartbeats, coordinator
// silence, the stop notification).
class AgentSession {
 public:
  AgentSession(const WorkerAgentOptions& o, ShardHost& host,
               std::shared_ptr<grpc::Channel> channel)
      : o_(o), host_(host), stub_(v1::Control::NewStub(channel)) {}

  absl::Status Run() {
    // Checked by the coordinator before it reads the Register below.
    context_.AddMetadata(kClusterTokenMetadata, o_.cluster_token);
    stream_ = stub_->Connect(&context_);
    {
      absl::MutexLock lock(&mu_);
      last_read_ = absl::Now();
    }
    v1::WorkerMessage reg;
    v1::Register& r = *reg.mutable_register_();
    r.set_rank(o_.rank);
    r.set_host(HostName());
    r.set_pid(getpid());
    r.set_model_path(o_.model_path);
    r.set_model_bytes(o_.model_bytes);
    r.set_model_digest(o_.model_digest);
    r.set_cluster_token(o_.cluster_token);
    r.set_device(o_.device);
    r.set_gpu_uuid(o_.gpu_uuid);
    r.set_gpu_ordinal(o_.gpu_ordinal);
    Write(reg);  // A failure shows up as the stream ending.
    reader_ = std::thread([this] { ReadLoop(); });
    watchdog_ = std::thread([this] { Watchdog(); });
    absl::Status status = Serve();
    Stop();
    return status;
  }

 private:
  absl::Status Serve() {
    bool loaded = false;
    BlockTableMirror tables;
    while (true) {
      std::optional<v1::CoordinatorMessage> msg = Next();
      if (!msg.has_value()) return Lost();
      switch (msg->msg_case()) {
        case v1::CoordinatorMessage::kAssignment: {
          if (loaded) {
            return absl::InternalError(
                absl::StrCat("coordinator at ", o_.coordinator,
                             " assigned rank ", o_.rank, " twice"));
          }
          const v1::Assignment& a = msg->assignment();
          const absl::StatusOr<KvPoolConfig> blocks =
              [&]() -> absl::StatusOr<KvPoolConfig> {
            ASSIGN_OR_RETURN(const KvCacheOptions kv,
                             DecodeKvCacheOptions(a.kv()));
            ASSIGN_OR_RETURN(const BatchLimits limits,
                             DecodeBatchLimits(a.limits()));
            ASSIGN_OR_RETURN(
                MoeSharding moe,
                ParseMoeSharding(a.moe_sharding().empty() ? "auto"
                                                          : a.moe_sharding()));
            ASSIGN_OR_RETURN(
                PpBalance balance,
                ParsePpBalance(a.pp_balance().empty() ? "decode"
                                                      : a.pp_balance()));
            ASSIGN_OR_RETURN(
                const Precision precision,
                ParsePrecision(a.precision().empty() ? "exact"
                                                     : a.precision()));
            return host_.Load(
                {.kv = kv,
                 .limits = limits,
                 .tp = a.tp(),
                 .pp = a.pp(),
                 .tp_rank = a.tp_rank(),
                 .pp_rank = a.pp_rank(),
                 .cp = std::max(1, a.cp()),
                 .cp_rank = a.cp_rank(),
                 .threads = a.threads(),
                 .rendezvous_prefix = a.rendezvous_prefix(),
                 .step_timeout = absl::Milliseconds(a.step_timeout_ms()),
                 .moe_sharding = moe,
                 .pp_balance = balance,
                 .batch_invariant = a.batch_invariant(),
                 .precision = precision});
          }();
          v1::WorkerMessage out;
          if (!blocks.ok()) {
            out.mutable_failure()->set_message(
                std::string(blocks.status().message()));
            out.mutable_failure()->set_code(
                static_cast<int>(blocks.status().code()));
            Write(out);
            CloseWrites();
            return blocks.status();
          }
          loaded = true;
          const int cp = std::max(1, a.cp());
          reports_ = SamplingShard(a.tp(), a.pp(), cp) ==
                     RankIndex({.tp_rank = a.tp_rank(),
                                .cp_rank = a.cp_rank(),
                                .pp_rank = a.pp_rank()},
                               a.tp(), cp);
          out.mutable_ready()->set_kv_blocks(blocks->num_blocks);
          out.mutable_ready()->set_host_kv_blocks(blocks->num_host_blocks);
          out.mutable_ready()->set_kv_block_bytes(blocks->BytesPerBlock());
          out.mutable_ready()->set_weight_bytes(host_.weight_bytes());
          Write(out);
          break;
        }
        case v1::CoordinatorMessage::kPlan: {
          const v1::StepPlan& plan = msg->plan();
          v1::WorkerMessage out;
          v1::StepResult& result = *out.mutable_result();
          result.set_step_id(plan.step_id());
          SetInStep(true);
          absl::StatusOr<StepOutput> step =
              loaded ? host_.Step(DecodeStepPlan(plan, tables))
                     : absl::FailedPreconditionError(
                           "step before the shard was loaded");
          SetInStep(false, host_.stats());
          if (!step.ok()) {
            result.set_error(std::string(step.status().message()));
            result.set_error_code(static_cast<int>(step.status().code()));
          } else if (reports_) {
            result.mutable_tokens()->Add(step->tokens.begin(),
                                         step->tokens.end());
            if (plan.return_logits() && step->logits.numel() > 0) {
              absl::Span<float> l = step->logits.f32();
              result.mutable_logits()->Add(l.begin(), l.end());
            }
            for (const TokenLogprobs& lp : step->logprobs) {
              v1::RowLogprobs& row = *result.add_logprobs();
              row.set_sampled(lp.sampled);
              for (const TokenLogprob& t : lp.top) {
                row.add_top_tokens(t.token);
                row.add_top_logprobs(t.logprob);
              }
            }
          }
          Write(out);
          break;
        }
        case v1::CoordinatorMessage::kShutdown:
          CloseWrites();
          if (msg->shutdown().rejoin()) {
            return absl::AbortedError(
                absl::StrCat("the coordinator at ", o_.coordinator,
                             " asked to rejoin: ", msg->shutdown().reason()));
          }
          if (msg->shutdown().cluster_failed()) {
            return absl::UnavailableError(
                absl::StrCat("the coordinator at ", o_.coordinator,
                             " ended the cluster: ", msg->shutdown().reason()));
          }
          return absl::OkStatus();
        default:
          break;
      }
    }
  }

  // The stream ended without Shutdown: why, naming the coordinator.
  absl::Status Lost() {
    std::string why;
    {
      absl::MutexLock lock(&mu_);
      why = abort_reason_;
    }
    if (o_.stop != nullptr && o_.stop->HasBeenNotified()) {
      return absl::CancelledError(
          absl::StrCat("worker rank ", o_.rank,
                       " stopped; left the coordinator at ", o_.coordinator));
    }
    if (!why.empty()) {
      return absl::UnavailableError(
          absl::StrCat("lost the coordinator at ", o_.coordinator, ": ", why));
    }
    JoinReader();
    const grpc::Status s = stream_->Finish();
    finished_ = true;
    if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED &&
        s.error_code() != grpc::StatusCode::UNAVAILABLE) {
      // The coordinator refused us (bad rank, differing model files...).
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("coordinator at ", o_.coordinator,
                                       " ended the stream of rank ", o_.rank,
                                       ": ", s.error_message()));
    }
    return absl::UnavailableError(absl::StrCat(
        "lost the coordinator at ", o_.coordinator, ": stream closed",
        s.ok() ? "" : absl::StrCat(" (", s.error_message(), ")")));
  }

  void Write(const v1::WorkerMessage& msg) {
    absl::MutexLock lock(&write_mu_);
    if (writes_closed_) return;
    stream_->Write(msg);
  }

  void CloseWrites() {
    absl::MutexLock lock(&write_mu_);
    if (writes_closed_) return;
    writes_closed_ = true;
    stream_->WritesDone();
  }

  // The next message other than a heartbeat; nullopt when the stream ended.
  std::optional<v1::CoordinatorMessage> Next() {
    absl::MutexLock lock(&mu_);
    const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !inbox_.empty() || read_done_;
    };
    mu_.Await(absl::Condition(&ready));
    if (inbox_.empty()) return std::nullopt;
    v1::CoordinatorMessage msg = std::move(inbox_.front());
    inbox_.pop_front();
    return msg;
  }

  void SetInStep(bool in_step,
                 std::optional<RunnerStats> stats = std::nullopt) {
    absl::MutexLock lock(&mu_);
    in_step_ = in_step;
    if (stats) stats_ = *stats;
  }

  // A heartbeat with this process's memory and the step figures as of the
  // last step.
  v1::WorkerMessage Heartbeat() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::WorkerMessage msg;
    v1::Heartbeat& h = *msg.mutable_heartbeat();
    h.set_resident_bytes(ResidentMemoryBytes());
    h.set_memory_limit_bytes(CgroupMemoryLimitBytes().value_or(0));
    h.set_steps(stats_.steps);
    h.set_step_seconds(stats_.forward_seconds);
    h.set_comm_seconds(stats_.comm_seconds);
    h.set_copy_seconds(stats_.copy_seconds);
    h.set_copied_blocks(stats_.copied_blocks);
    h.set_expert_begin(stats_.expert_begin);
    for (int64_t t : stats_.expert_tokens) h.add_expert_tokens(t);
    return msg;
  }

  void ReadLoop() {
    v1::CoordinatorMessage msg;
    while (stream_->Read(&msg)) {
      absl::MutexLock lock(&mu_);
      last_read_ = absl::Now();
      if (msg.has_shutdown()) {
        shutdown_reason_ = msg.shutdown().reason();
        if (shutdown_reason_.empty()) shutdown_reason_ = "shutdown";
      }
      if (!msg.has_heartbeat()) inbox_.push_back(std::move(msg));
    }
    absl::MutexLock lock(&mu_);
    read_done_ = true;
  }

  void Watchdog() {
    const absl::Duration tick =
        std::max(absl::Milliseconds(5),
                 std::min(o_.heartbeat_interval, o_.coordinator_timeout / 4));
    absl::Time last_heartbeat = absl::InfinitePast();
    mu_.Lock();
    while (!stop_watchdog_) {
      mu_.AwaitWithTimeout(absl::Condition(&stop_watchdog_), tick);
      if (stop_watchdog_) continue;
      const absl::Time now = absl::Now();
      MaybeAbandonStep(now);
      if (read_done_) continue;
      if (o_.stop != nullptr && o_.stop->HasBeenNotified()) {
        abort_reason_ = "stopped";
        context_.TryCancel();
        continue;
      }
      if (now - last_read_ > o_.coordinator_timeout) {
        abort_reason_ = absl::StrCat(
            "no message for ", absl::FormatDuration(o_.coordinator_timeout));
        context_.TryCancel();
        continue;
      }
      // Every heartbeat_interval, also while results flow: heartbeats
      // carry the figures /metrics shows.
      if (now - last_heartbeat < o_.heartbeat_interval) continue;
      const v1::WorkerMessage heartbeat = Heartbeat();
      mu_.Unlock();
      // Never wait behind a write blocked on a stalled stream.
      if (write_mu_.TryLock()) {
        if (!writes_closed_) {
          last_heartbeat = now;
          stream_->Write(heartbeat);
        }
        write_mu_.Unlock();
      }
      mu_.Lock();
    }
    mu_.Unlock();
  }

  // A step cannot be interrupted (it may wait in a collective for a peer
  // that is gone), so when the stream has ended (Shutdown, cancelled, the
  // coordinator silent) while one runs, the agent waits abandon_grace for
  // it and then hands over to on_abandon, which ends the process.
  void MaybeAbandonStep(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool ended =
        !shutdown_reason_.empty() || !abort_reason_.empty() || read_done_;
    if (!in_step_ || !ended || abandoned_ || !o_.on_abandon) {
      stuck_since_ = absl::InfiniteFuture();
      return;
    }
    if (stuck_since_ == absl::InfiniteFuture()) stuck_since_ = now;
    if (now - stuck_since_ < o_.abandon_grace) return;
    abandoned_ = true;
    const std::string why = !shutdown_reason_.empty() ? shutdown_reason_
                            : !abort_reason_.empty()  ? abort_reason_
                                                      : "stream closed";
    o_.on_abandon(absl::StrCat(
        "worker rank ", o_.rank, ": a step still waits on its peers ",
        absl::FormatDuration(o_.abandon_grace), " after the coordinator at ",
        o_.coordinator, " ended the stream (", why, "); abandoning it"));
  }

  void JoinReader() {
    if (reader_.joinable()) reader_.join();
  }

  // Ends the stream (writes closed, the coordinator given a few seconds to
  // close its side, else cancelled) and joins the threads.
  void Stop() {
    CloseWrites();
    {
      absl::MutexLock lock(&mu_);
      if (!mu_.AwaitWithTimeout(absl::Condition(&read_done_),
                                absl::Seconds(5))) {
        context_.TryCancel();
      }
      stop_watchdog_ = true;
    }
    JoinReader();
    watchdog_.join();
    if (!finished_) stream_->Finish();
  }

  const WorkerAgentOptions& o_;
  ShardHost& host_;
  std::unique_ptr<v1::Control::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>>
      stream_;
  std::thread reader_, watchdog_;
  bool reports_ = false;   // Last stage, TP rank 0: returns tokens.
  bool finished_ = false;  // Finish() was called.

  absl::Mutex write_mu_;
  bool writes_closed_ ABSL_GUARDED_BY(write_mu_) = false;

  // Waiters wait on conditions over these (Mutex::Await), re-checked
  // whenever the mutex is released.
  absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> inbox_ ABSL_GUARDED_BY(mu_);
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_watchdog_ ABSL_GUARDED_BY(mu_) = false;
  bool in_step_ ABSL_GUARDED_BY(mu_) = false;
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time stuck_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::string shutdown_reason_ ABSL_GUARDED_BY(mu_);
  RunnerStats stats_ ABSL_GUARDED_BY(mu_);  // As of the last step.
  absl::Time last_read_ ABSL_GUARDED_BY(mu_);
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status RunWorkerAgent(const WorkerAgentOptions& options,
                            ShardHost& host) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Retry often while the coordinator comes up.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::Channel> channel =
      NewControlChannel(options.coordinator, options.tls, args);
  // Say what this worker waits for after a second, then every 10 s (pods
  // start in any order).
  const absl::Time give_up = absl::Now() + options.connect_timeout;
  bool connected = false;
  for (absl::Duration wait = absl::Seconds(1);
       !connected && absl::Now() < give_up; wait = absl::Seconds(10)) {
    connected = channel->WaitForConnected(
        ToChrono(std::min(give_up, absl::Now() + wait)));
    if (!connected && absl::Now() < give_up) {
      Log("worker rank %d: waiting for the coordinator at "
          "%s (%s left)%s",
          options.rank, options.coordinator.c_str(),
          absl::FormatDuration(
              absl::Trunc(give_up - absl::Now(), absl::Seconds(1)))
              .c_str(),
          ResolveHint(options.coordinator).c_str());
    }
  }
  if (!connected) {
    return absl::UnavailableError(
        absl::StrCat("worker rank ", options.rank,
                     " cannot reach the coordinator at ", options.coordinator,
                     " within ", absl::FormatDuration(options.connect_timeout),
                     ResolveHint(options.coordinator),
                     ControlHandshakeHint(options.coordinator, options.tls)));
  }
  AgentSession session(options, host, std::move(channel));
  return session.Run();
}

namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

void Fnv(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
}

// Hashes the size and the first and last MiB of `path` into `h`.
absl::Status HashFile(const std::filesystem::path& path, uint64_t size,
                      uint64_t& h) {
  constexpr uint64_t kMiB = 1 << 20;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open model file ", path.string()));
  }
  Fnv(h, &size, sizeof(size));
  std::vector<char> buf(std::min(size, kMiB));
  const uint64_t tail = size > kMiB ? std::max(kMiB, size - kMiB) : size;
  for (uint64_t offset : {uint64_t{0}, tail}) {
    const uint64_t n = std::min(kMiB, size - offset);
    if (n == 0) continue;
    in.seekg(static_cast<std::streamoff>(offset));
    if (!in.read(buf.data(), static_cast<std::streamsize>(n))) {
      return absl::DataLossError(
          absl::StrCat("cannot read model file ", path.string()));
    }
    Fnv(h, buf.data(), n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ModelDigest(const std::string& model_path,
                                        uint64_t* bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path root(model_path);
  std::vector<fs::path> files;
  if (fs::is_directory(root, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
      const fs::path& p = e.path();
      if (e.is_regular_file() &&
          (p.extension() == ".safetensors" || p.filename() == "config.json")) {
        files.push_back(p);
      }
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      return absl::NotFoundError(absl::StrCat(
          "no *.safetensors or config.json in model directory ", model_path));
    }
  } else if (fs::is_regular_file(root, ec)) {
    files.push_back(root);
  } else {
    return absl::NotFoundError(absl::StrCat("no model at ", model_path));
  }
  uint64_t h = kFnvOffset, total = 0;
  for (const fs::path& p : files) {
    const uint64_t size = fs::file_size(p, ec);
    if (ec) {
      return absl::NotFoundError(
          absl::StrCat("cannot stat model file ", p.string()));
    }
    const std::string name = p.filename().string();
    Fnv(h, name.data(), name.size());
    RETURN_IF_ERROR(HashFile(p, size, h));
    total += size;
  }
  *bytes = total;
  return absl::StrFormat("%016x", h);
}

}  // namespace shardlm
