#include "cluster/control_service.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/log.h"
#include "core/secret.h"
#include "core/status.h"
#include "grpcpp/resource_quota.h"
#include "step/step_codec.h"

namespace shardlm {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

std::string Who(const v1::Register& reg) {
  return absl::StrCat(reg.host(), ":", reg.pid());
}

}  // namespace

struct ControlService::Worker {
  int rank = 0, tp_rank = 0, pp_rank = 0, cp_rank = 0;
  bool context_parallel = false;  // Whether Name() gives the CP rank.

  // Guarded by ControlService::mu_ (host .. digest are written once, when
  // the slot is claimed, and only read afterwards).
  State state = State::kEmpty;
  uint64_t generation = 0;  // Which claim of the slot this is.
  v1::Register reg;
  grpc::ServerContext* context = nullptr;  // While the handler runs.
  absl::Time last_seen;
  int64_t kv_blocks = 0;
  int64_t host_kv_blocks = 0;
  int64_t kv_block_bytes = 0, weight_bytes = 0;  // From Ready.
  v1::Heartbeat figures;                         // The latest heartbeat's.
  // Results of the steps in flight, by step id (at most a few).
  std::map<uint64_t, v1::StepResult> results;
  std::string reason;  // Why it is dead, naming it.

  // Serializes writes; the stream is set only while its handler runs.
  std::mutex write_mu;
  grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream =
      nullptr;
  absl::Time last_write;

  std::string Name() const {
    return absl::StrCat("worker rank ", rank, " (pp ", pp_rank, ", tp ",
                        tp_rank,
                        context_parallel ? absl::StrCat(", cp ", cp_rank) : "",
                        ") at ", Who(reg));
  }
};

ControlService::ControlService(ClusterOptions options)
    : options_(std::move(options)),
      rendezvous_prefix_(options_.rendezvous_prefix) {
  for (int r = 1; r <= num_workers(); ++r) {
    auto w = std::make_unique<Worker>();
    w->rank = r;
    const RankPlace place = PlaceOfRank(r - 1, options_.tp, options_.cp);
    w->tp_rank = place.tp_rank;
    w->cp_rank = place.cp_rank;
    w->pp_rank = place.pp_rank;
    w->context_parallel = options_.cp > 1;
    workers_.push_back(std::move(w));
  }
  watchdog_ = std::thread([this] { Watchdog(); });
}

ControlService::~ControlService() {
  {
    absl::MutexLock lock(&mu_);
    stop_watchdog_ = true;
  }
  watchdog_.join();
}

bool ControlService::Write(Worker& w, const v1::CoordinatorMessage& msg) {
  std::lock_guard<std::mutex> lock(w.write_mu);
  if (w.stream == nullptr) return false;
  w.last_write = absl::Now();
  return w.stream->Write(msg);
}

absl::StatusOr<ControlService::Worker*> ControlService::Claim(
    grpc::ServerContext* context, const v1::Register& reg) {
  if (shutdown_) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker rank ", reg.rank(), " at ", Who(reg),
                     ": the coordinator is shutting down"));
  }
  if (reg.rank() < 1 || reg.rank() > num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker at ", Who(reg), " registered as rank ", reg.rank(),
        ", but worker ranks are 1..", num_workers(), " (tp ", options_.tp,
        " x pp ", options_.pp,
        options_.cp > 1 ? absl::StrCat(" x cp ", options_.cp) : "", ")"));
  }
  Worker& w = *workers_[reg.rank() - 1];
  if (w.state != State::kEmpty) {
    return absl::AlreadyExistsError(
        absl::StrCat("worker at ", Who(reg), " registered as rank ", reg.rank(),
                     ", which worker at ", Who(w.reg), " already holds"));
  }
  const std::string device = reg.device().empty() ? "cpu" : reg.device();
  if (device != options_.device) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker rank ", reg.rank(), " at ", Who(reg), " runs on ",
                     device, " but this cluster's workers run on ",
                     options_.device, " (the coordinator's --device)"));
  }
  if (!reg.gpu_uuid().empty() && !options_.allow_shared_gpu) {
    for (const auto& other : workers_) {
      if (other->state == State::kEmpty ||
          other->reg.gpu_uuid() != reg.gpu_uuid()) {
        continue;
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "worker rank ", reg.rank(), " at ", Who(reg), " and worker rank ",
          other->reg.rank(), " at ", Who(other->reg), " both use GPU ",
          reg.gpu_uuid(), " (cuda:", reg.gpu_ordinal(),
          "); give each worker a GPU of its own (one worker per GPU on each "
          "host, or CUDA_VISIBLE_DEVICES)"));
    }
  }
  if (first_rank_ != 0) {
    const v1::Register& ref = workers_[first_rank_ - 1]->reg;
    if (ref.model_bytes() != reg.model_bytes() ||
        ref.model_digest() != reg.model_digest()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model files differ between workers: rank ", reg.rank(), " at ",
          Who(reg), " has '", reg.model_path(), "' (", reg.model_bytes(),
          " bytes, digest ", reg.model_digest(), ") but rank ", first_rank_,
          " at ", Who(ref), " has '", ref.model_path(), "' (",
          ref.model_bytes(), " bytes, digest ", ref.model_digest(), ")"));
    }
  } else {
    first_rank_ = reg.rank();
  }
  w.reg = reg;
  w.generation = ++claims_;
  w.state = State::kLoading;
  w.context = context;
  w.last_seen = absl::Now();
  return &w;
}

