#include "router/replica_set.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/prefix_hash.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "shardlm/v1/replica_state.grpc.pb.h"

namespace shardlm {
namespace {

void Authorize(grpc::ClientContext& ctx, const std::string& key) {
  if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
}

// Why an update cannot be right, or empty.
std::string Malformed(const v1::ReplicaStateUpdate& u) {
  if (u.block_size() <= 0) {
    return absl::StrCat("block_size ", u.block_size());
  }
  if (u.running() < 0 || u.waiting() < 0) {
    return absl::StrCat("running ", u.running(), ", waiting ", u.waiting());
  }
  if (u.kv_total_blocks() < 0 || u.kv_used_blocks() < 0 ||
      u.kv_used_blocks() > u.kv_total_blocks()) {
    return absl::StrCat("kv_used_blocks ", u.kv_used_blocks(), " of ",
                        u.kv_total_blocks());
  }
  return "";
}

}  // namespace

ReplicaSet::ReplicaSet(ReplicaSetOptions options)
    : options_(std::move(options)) {
  replicas_.reserve(kMaxReplicas);
}

ReplicaSet::Replica* ReplicaSet::Add(const std::string& address) {
  auto r = std::make_unique<Replica>();
  r->address = address;
  r->channel =
      grpc::CreateChannel(address, options_.credentials != nullptr
                                       ? options_.credentials
                                       : grpc::InsecureChannelCredentials());
  r->stub = v1::Inference::NewStub(r->channel);
  r->problem = "not contacted yet";
  replicas_.push_back(std::move(r));
  count_.store(static_cast<int>(replicas_.size()), std::memory_order_release);
  return replicas_.back().get();
}

void ReplicaSet::StartWatching(Replica* r) {
  if (r->watching) return;
  if (r->watcher.joinable()) {
    // It saw `removed` and is on its way out (it takes mu_ no more).
    mu_.Unlock();
    r->watcher.join();
    mu_.Lock();
  }
  r->watching = true;
  r->watcher = std::thread([this, r] { Watch(r); });
}

absl::Status ReplicaSet::SetAddresses(
    const std::vector<std::string>& addresses) {
  absl::MutexLock lock(&mu_);
  const auto known = [this](const std::string& a)
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                           for (const auto& r : replicas_) {
                             if (r->address == a) return true;
                           }
                           return false;
                         };
  size_t fresh = 0;
  for (const std::string& a : addresses) fresh += known(a) ? 0 : 1;
  if (replicas_.size() + fresh > static_cast<size_t>(kMaxReplicas)) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", kMaxReplicas, " replica addresses; ",
                     replicas_.size() + fresh, " given over time"));
  }
  // By index: StartWatching may let go of mu_, and only this function
  // (serialized by its caller) appends.
  const size_t n = replicas_.size();
  for (size_t i = 0; i < n; ++i) {
    Replica* r = replicas_[i].get();
    const bool wanted = std::find(addresses.begin(), addresses.end(),
                                  r->address) != addresses.end();
    if (!wanted && !r->removed) {
      r->removed = true;
      if (r->watch != nullptr) r->watch->TryCancel();
      std::fprintf(stderr, "[shardlm router] replica %s removed\n",
                   r->address.c_str());
    } else if (wanted && r->removed) {
      r->removed = false;
      std::fprintf(stderr, "[shardlm router] replica %s added again\n",
                   r->address.c_str());
      StartWatching(r);
    }
  }
  for (const std::string& a : addresses) {
    if (known(a)) continue;
    std::fprintf(stderr, "[shardlm router] replica %s added\n", a.c_str());
    StartWatching(Add(a));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ReplicaSet>> ReplicaSet::Start(
    ReplicaSetOptions options) {
  if (options.addresses.empty()) {
    return absl::InvalidArgumentError("no replicas (give --replica ADDR)");
  }
  if (options.addresses.size() > static_cast<size_t>(kMaxReplicas)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "at most ", kMaxReplicas, " replicas, got ", options.addresses.size()));
  }
  std::unique_ptr<ReplicaSet> set(new ReplicaSet(std::move(options)));
  {
    absl::MutexLock lock(&set->mu_);
    for (const std::string& address : set->options_.addresses) {
      set->Add(address);
    }
  }
  // Two replicas that answer now must agree; the first in the list that
  // answers sets the model the others are held to. Asked all at once, so
  // that unreachable replicas cost one call_timeout, not one each.
  std::vector<absl::StatusOr<std::string>> models(
      set->replicas_.size(), absl::UnknownError("not asked"));
  {
    std::vector<std::thread> askers;
    for (size_t i = 0; i < set->replicas_.size(); ++i) {
      askers.emplace_back(
          [&set, &models, i] { models[i] = set->ModelOf(*set->replicas_[i]); });
    }
    for (std::thread& t : askers) t.join();
  }
  std::string first_address;
  for (size_t i = 0; i < set->replicas_.size(); ++i) {
    const Replica& r = *set->replicas_[i];
    const absl::StatusOr<std::string>& model = models[i];
    if (!model.ok()) {
      std::fprintf(stderr, "[shardlm router] replica %s: %s\n",
                   r.address.c_str(),
                   std::string(model.status().message()).c_str());
      continue;
    }
    absl::MutexLock lock(&set->mu_);
    if (set->model_.empty()) {
      set->model_ = *model;
      first_address = r.address;
    } else if (*model != set->model_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replicas serve different models: ", first_address, " serves '",
          set->model_, "', ", r.address, " serves '", *model, "'"));
    }
  }
  {
    absl::MutexLock lock(&set->mu_);
    for (size_t i = 0; i < set->replicas_.size(); ++i) {
      set->StartWatching(set->replicas_[i].get());
    }
  }
  return set;
}

