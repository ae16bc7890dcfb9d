#include "simulator/simulation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/status.h"
#include "engine/drafter.h"
#include "engine/prefix_hash.h"

namespace shardlm {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();
constexpr int32_t kMaxLength = 1 << 20;
// Inter-token gaps kept for percentiles (a seeded reservoir beyond).
constexpr size_t kMaxItlSamples = 1 << 21;

absl::Time At(double seconds) {
  return absl::UnixEpoch() + absl::Seconds(seconds);
}

Percentiles Summarize(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  const auto rank = [&](double q) {
    const size_t i = static_cast<size_t>(std::ceil(q * v.size()));
    return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
  };
  p.mean = sum / v.size();
  p.p50 = rank(0.5);
  p.p90 = rank(0.9);
  p.p99 = rank(0.99);
  p.max = v.back();
  return p;
}

// What the simulator keeps of a request.
struct Tracked {
  double arrival = 0;
  double scheduled = -1;  // First in a planned step.
  double first_token = -1, last_token = -1;
  int64_t tokens = 0;
};

// The token the simulated drafter proposes, and what a simulated row
// samples instead when it rejects a draft.
constexpr int32_t kDraftToken = 1;
constexpr int32_t kOtherToken = 2;

// Always has `n` drafts (kDraftToken); whether they are kept is the
// simulated rows' draw (SimOptions::spec_acceptance).
class SimulatedDrafter : public SequenceDrafter {
 public:
  explicit SimulatedDrafter(int n) : n_(n) {}
  std::vector<int32_t> Draft(absl::Span<const int32_t>,
                             int max_tokens) override {
    return std::vector<int32_t>(std::min(n_, max_tokens), kDraftToken);
  }

 private:
  int n_;
};

SpeculationOptions SimulatedSpeculation(const SimOptions& o) {
  if (o.spec_acceptance <= 0) return {};
  const int n = o.spec_tokens;
  return {.method = SpeculationOptions::Method::kCustom,
          .make_drafter =
              [n](const GenerateRequest&) {
                return std::make_unique<SimulatedDrafter>(n);
              },
          .max_tokens = n,
          .adaptive = o.spec_adaptive};
}

struct Replica {
  Replica(const SimOptions& o, int64_t vocab, ServingMetrics* metrics)
      : blocks(static_cast<int32_t>(o.device_blocks), o.block_size,
               static_cast<int32_t>(o.host_blocks), o.prefix_caching),
        planner(&blocks, metrics, o.scheduler, vocab, nullptr,
                SimulatedSpeculation(o)) {
    if (o.router == Router::kKv) blocks.set_event_log(&events);
  }
  BlockManager blocks;
  BatchPlanner planner;
  // The prefix cache's keys as a router would index them (Router::kKv).
  PrefixEventLog events;
  PrefixIndex index;
  std::optional<uint64_t> cursor;
  std::vector<double> stage_free;  // When each stage is next free.
  struct Step {
    double done = 0;
    size_t rows = 0;
    // Decode-only steps: their token rows and start (for the speculation
    // policy's step times); 0 rows otherwise.
    int64_t decode_rows = 0;
    double start = 0;
  };
  std::deque<Step> in_flight;  // Oldest first.
  double next = kNever;        // When it acts next.
  uint64_t version = 0;        // Of `next`, for the event heap.
  double stage_busy = 0;
  // Time-weighted KV use: the last sample and the integrals since 0.
  double sampled_at = 0, device_used = 0, host_used = 0;
  double device_integral = 0, host_integral = 0;
};

}  // namespace