void ControlService::StartupFailed(absl::Status status) {
  if (startup_error_.ok()) startup_error_ = std::move(status);
  cv_.SignalAll();
}

void ControlService::MarkDead(Worker& w, const std::string& reason,
                              absl::StatusCode code) {
  if (w.state == State::kDead || w.state == State::kDone) return;
  const bool was_loading = w.state == State::kLoading;
  w.state = State::kDead;
  w.reason = absl::StrCat(w.Name(), ": ", reason);
  if (first_dead_.empty()) first_dead_ = w.reason;
  if (!started_) {
    StartupFailed(absl::Status(
        code, was_loading ? absl::StrCat(w.reason, " (before it was ready)")
                          : w.reason));
  }
  if (w.context != nullptr) w.context->TryCancel();
  cv_.SignalAll();
}

bool ControlService::Authorized(const grpc::ServerContext& context) const {
  if (options_.cluster_token.empty()) return true;
  const auto [first, last] =
      context.client_metadata().equal_range(kClusterTokenMetadata);
  if (first == last || std::next(first) != last) return false;
  return ConstantTimeEquals(
      absl::string_view(first->second.data(), first->second.size()),
      options_.cluster_token);
}

absl::StatusOr<ControlService::Joined> ControlService::Join(
    grpc::ServerContext* context, const v1::WorkerMessage& in) {
  if (!in.has_register_()) {
    return absl::InvalidArgumentError(
        "the first message of a worker must be Register");
  }
  // A stream without the token is a stranger (or a worker of another
  // cluster): refused, and it does not fail this cluster's startup.
  if (!options_.cluster_token.empty() &&
      !ConstantTimeEquals(in.register_().cluster_token(),
                          options_.cluster_token)) {
    return absl::UnauthenticatedError("wrong or missing cluster token");
  }
  absl::MutexLock lock(&mu_);
  // A replacement arriving while the cluster re-forms, or before the
  // coordinator has begun to (its rank still dead), waits for it.
  const int rank = in.register_().rank();
  const auto wait_for_reform = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reforming_) return true;
    return options_.rejoin && started_ && !shutdown_ && rank >= 1 &&
           rank <= num_workers() && workers_[rank - 1]->state == State::kDead;
  };
  while (wait_for_reform() && !context->IsCancelled()) {
    cv_.WaitWithTimeout(&mu_, absl::Seconds(1));
  }
  absl::StatusOr<Worker*> claimed = Claim(context, in.register_());
  if (!claimed.ok()) {
    if (!started_) StartupFailed(claimed.status());
    return claimed.status();
  }
  return Joined{.worker = *claimed,
                .generation = (*claimed)->generation,
                .rendezvous_prefix = rendezvous_prefix_};
}

