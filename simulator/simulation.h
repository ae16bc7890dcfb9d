// shardlm simulate: the real planner (BatchPlanner and BlockManager, the
// code behind every Engine) driven by simulated workers on a virtual clock.
// Each replica plans steps exactly as the Scheduler's loop does (admit,
// fill the pipeline up to max_steps_in_flight, collect the oldest, apply),
// a CostModel says how long each pipeline stage takes on a step, and the
// stages are busy one step at a time, so PP overlap, queueing, preemption
// and KV tiers come out of the real decisions. Requests are routed to R
// replicas round-robin or to the one with the most free KV.
#ifndef SHARDLM_SIMULATOR_SIMULATION_H_
#define SHARDLM_SIMULATOR_SIMULATION_H_

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/batch_planner.h"
#include "router/routing_policy.h"
#include "simulator/cost_model.h"

namespace shardlm {

struct SimRequest {
  double arrival = 0;  // Seconds from the start.
  int32_t prompt_tokens = 1;
  int32_t output_tokens = 1;  // Generated exactly (no stop token).
  int32_t priority = 0;
};

// A length distribution: "N" or "fixed:N", "uniform:A:B" (inclusive),
// "lognormal:MEDIAN:SIGMA" (clamped to [1, 1,048,576]).
class LengthDistribution {
 public:
  static absl::StatusOr<LengthDistribution> Parse(const std::string& text);
  int32_t Draw(std::mt19937_64& rng) const;
  double Mean() const;
  const std::string& text() const { return text_; }

 private:
  enum class Kind { kFixed, kUniform, kLognormal };
  Kind kind_ = Kind::kFixed;
  double a_ = 1, b_ = 1;
  std::string text_;
};

// Poisson arrivals at `rate` per second over [0, duration).
std::vector<SimRequest> PoissonTrace(double rate, double duration,
                                     const LengthDistribution& prompt,
                                     const LengthDistribution& output,
                                     uint64_t seed);
// A CSV trace: one request per line, `arrival_seconds,prompt_tokens,
// output_tokens[,priority]`; blank lines, '#' comments and a header line
// (one starting with a letter) are skipped. Arrivals must not decrease.
// InvalidArgument naming the line otherwise.
absl::StatusOr<std::vector<SimRequest>> ReadTraceCsv(const std::string& path);

// kRoundRobin, kKv and kLeastLoad are the router's policies
// (router/routing_policy.h, the library `shardlm router` runs), fed each
// replica's load and, for kKv, its prefix cache's keys as the block
// manager reports them (exact and at once; the real router hears of them
// within ~20 ms). kLeastKv (most free device blocks, then the shortest
// queue) is the simulator's own, kept as the default so that the
// validated figures (bench/simulator_validation.py) stay as they were.
enum class Router { kRoundRobin, kLeastKv, kKv, kLeastLoad };

struct SimOptions {
  int replicas = 1;
  // Per replica; the real default is the stage count.
  int max_steps_in_flight = 1;
  BatchLimits scheduler;
  int32_t block_size = 16;
  int64_t device_blocks = 0;  // KV blocks per replica (every rank's).
  int64_t host_blocks = 0;    // CPU offload tier.
  bool prefix_caching = false;
  int64_t context_length = 0;  // Longest prompt + output; 0: no limit.
  Router router = Router::kRoundRobin;
  RoutingOptions routing;  // kKv's load bound (its kind is `router`).
  // Shared prefixes: request i's first shared_prefix_tokens tokens are
  // those of group i mod prefix_groups (seeded), the rest random; 0: every
  // prompt distinct.
  int32_t shared_prefix_tokens = 0;
  int32_t prefix_groups = 0;
  // > 0: a closed loop of this many clients, as `shardlm bench` runs: each
  // sends the trace's next request (its arrival time ignored) as soon as
  // its previous one ended; all start at 0.
  int concurrency = 0;
  // A closed loop's requests reach the server a seeded uniform [0,
  // client_gap) seconds after their client is free (its round trip).
  // Real requests never arrive at one instant: an idle loop starts a step
  // with the first, and the others wait for the next; with no gap, clients
  // that start or finish together stay in lockstep, prefilled side by side.
  double client_gap = 0;
  // Per-request SLOs for goodput (seconds; 0: none): time to first token,
  // and time per output token after the first.
  double slo_ttft = 0, slo_tpot = 0;
  // Adds the planner's own measured wall time to the virtual clock (the
  // real loop thread spends it between steps).
  bool count_planner_time = false;
  uint64_t seed = 1;
  // Speculative decoding (> 0): every decoding sequence has up to
  // spec_tokens drafts a step, each kept with this probability (given the
  // ones before it), as measured on a real workload; the planner's own
  // policy decides how many to verify (spec_adaptive, as
  // --speculative-adaptive) from the simulated step times.
  double spec_acceptance = 0;
  int spec_tokens = 4;
  bool spec_adaptive = true;
};

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

struct SimReport {
  int64_t requests = 0;  // In the trace.
  int64_t finished = 0;
  std::map<std::string, int64_t> refused;  // By reason.
  double duration = 0;  // Virtual seconds until the last request ended.
  int64_t prompt_tokens = 0, output_tokens = 0;  // Of finished requests.
  Percentiles ttft, tpot, itl, e2e, queueing;    // Seconds.
  int64_t steps = 0;
  int64_t preempted_swap = 0, preempted_recompute = 0;
  // Shares of the KV blocks in use (held by sequences), over replicas;
  // the mean is over time.
  double device_kv_peak = 0, device_kv_mean = 0;
  double host_kv_peak = 0, host_kv_mean = 0;
  int64_t max_running = 0;        // Most sequences one replica ran at once.
  int64_t prefix_hit_tokens = 0;  // Prompt tokens found in prefix caches.
  // Requests (of the trace) that finished meeting every SLO set, and their
  // rate; without SLOs every finished request counts.
  bool slo_set = false;
  double slo_attainment = 0, goodput = 0;
  // Stage busy time over duration x stages, averaged over replicas.
  double stage_utilization = 0;
  // The planner's own cost on this machine.
  double planner_wall_seconds = 0;
  int64_t leaked_blocks = 0;  // Held once every request ended: must be 0.
  // Context parallel: what one CP rank sent to its peers (CpBytes: each
  // peer's copy counted), summed over the pipeline stages, the steps and
  // the replicas; at PP 1 with one replica, what each CP rank sends.
  CpBytes cp_bytes;
  // Speculative decoding: verifications, tokens drafted and kept.
  int64_t spec_verifications = 0, spec_drafted = 0, spec_kept = 0;
  double wall_seconds = 0;

  double request_rate() const { return duration > 0 ? finished / duration : 0; }
  double output_token_rate() const {
    return duration > 0 ? output_tokens / duration : 0;
  }
};

// Runs `trace` (sorted by arrival) to the end of its last request.
// `cost` has one stage per pipeline stage; vocab_size bounds token ids.
absl::StatusOr<SimReport> Simulate(const CostModel& cost,
                                   const SimOptions& options,
                                   int64_t vocab_size,
                                   const std::vector<SimRequest>& trace);

std::string FormatReport(const SimReport& r);
std::string ReportJson(const SimReport& r);

}  // namespace shardlm

#endif  // SHARDLM_SIMULATOR_SIMULATION_H_