absl::StatusOr<LengthDistribution> LengthDistribution::Parse(
    const std::string& text) {
  LengthDistribution d;
  d.text_ = text;
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "length distribution '", text, "': ", why,
        " (want N, fixed:N, uniform:A:B or lognormal:MEDIAN:SIGMA)"));
  };
  std::vector<double> v;
  for (size_t i = (parts.size() == 1 ? 0 : 1); i < parts.size(); ++i) {
    double x = 0;
    if (!absl::SimpleAtod(parts[i], &x) || !std::isfinite(x)) {
      return bad(absl::StrCat("'", parts[i], "' is not a number"));
    }
    v.push_back(x);
  }
  const std::string kind = parts.size() == 1 ? "fixed" : parts[0];
  if (kind == "fixed" && v.size() == 1) {
    d.kind_ = Kind::kFixed;
    d.a_ = v[0];
  } else if (kind == "uniform" && v.size() == 2) {
    d.kind_ = Kind::kUniform;
    d.a_ = v[0];
    d.b_ = v[1];
    if (d.b_ < d.a_) return bad("B is less than A");
  } else if (kind == "lognormal" && v.size() == 2) {
    d.kind_ = Kind::kLognormal;
    d.a_ = v[0];
    d.b_ = v[1];
    if (d.b_ < 0) return bad("SIGMA is negative");
  } else {
    return bad("unknown form");
  }
  if (d.a_ < 1 || d.a_ > kMaxLength ||
      (d.kind_ == Kind::kUniform && d.b_ > kMaxLength)) {
    return bad(absl::StrCat("lengths must be in [1, ", kMaxLength, "]"));
  }
  return d;
}

int32_t LengthDistribution::Draw(std::mt19937_64& rng) const {
  double x = a_;
  if (kind_ == Kind::kUniform) {
    x = std::uniform_int_distribution<int64_t>(static_cast<int64_t>(a_),
                                               static_cast<int64_t>(b_))(rng);
  } else if (kind_ == Kind::kLognormal) {
    x = std::round(std::lognormal_distribution<double>(std::log(a_), b_)(rng));
  }
  return static_cast<int32_t>(std::clamp<double>(x, 1, kMaxLength));
}

double LengthDistribution::Mean() const {
  switch (kind_) {
    case Kind::kFixed:
      return a_;
    case Kind::kUniform:
      return (a_ + b_) / 2;
    case Kind::kLognormal:
      return a_ * std::exp(b_ * b_ / 2);
  }
  return a_;
}

std::vector<SimRequest> PoissonTrace(double rate, double duration,
                                     const LengthDistribution& prompt,
                                     const LengthDistribution& output,
                                     uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  std::vector<SimRequest> out;
  if (rate <= 0) return out;
  for (double t = gap(rng); t < duration; t += gap(rng)) {
    out.push_back({.arrival = t,
                   .prompt_tokens = prompt.Draw(rng),
                   .output_tokens = output.Draw(rng)});
  }
  return out;
}

absl::StatusOr<std::vector<SimRequest>> ReadTraceCsv(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<SimRequest> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty() || l[0] == '#' || (n == 1 && absl::ascii_isalpha(l[0]))) {
      continue;
    }
    const std::vector<absl::string_view> f = absl::StrSplit(l, ',');
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", n, ": ", why,
                       " (want arrival_seconds,prompt_tokens,output_tokens"
                       "[,priority])"));
    };
    if (f.size() < 3 || f.size() > 4) return bad("wrong number of fields");
    SimRequest r;
    int32_t priority = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(f[0]), &r.arrival) ||
        !std::isfinite(r.arrival) || r.arrival < 0) {
      return bad("bad arrival");
    }
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(f[1]), &r.prompt_tokens) ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(f[2]), &r.output_tokens) ||
        r.prompt_tokens < 1 || r.output_tokens < 1 ||
        r.prompt_tokens > kMaxLength || r.output_tokens > kMaxLength) {
      return bad(absl::StrCat("token counts must be in [1, ", kMaxLength, "]"));
    }
    if (f.size() == 4 &&
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(f[3]), &priority)) {
      return bad("bad priority");
    }
    r.priority = priority;
    if (!out.empty() && r.arrival < out.back().arrival) {
      return bad("arrivals go backwards");
    }
    out.push_back(r);
  }
  return out;
}