ReplicaSet::~ReplicaSet() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& r : replicas_) {
      if (r->watch != nullptr) r->watch->TryCancel();
    }
  }
  // The owner destroys the set: no SetAddresses runs, the vector stays.
  for (auto& r : replicas_) {
    if (r->watcher.joinable()) r->watcher.join();
  }
}

std::string ReplicaSet::model() const {
  absl::MutexLock lock(&mu_);
  return model_;
}

absl::StatusOr<std::string> ReplicaSet::ModelOf(Replica& r) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(options_.call_timeout));
  Authorize(ctx, options_.api_key);
  v1::GetModelInfoRequest req;
  v1::ModelInfo info;
  const grpc::Status s = r.stub->GetModelInfo(&ctx, req, &info);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "GetModelInfo on ", r.address, " failed within ",
        absl::FormatDuration(options_.call_timeout), ": ", s.error_message()));
  }
  {
    absl::MutexLock lock(&mu_);
    if (context_length_ == 0 && (model_.empty() || model_ == info.name())) {
      context_length_ = info.context_length();
      tool_call_format_ = info.tool_call_format();
      reasoning_format_ = info.reasoning_format();
    }
  }
  return info.name();
}

int64_t ReplicaSet::context_length() const {
  absl::MutexLock lock(&mu_);
  return context_length_;
}

std::string ReplicaSet::tool_call_format() const {
  absl::MutexLock lock(&mu_);
  return tool_call_format_;
}

std::string ReplicaSet::reasoning_format() const {
  absl::MutexLock lock(&mu_);
  return reasoning_format_;
}