void ControlService::Assign(Worker& w, const std::string& rendezvous_prefix) {
  v1::CoordinatorMessage out;
  v1::Assignment& a = *out.mutable_assignment();
  a.set_tp(options_.tp);
  a.set_pp(options_.pp);
  a.set_moe_sharding(MoeShardingName(options_.moe_sharding));
  a.set_pp_balance(PpBalanceName(options_.pp_balance));
  a.set_batch_invariant(options_.batch_invariant);
  a.set_precision(PrecisionName(options_.precision));
  a.set_tp_rank(w.tp_rank);
  a.set_pp_rank(w.pp_rank);
  a.set_cp(options_.cp);
  a.set_cp_rank(w.cp_rank);
  EncodeKvCacheOptions(options_.kv, a.mutable_kv());
  EncodeBatchLimits(options_.limits, a.mutable_limits());
  a.set_threads(options_.threads_per_worker);
  a.set_rendezvous_prefix(rendezvous_prefix);
  a.set_step_timeout_ms(absl::ToInt64Milliseconds(options_.step_timeout));
  if (!Write(w, out)) {
    absl::MutexLock lock(&mu_);
    MarkDead(w, "stream closed before its assignment");
  }
}

void ControlService::Receive(Worker& w, v1::WorkerMessage& in) {
  switch (in.msg_case()) {
    case v1::WorkerMessage::kReady: {
      if (w.state != State::kLoading) break;
      // Block counts size the coordinator's block manager: checked before
      // use (a pool of 2^40 blocks is no real worker's).
      constexpr int64_t kMaxBlocks = int64_t{1} << 40;
      const int64_t device = in.ready().kv_blocks();
      const int64_t host = in.ready().host_kv_blocks();
      if (device < 1 || device > kMaxBlocks || host < 0 || host > kMaxBlocks) {
        MarkDead(w,
                 absl::StrCat("reported ", device, " device and ", host,
                              " host KV blocks, outside [1, 2^40] and "
                              "[0, 2^40]"),
                 absl::StatusCode::kInvalidArgument);
        break;
      }
      w.state = State::kReady;
      w.kv_blocks = device;
      w.host_kv_blocks = host;
      w.kv_block_bytes = std::max<int64_t>(0, in.ready().kv_block_bytes());
      w.weight_bytes = std::max<int64_t>(0, in.ready().weight_bytes());
      // The load log: which rank (its CP index too) holds what.
      Log("%s loaded: %d device + %d host KV blocks (%.1f MiB on the "
          "device), %.0f MiB of weights",
          w.Name(), device, host,
          static_cast<double>(device * w.kv_block_bytes) / (1 << 20),
          static_cast<double>(w.weight_bytes) / (1 << 20));
      cv_.SignalAll();
      break;
    }
    case v1::WorkerMessage::kFailure: {
      const auto code = static_cast<absl::StatusCode>(in.failure().code());
      MarkDead(
          w, absl::StrCat("failed: ", in.failure().message()),
          code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code);
      break;
    }
    case v1::WorkerMessage::kResult:
      if (w.results.size() < 64) {  // Bounded: a worker may not flood.
        const uint64_t id = in.result().step_id();
        w.results[id] = std::move(*in.mutable_result());
      }
      cv_.SignalAll();
      break;
    case v1::WorkerMessage::kHeartbeat:
      w.figures = std::move(*in.mutable_heartbeat());
      break;
    default:
      MarkDead(w, "protocol error: unexpected message after Register");
      break;
  }
}

grpc::Status ControlService::Ended(Worker& w, uint64_t generation) {
  if (w.generation != generation) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the cluster re-formed without this stream");
  }
  w.context = nullptr;
  cv_.SignalAll();  // Reform waits for every stream to end.
  if (w.state == State::kLoading || w.state == State::kReady) {
    if (shutdown_) {
      w.state = State::kDone;
      cv_.SignalAll();
    } else {
      MarkDead(w, "stream closed");
    }
  }
  if (w.state == State::kDead) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, w.reason);
  }
  return grpc::Status::OK;
}

grpc::Status ControlService::Connect(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>*
        stream) {
  // Before the first Read: a stranger's first message (of any size) is
  // never buffered or parsed.
  if (!Authorized(*context)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "wrong or missing cluster token (call metadata)");
  }
  v1::WorkerMessage in;
  if (!stream->Read(&in)) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "stream closed before Register");
  }
  absl::StatusOr<Joined> joined = Join(context, in);
  if (!joined.ok()) return ToGrpc(joined.status());
  Worker& w = *joined->worker;
  {
    std::lock_guard<std::mutex> lock(w.write_mu);
    w.stream = stream;
  }
  Assign(w, joined->rendezvous_prefix);
  while (stream->Read(&in)) {
    absl::MutexLock lock(&mu_);
    if (w.generation != joined->generation) break;  // Re-formed without us.
    w.last_seen = absl::Now();
    Receive(w, in);
  }
  {
    std::lock_guard<std::mutex> lock(w.write_mu);
    if (w.stream == stream) w.stream = nullptr;
  }
  absl::MutexLock lock(&mu_);
  return Ended(w, joined->generation);
}