namespace {

// One run of Simulate: the replicas, the clients and the requests'
// timelines on the virtual clock. Route and Act are the two events; Run
// takes them in time order; Finish summarises.
class Simulation {
 public:
  Simulation(const CostModel& cost, const SimOptions& o, int64_t vocab_size,
             const std::vector<SimRequest>& trace)
      : cost_(cost),
        o_(o),
        vocab_size_(vocab_size),
        trace_(trace),
        stages_(cost.StageSeconds(StepInput{}).size()),
        tracked_(trace.size()),
        rng_(o.seed),
        spec_rng_(o.seed * 7919 + 17),
        gap_(0, o.client_gap),
        policy_(SharedPolicy(o)) {
    report_.requests = static_cast<int64_t>(trace.size());
    for (int r = 0; r < o.replicas; ++r) {
      replicas_.push_back(std::make_unique<Replica>(o, vocab_size, &metrics_));
      replicas_.back()->stage_free.assign(stages_, 0);
    }
    for (int c = 0; c < o.concurrency; ++c) ClientFree(0);
  }

  // Every arrival and step in time order, until nothing is left to do.
  absl::Status Run();
  SimReport Finish(double wall_seconds);

 private:
  // Replicas by the time they act next (stale entries skipped).
  using Entry = std::tuple<double, int, uint64_t>;

  void Wake(int r, double t);
  // Integrates replica `rep`'s KV use up to t and samples it anew.
  void SampleKv(Replica& rep, double t);
  // Runs f, adding its wall time to the planner's; returns that time.
  template <typename F>
  double Timed(F&& f);
  void RunEvents();
  // A closed-loop client is free to send again (at t plus its gap).
  void ClientFree(double t);
  void Refuse(const char* why);
  // Request `index` arrives now: refused, or added to a replica's planner.
  void Route(size_t index);
  // `prompt`: the request's tokens (Router::kKv only; else empty).
  int PickReplica(const std::vector<int32_t>& prompt);
  std::vector<int32_t> MakePrompt(size_t index);
  static RoutingOptions SharedPolicy(const SimOptions& o) {
    RoutingOptions r = o.routing;
    r.kind = o.router == Router::kKv          ? RoutingPolicyKind::kKv
             : o.router == Router::kLeastLoad ? RoutingPolicyKind::kLeastLoad
                                              : RoutingPolicyKind::kRoundRobin;
    return r;
  }
  RequestCallbacks Callbacks(size_t index);
  void RecordToken(size_t index);
  // Replica r at time t: applies its finished step, admits, plans what it
  // can and schedules the steps on its stages.
  void Act(int r, double t);
  // The step's stages after `ready`, each when its stage is free; returns
  // when the last ends.
  double Schedule(Replica& rep, const StepPlan& plan, double ready);

  const CostModel& cost_;
  const SimOptions& o_;
  const int64_t vocab_size_;
  const std::vector<SimRequest>& trace_;
  const size_t stages_;

