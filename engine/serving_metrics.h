// What an operator watches, in Prometheus form (docs/metrics.md): latency
// histograms per request (queue, time to first token, inter-token,
// end-to-end, prefill, decode), requests by API and outcome, tokens by API,
// refusals, and this process's memory against its cgroup limit.
//
// The scheduler records every request's life here (every request ends in
// Scheduler::Finish, whatever the API), so both APIs are counted alike.
#ifndef SHARDLM_ENGINE_SERVING_METRICS_H_
#define SHARDLM_ENGINE_SERVING_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/block_manager.h"
#include "engine/step_executor.h"

namespace shardlm {

// Which API a request came through (a label of the request counters).
enum class RequestApi { kDirect, kGrpc, kHttp };
inline constexpr int kNumRequestApis = 3;
const char* RequestApiName(RequestApi api);

// How a request ended.
enum class RequestOutcome { kStop, kLength, kCancelled, kDeadline, kError };
inline constexpr int kNumRequestOutcomes = 5;
const char* RequestOutcomeName(RequestOutcome outcome);

// Why a request was refused before it was queued.
enum class Refusal { kQueueFull, kInvalid };
inline constexpr int kNumRefusals = 2;

// A Prometheus histogram with fixed upper bounds (seconds). Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // One per bound, then +Inf.
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;
  // HELP, TYPE, the _bucket series (le="..." and "+Inf"), _sum and _count.
  void AppendPrometheus(std::string& out, const std::string& name,
                        const std::string& help) const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  // Per bucket (not cumulative), then +Inf.
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// Buckets that resolve 1 ms to 60 s (latencies).
const std::vector<double>& LatencyBuckets();

// One finished request, as the scheduler saw it. Times in seconds since
// the request was submitted; absent when the request never got that far.
struct RequestRecord {
  RequestApi api = RequestApi::kDirect;
  RequestOutcome outcome = RequestOutcome::kLength;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  std::optional<double> started;      // First scheduled into a step.
  std::optional<double> first_token;  // Its first token.
  std::optional<double> last_token;
  double done = 0;
};

class ServingMetrics {
 public:
  ServingMetrics();

  void RequestFinished(const RequestRecord& r);
  // The gap between two consecutive tokens of one request.
  void InterTokenGap(double seconds) { inter_token_.Observe(seconds); }
  void Refused(RequestApi api, Refusal why);
  // How long a failure paused the engine (until the cluster re-formed).
  void Paused(double seconds) { pause_.Observe(seconds); }

  // Every series, in Prometheus text format.
  std::string Prometheus() const;

  // For tests: the count of requests with this API and outcome.
  uint64_t requests(RequestApi api, RequestOutcome outcome) const;

 private:
  Histogram queue_, ttft_, inter_token_, e2e_, prefill_, decode_, pause_;
  std::array<std::array<std::atomic<uint64_t>, kNumRequestOutcomes>,
             kNumRequestApis>
      requests_{};
  std::array<std::atomic<uint64_t>, kNumRequestApis> prompt_tokens_{},
      generated_tokens_{};
  std::array<std::array<std::atomic<uint64_t>, kNumRefusals>, kNumRequestApis>
      refused_{};
};

// Per-rank series (shardlm_rank_*, label rank="N") for `ranks`: up, memory
// and its limit, heartbeat age, weight and KV bytes, steps and seconds in
// steps, communication and tier copies, and the seconds computing (label
// stage too: ranks 1..tp are stage 0, and so on), whose rate is the rank's
// busy fraction.
void AppendRankMetrics(std::string& out, const std::vector<RankReport>& ranks,
                       int tp = 1);

// shardlm_kv_cp_rank_blocks{cp_rank,tier,state}: the KV blocks of each CP
// rank (entry r of `device` and `host`) by tier and state, as
// shardlm_kv_blocks counts the group's. Nothing when both are empty.
void AppendCpRankKvMetrics(std::string& out,
                           const std::vector<TierUsage>& device,
                           const std::vector<TierUsage>& host);

// shardlm's version (the project's, at configure time).
struct SchedulerStats;  // engine/batch_planner.h

// One Prometheus metric: its HELP and TYPE lines, then a sample per labels
// (empty: none).
void AppendMetric(std::string& out, const char* name, const char* type,
                  const char* help,
                  std::vector<std::pair<std::string, int64_t>> values);
// The scheduler's figures: requests, KV blocks, steps, computed tokens,
// preemptions and speculative decoding.
void AppendSchedulerMetrics(std::string& out, const SchedulerStats& s);
// Interruptions and what recovering from them cost, and KV blocks moved
// between tiers.
void AppendRecoveryMetrics(std::string& out, const SchedulerStats& s);
// The KV slots sequences hold, and how fragmented they are.
void AppendKvSlotMetrics(std::string& out, const SchedulerStats& s);

const char* ShardlmVersion();

// shardlm_build_info{version,commit,backend,precision,kv_cache_dtype,ranks}
// 1.
void AppendBuildInfo(std::string& out, const std::string& backend,
                     const std::string& precision,
                     const std::string& kv_cache_dtype, int ranks);

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_SERVING_METRICS_H_