absl::Status ControlService::WaitUntilReady(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (true) {
    if (!startup_error_.ok()) return startup_error_;
    if (shutdown_) {
      return absl::FailedPreconditionError("the cluster was shut down");
    }
    std::vector<int> missing, loading;
    for (const auto& w : workers_) {
      if (w->state == State::kEmpty) missing.push_back(w->rank);
      if (w->state == State::kLoading) loading.push_back(w->rank);
    }
    if (missing.empty() && loading.empty()) {
      started_ = true;
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      std::string msg = absl::StrCat("waited ", absl::FormatDuration(timeout),
                                     " for ", num_workers(), " worker ranks:");
      if (!missing.empty()) {
        absl::StrAppend(&msg, " ranks ", absl::StrJoin(missing, ", "),
                        " never registered;");
      }
      if (!loading.empty()) {
        absl::StrAppend(&msg, " ranks ", absl::StrJoin(loading, ", "),
                        " registered but are still loading;");
      }
      msg.pop_back();
      return absl::DeadlineExceededError(msg);
    }
    cv_.WaitWithDeadline(&mu_, deadline);
  }
}

int64_t ControlService::min_kv_blocks() const {
  absl::MutexLock lock(&mu_);
  int64_t blocks = std::numeric_limits<int64_t>::max();
  for (const auto& w : workers_) {
    if (w->state != State::kReady) return 0;
    blocks = std::min(blocks, w->kv_blocks);
  }
  return blocks;
}

int64_t ControlService::min_host_kv_blocks() const {
  absl::MutexLock lock(&mu_);
  int64_t blocks = std::numeric_limits<int64_t>::max();
  for (const auto& w : workers_) {
    if (w->state != State::kReady) return 0;
    blocks = std::min(blocks, w->host_kv_blocks);
  }
  return workers_.empty() ? 0 : blocks;
}

absl::StatusOr<std::vector<v1::StepResult>> ControlService::RunStep(
    const v1::StepPlan& plan) {
  RETURN_IF_ERROR(SendStep(plan));
  return WaitStep(plan.step_id());
}