  SimReport report_;
  ServingMetrics metrics_;  // The planner records into it; unused here.
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::vector<Tracked> tracked_;
  std::vector<double> itl_;
  std::mt19937_64 rng_;
  // Speculative decoding's draws (apart, so that the other draws stay).
  std::mt19937_64 spec_rng_;
  std::uniform_real_distribution<double> accept_{0.0, 1.0};
  int64_t itl_seen_ = 0;
  double now_ = 0;
  double planner_wall_ = 0;
  CpBytes cp_bytes_;  // Summed over the steps of every replica.
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> events_;
  std::vector<PlannerEvent> done_events_;
  // Closed loop: each client sends its next request when the last ends,
  // arriving up to client_gap later.
  std::priority_queue<double, std::vector<double>, std::greater<double>>
      clients_;
  std::uniform_real_distribution<double> gap_;
  size_t round_robin_ = 0;
  RoutingPolicy policy_;
  absl::Status bad_cost_;
};

void Simulation::Wake(int r, double t) {
  Replica& rep = *replicas_[r];
  rep.next = t;
  ++rep.version;
  if (t != kNever) events_.emplace(t, r, rep.version);
}

void Simulation::SampleKv(Replica& rep, double t) {
  rep.device_integral += rep.device_used * (t - rep.sampled_at);
  rep.host_integral += rep.host_used * (t - rep.sampled_at);
  rep.sampled_at = t;
  const TierUsage d = rep.blocks.device_usage();
  const TierUsage h = rep.blocks.host_usage();
  rep.device_used = d.total > 0 ? static_cast<double>(d.used) / d.total : 0;
  rep.host_used = h.total > 0 ? static_cast<double>(h.used) / h.total : 0;
  report_.device_kv_peak = std::max(report_.device_kv_peak, rep.device_used);
  report_.host_kv_peak = std::max(report_.host_kv_peak, rep.host_used);
}

template <typename F>
double Simulation::Timed(F&& f) {
  using WallClock = std::chrono::steady_clock;
  const auto a = WallClock::now();
  f();
  const double s = std::chrono::duration<double>(WallClock::now() - a).count();
  planner_wall_ += s;
  return s;
}

void Simulation::RunEvents() {
  for (auto& e : done_events_) e();
  done_events_.clear();
}

void Simulation::ClientFree(double t) {
  if (o_.concurrency > 0) {
    clients_.push(t + (o_.client_gap > 0 ? gap_(rng_) : 0));
  }
}

void Simulation::Refuse(const char* why) {
  ++report_.refused[why];
  ClientFree(now_);
}

int Simulation::PickReplica(const std::vector<int32_t>& prompt) {
  if (o_.router == Router::kLeastKv) {
    // The most free device blocks, then the shortest queue.
    const auto key = [](const Replica& x) {
      return std::make_pair(-static_cast<int64_t>(x.blocks.DeviceAvailable()),
                            static_cast<int64_t>(x.planner.waiting()));
    };
    int r = 0;
    for (int i = 1; i < o_.replicas; ++i) {
      if (key(*replicas_[i]) < key(*replicas_[r])) r = i;
    }
    return r;
  }
  std::vector<ReplicaView> views(replicas_.size());
  for (size_t i = 0; i < replicas_.size(); ++i) {
    Replica& x = *replicas_[i];
    if (o_.router == Router::kKv) {
      PrefixEventBatch b = x.events.Since(x.cursor);
      x.cursor = b.cursor;
      if (b.reset) x.index.Reset(b.inserted);
      for (const auto& [key, inserted] : b.changes) {
        if (inserted) {
          x.index.Insert(key);
        } else {
          x.index.Evict(key);
        }
      }
    }
    const TierUsage d = x.blocks.device_usage();
    views[i] = {
        .ready = true,
        .running = static_cast<int64_t>(x.planner.running()),
        .waiting = static_cast<int64_t>(x.planner.waiting()),
        .kv_use = d.total > 0 ? static_cast<double>(d.used) / d.total : 0.0,
        .index = &x.index};
  }
  const std::vector<uint64_t> keys =
      o_.router == Router::kKv ? PrefixBlockKeys(prompt, o_.block_size)
                               : std::vector<uint64_t>();
  return policy_.Choose(views, keys).replica;
}

std::vector<int32_t> Simulation::MakePrompt(size_t index) {
  const SimRequest& req = trace_[index];
  std::vector<int32_t> prompt(req.prompt_tokens);
  size_t shared = 0;
  if (o_.shared_prefix_tokens > 0 && o_.prefix_groups > 0) {
    shared = std::min<size_t>(prompt.size(), o_.shared_prefix_tokens);
    // The group's prefix from its own seed: the same tokens every time.
    std::mt19937_64 group(o_.seed * 1000003 + index % o_.prefix_groups);
    for (size_t i = 0; i < shared; ++i) {
      prompt[i] = static_cast<int32_t>(group() % vocab_size_);
    }
  }
  // Distinct otherwise: no accidental prefix-cache hits.
  for (size_t i = shared; i < prompt.size(); ++i) {
    prompt[i] =
        static_cast<int32_t>(rng_() % static_cast<uint64_t>(vocab_size_));
  }
  return prompt;
}

void Simulation::RecordToken(size_t index) {
  Tracked& x = tracked_[index];
  if (x.tokens == 0) {
    x.first_token = now_;
  } else {
    const double gap = now_ - x.last_token;
    ++itl_seen_;
    if (itl_.size() < kMaxItlSamples) {
      itl_.push_back(gap);
    } else {
      const uint64_t j = rng_() % static_cast<uint64_t>(itl_seen_);
      if (j < kMaxItlSamples) itl_[j] = gap;
    }
  }
  x.last_token = now_;
  ++x.tokens;
}

RequestCallbacks Simulation::Callbacks(size_t index) {
  RequestCallbacks cb;
  cb.on_token = [this, index](int32_t, const TokenLogprobs*) {
    RecordToken(index);
    return TokenAction::kContinue;
  };
  cb.on_done = [this, index](absl::StatusOr<GenerateResult> result) {
    if (!result.ok()) {
      Refuse("failed");
      return;
    }
    ++report_.finished;
    report_.prompt_tokens += trace_[index].prompt_tokens;
    report_.output_tokens += static_cast<int64_t>(result->tokens.size());
    report_.duration = std::max(report_.duration, now_);
    ClientFree(now_);
  };
  return cb;
}

void Simulation::Route(size_t index) {
  const SimRequest& req = trace_[index];
  const double arrival = now_;
  const int64_t total = int64_t{req.prompt_tokens} + req.output_tokens;
  const int64_t capacity = o_.device_blocks + o_.host_blocks;
  if (o_.context_length > 0 && total > o_.context_length) {
    return Refuse("context_length");
  }
  if ((total + o_.block_size - 1) / o_.block_size > capacity) {
    return Refuse("kv_capacity");
  }
  // kv hashes the prompt to choose; the other routers draw it after
  // choosing, as they always did (a refused request draws none).
  std::vector<int32_t> prompt;
  if (o_.router == Router::kKv) prompt = MakePrompt(index);
  const int r = PickReplica(prompt);
  Replica& rep = *replicas_[r];
  if (static_cast<int64_t>(rep.planner.waiting()) >= o_.scheduler.max_queued) {
    return Refuse("queue_full");
  }
  GenerateRequest g{.max_tokens = req.output_tokens, .priority = req.priority};
  g.prompt = o_.router == Router::kKv ? std::move(prompt) : MakePrompt(index);
  tracked_[index].arrival = arrival;
  RequestCallbacks cb = Callbacks(index);
  Timed([&] {
    rep.planner.Add(static_cast<RequestId>(index), std::move(g), std::move(cb),
                    At(arrival));
  });
  if (rep.next == kNever) Wake(r, arrival);
}

double Simulation::Schedule(Replica& rep, const StepPlan& plan, double ready) {
  const std::vector<double> stage = cost_.StageSeconds(plan.step);
  const CpBytes cp = cost_.StepCpBytes(plan.step);
  cp_bytes_.all_gather += cp.all_gather;
  cp_bytes_.all_reduce += cp.all_reduce;
  for (double x : stage) {
    if (!std::isfinite(x) || x < 0) {
      bad_cost_ = absl::InternalError(
          absl::StrCat("the cost model gave a stage ", x, " s for a step of ",
                       plan.step.tokens.size(), " tokens"));
    }
  }
  for (size_t s = 0; s < stage.size(); ++s) {
    const double start = std::max(ready, rep.stage_free[s]);
    ready = start + stage[s];
    rep.stage_free[s] = ready;
    rep.stage_busy += stage[s];
  }
  return ready;
}

void Simulation::Act(int r, double t) {
  Replica& rep = *replicas_[r];
  now_ = t;
  double spent = Timed([&] {
    if (!rep.in_flight.empty() && rep.in_flight.front().done <= t) {
      const Replica::Step& step = rep.in_flight.front();
      StepOutput out;
      out.tokens.assign(step.rows, kDraftToken);
      if (o_.spec_acceptance > 0) {
        // Each row samples the draft before it with the measured chance
        // (a row that verifies nothing ignores its token's value).
        for (int32_t& token : out.tokens) {
          if (accept_(spec_rng_) >= o_.spec_acceptance) token = kOtherToken;
        }
        if (step.decode_rows > 0 && o_.max_steps_in_flight == 1) {
          rep.planner.ObserveStep(step.decode_rows, step.done - step.start);
        }
      }
      rep.in_flight.pop_front();
      rep.planner.Apply(std::move(out), At(t), done_events_);
    }
    rep.planner.Admit(At(t), done_events_);
  });
  RunEvents();
  while (true) {
    std::optional<StepPlan> plan;
    spent += Timed(
        [&] { plan = rep.planner.PlanForPipeline(o_.max_steps_in_flight); });
    if (!plan.has_value()) break;
    ++report_.steps;
    for (int64_t id : plan->stepped) {
      if (tracked_[id].scheduled < 0) tracked_[id].scheduled = t;
    }
    const double start = o_.count_planner_time ? t + spent : t;
    const double done = Schedule(rep, *plan, start);
    rep.in_flight.push_back(
        {.done = done,
         .rows = plan->rows.size(),
         .decode_rows = plan->decode_only
                            ? static_cast<int64_t>(plan->step.tokens.size())
                            : 0,
         .start = start});
  }
  report_.max_running = std::max<int64_t>(
      report_.max_running, static_cast<int64_t>(rep.planner.running()));
  SampleKv(rep, t);
  if (!rep.in_flight.empty()) {
    Wake(r, rep.in_flight.front().done);
  } else if (!rep.planner.idle()) {
    Wake(r, t + 0.01);  // The real loop's wait when nothing can run.
  } else {
    Wake(r, kNever);
  }
}

absl::Status Simulation::Run() {
  size_t next_arrival = 0;
  while (bad_cost_.ok()) {
    while (!events_.empty()) {
      const auto [t, r, version] = events_.top();
      if (replicas_[r]->version == version) break;
      events_.pop();
    }
    double arrival = kNever;
    if (next_arrival < trace_.size()) {
      if (o_.concurrency == 0) {
        arrival = trace_[next_arrival].arrival;
      } else if (!clients_.empty()) {
        arrival = clients_.top();
      }
    }
    const double step = events_.empty() ? kNever : std::get<0>(events_.top());
    if (arrival == kNever && step == kNever) break;
    if (arrival <= step) {
      now_ = arrival;
      if (o_.concurrency > 0) clients_.pop();
      Route(next_arrival++);
    } else {
      const int r = std::get<1>(events_.top());
      events_.pop();
      Act(r, step);
    }
  }
  return bad_cost_;
}

SimReport Simulation::Finish(double wall_seconds) {
  SimReport& report = report_;
  std::vector<double> ttft, tpot, e2e, queueing;
  int64_t met = 0;
  for (const Tracked& t : tracked_) {
    if (t.tokens == 0) continue;
    ttft.push_back(t.first_token - t.arrival);
    e2e.push_back(t.last_token - t.arrival);
    queueing.push_back(t.scheduled - t.arrival);
    double per_token = 0;
    if (t.tokens > 1) {
      per_token = (t.last_token - t.first_token) / (t.tokens - 1);
      tpot.push_back(per_token);
    }
    const bool ok = (o_.slo_ttft <= 0 || ttft.back() <= o_.slo_ttft) &&
                    (o_.slo_tpot <= 0 || per_token <= o_.slo_tpot);
    met += ok ? 1 : 0;
  }
  report.ttft = Summarize(std::move(ttft));
  report.tpot = Summarize(std::move(tpot));
  report.itl = Summarize(std::move(itl_));
  report.e2e = Summarize(std::move(e2e));
  report.queueing = Summarize(std::move(queueing));
  report.slo_set = o_.slo_ttft > 0 || o_.slo_tpot > 0;
  report.slo_attainment =
      report.requests > 0 ? static_cast<double>(met) / report.requests : 0;
  report.goodput = report.duration > 0 ? met / report.duration : 0;
  for (auto& rep : replicas_) {
    SampleKv(*rep, report.duration);
    const SchedulerStats s = rep->planner.Stats();
    report.preempted_swap += s.preempted_swap;
    report.preempted_recompute += s.preempted_recompute;
    report.spec_verifications += s.spec_verifications;
    report.spec_drafted += s.spec_drafted;
    report.spec_kept += s.spec_accepted;
    report.leaked_blocks += rep->blocks.used_blocks();
    report.prefix_hit_tokens += rep->blocks.counters().prefix_hit_tokens;
    if (report.duration > 0) {
      report.device_kv_mean +=
          rep->device_integral / report.duration / o_.replicas;
      report.host_kv_mean += rep->host_integral / report.duration / o_.replicas;
      report.stage_utilization +=
          rep->stage_busy / (report.duration * stages_) / o_.replicas;
    }
  }
  report.planner_wall_seconds = planner_wall_;
  report.cp_bytes = cp_bytes_;
  report.wall_seconds = wall_seconds;
  return report;
}

}  // namespace