void ReplicaSet::Watch(Replica* r) {
  auto state = v1::ReplicaState::NewStub(r->channel);
  const auto pause = [this, r](absl::Duration d) {
    absl::MutexLock lock(&mu_);
    const auto woken = [this, r]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || r->removed;
    };
    // Woken early by stopping_ or removed, which the loop's top sees.
    mu_.AwaitWithTimeout(absl::Condition(&woken), d);
  };

  std::string last_logged;
  bool warned_keys = false;
  const auto note = [&](std::string problem) {
    if (problem != last_logged) {
      std::fprintf(stderr, "[shardlm router] replica %s: %s\n",
                   r->address.c_str(), problem.c_str());
      last_logged = problem;
    }
    absl::MutexLock lock(&mu_);
    r->problem = std::move(problem);
  };
  // Whether to go on; false (watching cleared) once stopping or removed.
  const auto going = [&] {
    absl::MutexLock lock(&mu_);
    if (stopping_ || r->removed) {
      r->watching = false;
      return false;
    }
    return true;
  };
  while (true) {
    if (!going()) return;
    absl::StatusOr<std::string> model = ModelOf(*r);
    if (!model.ok()) {
      note(std::string(model.status().message()));
      pause(options_.retry_every);
      continue;
    }
    std::string refused;
    {
      absl::MutexLock lock(&mu_);
      if (model_.empty()) model_ = *model;
      if (*model != model_) {
        refused = absl::StrCat("refused: serves '", *model,
                               "', the other replicas serve '", model_, "'");
      }
    }
    if (!refused.empty()) {
      note(refused);
      pause(absl::Seconds(1));
      continue;
    }

    grpc::ClientContext ctx;
    Authorize(ctx, options_.api_key);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || r->removed) {
        r->watching = false;
        return;
      }
      r->watch = &ctx;
    }
    v1::WatchStateRequest req;
    auto reader = state->WatchState(&ctx, req);
    v1::ReplicaStateUpdate u;
    std::string malformed;
    while (reader->Read(&u)) {
      malformed = Malformed(u);
      if (!malformed.empty()) {
        ctx.TryCancel();
        break;
      }
      absl::MutexLock lock(&mu_);
      if (!r->up) last_logged.clear();  // Log the next problem again.
      r->up = true;
      r->ready = u.ready();
      r->last_update = absl::Now();
      r->running = u.running();
      r->waiting = u.waiting();
      r->kv_use = u.kv_total_blocks() > 0
                      ? static_cast<double>(u.kv_used_blocks()) /
                            static_cast<double>(u.kv_total_blocks())
                      : 0.0;
      if (u.block_size() != r->block_size) r->index.Clear();
      r->block_size = u.block_size();
      if (u.reset()) r->index.Clear();
      for (uint64_t k : u.inserted()) r->index.Insert(k);
      for (uint64_t k : u.evicted()) r->index.Evict(k);
      r->problem = r->ready ? "" : "says it is not ready";
      if (!u.publishes_keys() && !warned_keys) {
        warned_keys = true;
        std::fprintf(stderr,
                     "[shardlm router] replica %s does not publish its prefix "
                     "cache (start it with --metrics-prefix-cache): kv "
                     "routing sees nothing cached there\n",
                     r->address.c_str());
      }
    }
    const grpc::Status s = reader->Finish();
    {
      absl::MutexLock lock(&mu_);
      r->watch = nullptr;
      r->up = false;
      r->ready = false;
      r->index.Clear();
    }
    note(malformed.empty()
             ? absl::StrCat("state stream ended: ", s.error_message())
             : absl::StrCat("malformed state stream (", malformed,
                            "): not routed to until it reconnects"));
    pause(options_.retry_every);
  }
}

bool ReplicaSet::Usable(const Replica& r, absl::Time now) const {
  return !r.removed && r.up && r.ready &&
         now - r.last_update <= options_.stale_after;
}

RouteDecision ReplicaSet::Route(RoutingPolicy& policy,
                                absl::Span<const int32_t> prompt, int exclude) {
  std::vector<ReplicaView> views(replicas_.size());
  std::vector<uint64_t> keys;
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  int32_t block_size = 0;
  for (size_t i = 0; i < replicas_.size(); ++i) {
    const Replica& r = *replicas_[i];
    ReplicaView& v = views[i];
    v.ready = Usable(r, now);
    v.running = r.running;
    v.waiting = r.waiting;
    v.kv_use = r.kv_use;
    if (!v.ready) continue;
    // Keys are computed once, at the block size of the first ready
    // replica; a replica with another block size gets no prediction.
    if (block_size == 0) block_size = r.block_size;
    if (r.block_size == block_size) v.index = &r.index;
  }
  if (policy.options().kind == RoutingPolicyKind::kKv && block_size > 0) {
    keys = PrefixBlockKeys(prompt, block_size);
  }
  return policy.Choose(views, keys, exclude);
}

absl::Duration ReplicaSet::SilentFor(int i) const {
  absl::MutexLock lock(&mu_);
  return absl::Now() - replicas_[i]->last_update;
}

bool ReplicaSet::Removed(int i) const {
  absl::MutexLock lock(&mu_);
  return replicas_[i]->removed;
}

int ReplicaSet::ready_count() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  int n = 0;
  for (const auto& r : replicas_) n += Usable(*r, now) ? 1 : 0;
  return n;
}

std::string ReplicaSet::Describe() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  std::string out;
  for (const auto& r : replicas_) {
    if (r->removed) continue;
    if (!out.empty()) out += "; ";
    out += r->address;
    if (Usable(*r, now)) {
      out += " (ready)";
    } else if (r->up && r->ready) {
      out += absl::StrCat(" (no update for ",
                          absl::FormatDuration(now - r->last_update), ")");
    } else {
      out += absl::StrCat(" (", r->problem, ")");
    }
  }
  return out;
}

}  // namespace shardlm