absl::Status ControlService::SendStep(const v1::StepPlan& plan) {
  {
    absl::MutexLock lock(&mu_);
    if (!first_dead_.empty()) return absl::UnavailableError(first_dead_);
    if (shutdown_) return absl::UnavailableError("the cluster is shut down");
    if (!started_) {
      return absl::FailedPreconditionError(
          "step before every worker was ready");
    }
    step_deadlines_[plan.step_id()] = absl::Now() + options_.step_timeout;
  }
  v1::CoordinatorMessage msg;
  *msg.mutable_plan() = plan;
  for (auto& w : workers_) {
    if (!Write(*w, msg)) {
      absl::MutexLock lock(&mu_);
      MarkDead(*w, absl::StrCat("stream closed while sending step ",
                                plan.step_id()));
      return absl::UnavailableError(w->reason);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::StepResult>> ControlService::WaitStep(
    uint64_t step_id) {
  absl::MutexLock lock(&mu_);
  const auto sent = step_deadlines_.find(step_id);
  if (sent == step_deadlines_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step_id, " was not sent"));
  }
  // From the send, or from now when later: a step in flight waits in the
  // first stage's queue behind the steps before it, so its time counts
  // from when it is waited for (the step before it done). A hang is still
  // seen within step_timeout of the step becoming the oldest.
  const absl::Time deadline =
      std::max(sent->second, absl::Now() + options_.step_timeout);
  step_deadlines_.erase(sent);
  const auto take = [&](Worker& w) -> std::optional<v1::StepResult> {
    auto it = w.results.find(step_id);
    if (it == w.results.end()) return std::nullopt;
    v1::StepResult r = std::move(it->second);
    w.results.erase(it);
    return r;
  };
  while (true) {
    // A lost rank first: its peers' errors (timeouts) follow from it.
    for (auto& w : workers_) {
      if (w->state == State::kDead) return absl::UnavailableError(w->reason);
      if (w->state != State::kReady) {
        return absl::UnavailableError(
            absl::StrCat(w->Name(), ": shut down during step ", step_id));
      }
    }
    size_t have = 0;
    for (auto& w : workers_) {
      auto it = w->results.find(step_id);
      if (it == w->results.end()) continue;
      if (!it->second.error().empty()) {
        auto code = static_cast<absl::StatusCode>(it->second.error_code());
        if (code == absl::StatusCode::kOk) code = absl::StatusCode::kInternal;
        absl::Status failed(code,
                            absl::StrCat(w->Name(), ": step ", step_id,
                                         " failed: ", it->second.error()));
        // A survivor's collective often fails (its peer's connection
        // reset) just before the coordinator sees that peer's stream end:
        // give the death a moment to show, so that the error names the
        // rank that was lost rather than the one that noticed.
        const absl::Time grace = absl::Now() + absl::Milliseconds(500);
        while (absl::Now() < grace) {
          for (auto& d : workers_) {
            if (d->state == State::kDead) {
              return absl::UnavailableError(d->reason);
            }
          }
          cv_.WaitWithDeadline(&mu_, grace);
        }
        return failed;
      }
      ++have;
    }
    if (have == workers_.size()) {
      std::vector<v1::StepResult> results;
      for (auto& w : workers_) results.push_back(*take(*w));
      return results;
    }
    if (absl::Now() >= deadline) {
      std::string first;
      for (auto& w : workers_) {
        if (w->results.contains(step_id)) continue;
        MarkDead(*w, absl::StrCat("no result for step ", step_id, " within ",
                                  absl::FormatDuration(options_.step_timeout)));
        if (first.empty()) first = w->reason;
      }
      return absl::UnavailableError(first);
    }
    cv_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::Status ControlService::Health() const {
  absl::MutexLock lock(&mu_);
  if (!first_dead_.empty()) return absl::UnavailableError(first_dead_);
  if (shutdown_) return absl::UnavailableError("the cluster is shut down");
  std::vector<int> waiting;
  for (const auto& w : workers_) {
    if (w->state != State::kReady) waiting.push_back(w->rank);
  }
  if (!waiting.empty()) {
    return absl::UnavailableError(absl::StrCat("waiting for worker ranks ",
                                               absl::StrJoin(waiting, ", ")));
  }
  return absl::OkStatus();
}

std::vector<RankReport> ControlService::Reports() const {
  std::vector<RankReport> out;
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  for (const auto& w : workers_) {
    RankReport r{.rank = w->rank, .up = w->state == State::kReady};
    if (w->state == State::kEmpty) {
      r.up = false;
      out.push_back(r);
      continue;
    }
    const v1::Heartbeat& h = w->figures;
    r.stats = {.steps = h.steps(),
               .forward_seconds = h.step_seconds(),
               .comm_seconds = h.comm_seconds(),
               .copied_blocks = h.copied_blocks(),
               .copy_seconds = h.copy_seconds()};
    // Bounded by what the worker holds; a worker that says more is
    // believed only up to 4096 experts.
    if (h.expert_tokens_size() <= 4096 && h.expert_begin() >= 0 &&
        h.expert_begin() <= (int64_t{1} << 20)) {
      r.stats.expert_begin = h.expert_begin();
      r.stats.expert_tokens.assign(h.expert_tokens().begin(),
                                   h.expert_tokens().end());
    }
    if (h.resident_bytes() > 0) r.resident_bytes = h.resident_bytes();
    if (h.memory_limit_bytes() > 0) {
      r.memory_limit_bytes = h.memory_limit_bytes();
    }
    r.heartbeat_age_seconds = absl::ToDoubleSeconds(now - w->last_seen);
    r.weight_bytes = w->weight_bytes;
    r.kv_bytes = w->kv_blocks * w->kv_block_bytes;
    r.host_kv_bytes = w->host_kv_blocks * w->kv_block_bytes;
    out.push_back(r);
  }
  return out;
}

void ControlService::Shutdown(const std::string& reason, bool cluster_failed) {
  std::vector<Worker*> live;
  std::string why = reason;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
    // Whoever ends a cluster that lost a rank (the watchdog, or the
    // coordinator stopping first), the survivors learn that it failed.
    if (started_ && !first_dead_.empty() && !cluster_failed) {
      cluster_failed = true;
      why = absl::StrCat(reason, "; the cluster had failed: ", first_dead_);
    }
    cv_.SignalAll();
    for (auto& w : workers_) {
      if (w->state == State::kLoading || w->state == State::kReady) {
        live.push_back(w.get());
      }
    }
  }
  v1::CoordinatorMessage msg;
  msg.mutable_shutdown()->set_reason(why);
  msg.mutable_shutdown()->set_cluster_failed(cluster_failed);
  for (Worker* w : live) Write(*w, msg);
}

absl::Status ControlService::Reform(const std::string& rendezvous_prefix) {
  std::vector<Worker*> live;
  std::string why;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) {
      return absl::FailedPreconditionError("the cluster was shut down");
    }
    reforming_ = true;
    rendezvous_prefix_ = rendezvous_prefix;
    why = first_dead_.empty() ? "a rank was lost" : first_dead_;
    for (auto& w : workers_) {
      if (w->context != nullptr) live.push_back(w.get());
    }
  }
  v1::CoordinatorMessage msg;
  msg.mutable_shutdown()->set_reason(
      absl::StrCat("the cluster re-forms after: ", why));
  msg.mutable_shutdown()->set_rejoin(true);
  for (Worker* w : live) Write(*w, msg);

  absl::MutexLock lock(&mu_);
  const auto open_streams = [&] {
    return std::count_if(workers_.begin(), workers_.end(),
                         [](const auto& w) { return w->context != nullptr; });
  };
  // Survivors close their streams at once, unless stuck in a step; then
  // their streams are cancelled.
  absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (open_streams() > 0 && !cv_.WaitWithDeadline(&mu_, deadline)) {
  }
  for (auto& w : workers_) {
    if (w->context != nullptr) w->context->TryCancel();
  }
  deadline = absl::Now() + absl::Seconds(5);
  while (open_streams() > 0 && !cv_.WaitWithDeadline(&mu_, deadline)) {
  }
  for (auto& w : workers_) {
    // A handler that did not end in time no longer owns the slot (its
    // generation is stale); its stream is forgotten.
    {
      std::lock_guard<std::mutex> write_lock(w->write_mu);
      w->stream = nullptr;
    }
    w->context = nullptr;
    w->state = State::kEmpty;
    w->generation = 0;
    w->reg.Clear();
    w->kv_blocks = w->host_kv_blocks = 0;
    w->kv_block_bytes = w->weight_bytes = 0;
    w->figures.Clear();
    w->results.clear();
    w->reason.clear();
  }
  first_rank_ = 0;
  startup_error_ = absl::OkStatus();
  first_dead_.clear();
  step_deadlines_.clear();
  started_ = false;
  reforming_ = false;
  cv_.SignalAll();
  return absl::OkStatus();
}