absl::StatusOr<SimReport> Simulate(const CostModel& cost,
                                   const SimOptions& options,
                                   int64_t vocab_size,
                                   const std::vector<SimRequest>& trace) {
  using WallClock = std::chrono::steady_clock;
  const auto wall_start = WallClock::now();
  const SimOptions& o = options;
  if (o.replicas < 1 || o.block_size < 1 || o.device_blocks < 1 ||
      o.host_blocks < 0 || vocab_size < 2 ||
      o.device_blocks + o.host_blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("simulate: replicas (", o.replicas, "), block_size (",
                     o.block_size, ") and device_blocks (", o.device_blocks,
                     ") must be positive and the blocks fit in 32 bits"));
  }
  // Held by pointer: the planners' callbacks point into it.
  auto sim = std::make_unique<Simulation>(cost, o, vocab_size, trace);
  RETURN_IF_ERROR(sim->Run());
  return sim->Finish(
      std::chrono::duration<double>(WallClock::now() - wall_start).count());
}

namespace {

std::string Ms(const Percentiles& p) {
  return absl::StrFormat("%9.1f %9.1f %9.1f %9.1f %9.1f", p.mean * 1e3,
                         p.p50 * 1e3, p.p90 * 1e3, p.p99 * 1e3, p.max * 1e3);
}

std::string PercentilesJson(const Percentiles& p) {
  return absl::StrFormat(
      "{\"mean\": %.6g, \"p50\": %.6g, \"p90\": %.6g, \"p99\": %.6g, "
      "\"max\": %.6g}",
      p.mean, p.p50, p.p90, p.p99, p.max);
}

}  // namespace

std::string FormatReport(const SimReport& r) {
  std::string out = absl::StrFormat("requests: %d in the trace, %d finished",
                                    r.requests, r.finished);
  for (const auto& [why, n] : r.refused) {
    absl::StrAppendFormat(&out, ", %d refused (%s)", n, why);
  }
  absl::StrAppendFormat(
      &out,
      "\nsimulated time: %.2f s; %.2f requests/s, %.1f output tokens/s, "
      "%.1f total tokens/s\n",
      r.duration, r.request_rate(), r.output_token_rate(),
      r.duration > 0 ? (r.prompt_tokens + r.output_tokens) / r.duration : 0);
  absl::StrAppend(&out, "latency (ms)            mean       p50       p90  ",
                  "     p99       max\n");
  absl::StrAppend(&out, "  time to first token ", Ms(r.ttft), "\n");
  absl::StrAppend(&out, "  time per out. token ", Ms(r.tpot), "\n");
  absl::StrAppend(&out, "  inter-token gap     ", Ms(r.itl), "\n");
  absl::StrAppend(&out, "  end to end          ", Ms(r.e2e), "\n");
  absl::StrAppend(&out, "  queueing            ", Ms(r.queueing), "\n");
  absl::StrAppendFormat(
      &out,
      "steps: %d; stage utilization %.1f%%; most running on a replica: %d\n"
      "preemptions: %d swapped, %d recomputed; prefix cache hits: %d "
      "tokens\n"
      "KV in use: device %.1f%% mean, %.1f%% peak; host %.1f%% mean, "
      "%.1f%% peak\n"
      "%s\n"
      "planner: %.2f us per step on this machine; simulated in %.2f s\n",
      r.steps, 100 * r.stage_utilization, r.max_running, r.preempted_swap,
      r.preempted_recompute, r.prefix_hit_tokens, 100 * r.device_kv_mean,
      100 * r.device_kv_peak, 100 * r.host_kv_mean, 100 * r.host_kv_peak,
      r.slo_set ? absl::StrFormat("SLO attainment: %.1f%%; goodput %.2f "
                                  "requests/s",
                                  100 * r.slo_attainment, r.goodput)
                : std::string("SLOs: none set (--slo-ttft, --slo-tpot)"),
      r.steps > 0 ? 1e6 * r.planner_wall_seconds / r.steps : 0, r.wall_seconds);
  if (r.spec_verifications > 0) {
    absl::StrAppendFormat(
        &out,
        "speculative: %d of %d drafted tokens kept (%.0f%%) in %d "
        "verifications (%.2f tokens each)\n",
        r.spec_kept, r.spec_drafted,
        100.0 * r.spec_kept / std::max<int64_t>(1, r.spec_drafted),
        r.spec_verifications,
        static_cast<double>(r.spec_kept + r.spec_verifications) /
            r.spec_verifications);
  }
  if (r.cp_bytes.total() > 0) {
    absl::StrAppendFormat(
        &out,
        "context parallel: each CP rank sent %.1f MB (all-gathers %.1f MB, "
        "all-reduces %.1f MB; summed over stages and replicas)\n",
        r.cp_bytes.total() / 1e6, r.cp_bytes.all_gather / 1e6,
        r.cp_bytes.all_reduce / 1e6);
  }
  return out;
}