void ControlService::Watchdog() {
  const absl::Duration tick = std::max(
      absl::Milliseconds(5),
      std::min(options_.heartbeat_interval, options_.worker_timeout / 4));
  v1::CoordinatorMessage heartbeat;
  heartbeat.mutable_heartbeat();
  while (true) {
    std::vector<Worker*> live;
    std::string failed;  // Set: the cluster just failed; end the others.
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_watchdog_), tick)) return;
      if (started_ && !first_dead_.empty() && !shutdown_ && !options_.rejoin) {
        failed = absl::StrCat("the cluster failed: ", first_dead_);
      }
      const absl::Time now = absl::Now();
      for (auto& w : workers_) {
        if (w->state != State::kLoading && w->state != State::kReady) continue;
        if (now - w->last_seen > options_.worker_timeout) {
          MarkDead(*w,
                   absl::StrCat("no heartbeat for ",
                                absl::FormatDuration(options_.worker_timeout)));
        } else if (!shutdown_) {
          live.push_back(w.get());
        }
      }
    }
    // A serving cluster that lost a rank cannot step again (its data plane
    // is broken and nothing re-forms it): the survivors are told why and
    // leave, freeing their memory; requests get the first death's reason.
    if (!failed.empty()) {
      Shutdown(failed, /*cluster_failed=*/true);
      continue;
    }
    // Never wait on a stream that is busy (e.g. a write blocked by a
    // frozen peer): the next tick tries again.
    const absl::Time now = absl::Now();
    for (Worker* w : live) {
      std::unique_lock<std::mutex> lock(w->write_mu, std::try_to_lock);
      if (!lock.owns_lock() || w->stream == nullptr ||
          now - w->last_write < options_.heartbeat_interval) {
        continue;
      }
      w->last_write = now;
      w->stream->Write(heartbeat);
    }
  }
}