std::string ReportJson(const SimReport& r) {
  std::string refused = "{";
  for (const auto& [why, n] : r.refused) {
    absl::StrAppendFormat(&refused, "%s\"%s\": %d",
                          refused.size() > 1 ? ", " : "", why, n);
  }
  refused += "}";
  return absl::StrFormat(
      "{\"requests\": %d, \"finished\": %d, \"refused\": %s, "
      "\"duration_s\": %.6g, \"requests_per_s\": %.6g, "
      "\"output_tokens_per_s\": %.6g, \"prompt_tokens\": %d, "
      "\"output_tokens\": %d, \"ttft_s\": %s, \"tpot_s\": %s, \"itl_s\": %s, "
      "\"e2e_s\": %s, \"queueing_s\": %s, \"steps\": %d, "
      "\"stage_utilization\": %.6g, \"max_running\": %d, "
      "\"preempted_swap\": %d, \"preempted_recompute\": %d, "
      "\"prefix_hit_tokens\": %d, "
      "\"device_kv_mean\": %.6g, \"device_kv_peak\": %.6g, "
      "\"host_kv_mean\": %.6g, \"host_kv_peak\": %.6g, "
      "\"slo_attainment\": %.6g, \"goodput_rps\": %.6g, "
      "\"planner_wall_s\": %.6g, \"leaked_blocks\": %d, \"wall_s\": %.6g, "
      "\"cp_bytes_per_rank\": {\"all_gather\": %.17g, \"all_reduce\": "
      "%.17g}, \"spec\": {\"verifications\": %d, \"drafted\": %d, "
      "\"kept\": %d}}",
      r.requests, r.finished, refused, r.duration, r.request_rate(),
      r.output_token_rate(), r.prompt_tokens, r.output_tokens,
      PercentilesJson(r.ttft), PercentilesJson(r.tpot), PercentilesJson(r.itl),
      PercentilesJson(r.e2e), PercentilesJson(r.queueing), r.steps,
      r.stage_utilization, r.max_running, r.preempted_swap,
      r.preempted_recompute, r.prefix_hit_tokens, r.device_kv_mean,
      r.device_kv_peak, r.host_kv_mean, r.host_kv_peak, r.slo_attainment,
      r.goodput, r.planner_wall_seconds, r.leaked_blocks, r.wall_seconds,
      r.cp_bytes.all_gather, r.cp_bytes.all_reduce, r.spec_verifications,
      r.spec_drafted, r.spec_kept);
}

}  // namespace shardlm