grpc::Status ControlService::StreamedStoreSet(
    grpc::ServerContext* context,
    grpc::ServerUnaryStreamer<v1::StoreSetRequest, v1::StoreSetResponse>*
        stream) {
  if (!Authorized(*context)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "StoreSet: wrong or missing cluster token (call "
                        "metadata)");
  }
  v1::StoreSetRequest request;
  if (!stream->Read(&request)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "StoreSet: no request");
  }
  grpc::Status s = SetInStore(request);
  if (s.ok() && !stream->Write(v1::StoreSetResponse())) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "StoreSet: the caller left");
  }
  return s;
}

grpc::Status ControlService::StreamedStoreGet(
    grpc::ServerContext* context,
    grpc::ServerUnaryStreamer<v1::StoreGetRequest, v1::StoreGetResponse>*
        stream) {
  if (!Authorized(*context)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "StoreGet: wrong or missing cluster token (call "
                        "metadata)");
  }
  v1::StoreGetRequest request;
  if (!stream->Read(&request)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "StoreGet: no request");
  }
  v1::StoreGetResponse response;
  grpc::Status s = GetFromStore(context, request, &response);
  if (s.ok() && !stream->Write(response)) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "StoreGet: the caller left");
  }
  return s;
}

grpc::Status ControlService::SetInStore(const v1::StoreSetRequest& request) {
  if (!options_.cluster_token.empty() &&
      !ConstantTimeEquals(request.cluster_token(), options_.cluster_token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "StoreSet: wrong or missing cluster token");
  }
  constexpr size_t kMaxKey = 512, kMaxValue = 64 << 10, kMaxKeys = 4096;
  if (request.key().empty() || request.key().size() > kMaxKey ||
      request.value().size() > kMaxValue) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("StoreSet: key of ", request.key().size(), " bytes (1..",
                     kMaxKey, ") or value of ", request.value().size(),
                     " bytes (at most ", kMaxValue, ")"));
  }
  absl::MutexLock lock(&store_mu_);
  if (store_.size() >= kMaxKeys && !store_.contains(request.key())) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("StoreSet: the store holds ", kMaxKeys, " keys already"));
  }
  store_[request.key()] = request.value();
  store_cv_.SignalAll();
  return grpc::Status::OK;
}

grpc::Status ControlService::GetFromStore(grpc::ServerContext* context,
                                          const v1::StoreGetRequest& request,
                                          v1::StoreGetResponse* response) {
  if (!options_.cluster_token.empty() &&
      !ConstantTimeEquals(request.cluster_token(), options_.cluster_token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "StoreGet: wrong or missing cluster token");
  }
  const absl::Time deadline =
      absl::Now() +
      absl::Milliseconds(std::clamp<int64_t>(request.wait_ms(), 0, 10'000));
  absl::MutexLock lock(&store_mu_);
  while (true) {
    if (auto it = store_.find(request.key()); it != store_.end()) {
      response->set_value(it->second);
      return grpc::Status::OK;
    }
    if (context->IsCancelled() ||
        store_cv_.WaitWithDeadline(&store_mu_, deadline)) {
      break;
    }
  }
  if (auto it = store_.find(request.key()); it != store_.end()) {
    response->set_value(it->second);
    return grpc::Status::OK;
  }
  return grpc::Status(
      grpc::StatusCode::NOT_FOUND,
      absl::StrCat("StoreGet: key '", request.key(), "' is not set"));
}

void AddControlService(grpc::ServerBuilder& builder, ControlService* service) {
  builder.RegisterService(service);
  grpc::ResourceQuota quota("shardlm-control");
  // A stream and a waiting StoreGet per worker, and a margin.
  quota.SetMaxThreads(2 * service->num_workers() + 16);
  builder.SetResourceQuota(quota);
  // What a peer can send before its token is looked at: request headers,
  // and streams on one connection (a worker has at most two calls open at
  // once: its Connect stream and a store call).
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, 16 << 10);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 8);
  builder.SetMaxReceiveMessageSize(std::numeric_limits<int>::max());
  builder.SetMaxSendMessageSize(std::numeric_limits<int>::max());
}

}  // namespace shardlm
