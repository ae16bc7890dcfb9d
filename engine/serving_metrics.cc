#include "engine/serving_metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/process_memory.h"
#include "engine/batch_planner.h"

#ifndef SHARDLM_VERSION
#define SHARDLM_VERSION "unknown"
#endif
#ifndef SHARDLM_COMMIT
#define SHARDLM_COMMIT "unknown"
#endif

namespace shardlm {

const char* RequestApiName(RequestApi api) {
  switch (api) {
    case RequestApi::kDirect:
      return "direct";
    case RequestApi::kGrpc:
      return "grpc";
    case RequestApi::kHttp:
      return "http";
  }
  return "?";
}

const char* RequestOutcomeName(RequestOutcome outcome) {
  switch (outcome) {
    case RequestOutcome::kStop:
      return "stop";
    case RequestOutcome::kLength:
      return "length";
    case RequestOutcome::kCancelled:
      return "cancelled";
    case RequestOutcome::kDeadline:
      return "deadline";
    case RequestOutcome::kError:
      return "error";
  }
  return "?";
}

namespace {

const char* RefusalName(int r) {
  return r == static_cast<int>(Refusal::kQueueFull) ? "queue_full" : "invalid";
}

// Integers exactly (byte counts), others to 10 significant digits.
std::string Number(double v) {
  if (std::floor(v) == v && std::abs(v) < 9e15) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  return absl::StrFormat("%.10g", v);
}

void Header(std::string& out, const std::string& name, const char* type,
            const std::string& help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                  type, "\n");
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}

void Histogram::Observe(double value) {
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  absl::MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s{.bounds = bounds_};
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (uint64_t c : counts_) {
    total += c;
    s.cumulative.push_back(total);
  }
  s.sum = sum_;
  s.count = total;
  return s;
}

void Histogram::AppendPrometheus(std::string& out, const std::string& name,
                                 const std::string& help) const {
  const Snapshot s = Read();
  Header(out, name, "histogram", help);
  for (size_t b = 0; b < s.bounds.size(); ++b) {
    absl::StrAppend(&out, name, "_bucket{le=\"", Number(s.bounds[b]), "\"} ",
                    s.cumulative[b], "\n");
  }
  absl::StrAppend(&out, name, "_bucket{le=\"+Inf\"} ", s.count, "\n", name,
                  "_sum ", Number(s.sum), "\n", name, "_count ", s.count, "\n");
}

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> buckets = {
      0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
      0.15,  0.2,    0.3,   0.4,  0.5,  0.75, 1.0,  1.5,  2.0,
      3.0,   5.0,    7.5,   10.0, 15.0, 20.0, 30.0, 45.0, 60.0};
  return buckets;
}

ServingMetrics::ServingMetrics()
    : queue_(LatencyBuckets()),
      ttft_(LatencyBuckets()),
      inter_token_(LatencyBuckets()),
      e2e_(LatencyBuckets()),
      prefill_(LatencyBuckets()),
      decode_(LatencyBuckets()),
      pause_({0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300}) {}

void ServingMetrics::RequestFinished(const RequestRecord& r) {
  const int api = static_cast<int>(r.api);
  ++requests_[api][static_cast<int>(r.outcome)];
  prompt_tokens_[api] += r.prompt_tokens;
  generated_tokens_[api] += r.generated_tokens;
  e2e_.Observe(r.done);
  if (r.started) {
    queue_.Observe(*r.started);
    if (r.first_token) prefill_.Observe(*r.first_token - *r.started);
  }
  if (r.first_token) {
    ttft_.Observe(*r.first_token);
    if (r.last_token) decode_.Observe(*r.last_token - *r.first_token);
  }
}

void ServingMetrics::Refused(RequestApi api, Refusal why) {
  ++refused_[static_cast<int>(api)][static_cast<int>(why)];
}

uint64_t ServingMetrics::requests(RequestApi api,
                                  RequestOutcome outcome) const {
  return requests_[static_cast<int>(api)][static_cast<int>(outcome)].load();
}

std::string ServingMetrics::Prometheus() const {
  std::string out;
  queue_.AppendPrometheus(
      out, "shardlm_request_queue_seconds",
      "From submission until the request was first scheduled into a step.");
  ttft_.AppendPrometheus(out, "shardlm_time_to_first_token_seconds",
                         "From submission to the first generated token.");
  inter_token_.AppendPrometheus(
      out, "shardlm_inter_token_latency_seconds",
      "Between consecutive generated tokens of one request.");
  e2e_.AppendPrometheus(out, "shardlm_request_e2e_seconds",
                        "From submission to the end, whatever the outcome.");
  prefill_.AppendPrometheus(
      out, "shardlm_request_prefill_seconds",
      "From first scheduled to the first token (prompt processing).");
  decode_.AppendPrometheus(out, "shardlm_request_decode_seconds",
                           "From the first token to the last.");
  pause_.AppendPrometheus(
      out, "shardlm_interruption_pause_seconds",
      "How long a failed rank paused the engine until the cluster re-formed "
      "(coordinator --rejoin); its requests resume after it.");
  Header(out, "shardlm_requests_total", "counter",
         "Finished requests by API and outcome (stop, length, cancelled, "
         "deadline, error).");
  for (int a = 0; a < kNumRequestApis; ++a) {
    for (int o = 0; o < kNumRequestOutcomes; ++o) {
      absl::StrAppend(&out, "shardlm_requests_total{api=\"",
                      RequestApiName(static_cast<RequestApi>(a)),
                      "\",finish_reason=\"",
                      RequestOutcomeName(static_cast<RequestOutcome>(o)),
                      "\"} ", requests_[a][o].load(), "\n");
    }
  }
  Header(out, "shardlm_requests_refused_total", "counter",
         "Requests refused before queueing: queue_full (max_queued "
         "requests wait) or invalid (including prompts the KV cache can "
         "never hold).");
  for (int a = 0; a < kNumRequestApis; ++a) {
    for (int r = 0; r < kNumRefusals; ++r) {
      absl::StrAppend(&out, "shardlm_requests_refused_total{api=\"",
                      RequestApiName(static_cast<RequestApi>(a)),
                      "\",reason=\"", RefusalName(r), "\"} ",
                      refused_[a][r].load(), "\n");
    }
  }
  Header(out, "shardlm_prompt_tokens_total", "counter",
         "Prompt tokens of finished requests, by API.");
  for (int a = 0; a < kNumRequestApis; ++a) {
    absl::StrAppend(&out, "shardlm_prompt_tokens_total{api=\"",
                    RequestApiName(static_cast<RequestApi>(a)), "\"} ",
                    prompt_tokens_[a].load(), "\n");
  }
  Header(out, "shardlm_generation_tokens_total", "counter",
         "Generated tokens of finished requests, by API.");
  for (int a = 0; a < kNumRequestApis; ++a) {
    absl::StrAppend(&out, "shardlm_generation_tokens_total{api=\"",
                    RequestApiName(static_cast<RequestApi>(a)), "\"} ",
                    generated_tokens_[a].load(), "\n");
  }
  Header(out, "shardlm_process_resident_memory_bytes", "gauge",
         "Resident memory of the coordinator process.");
  absl::StrAppend(&out, "shardlm_process_resident_memory_bytes ",
                  ResidentMemoryBytes(), "\n");
  if (std::optional<int64_t> limit = CgroupMemoryLimitBytes()) {
    Header(out, "shardlm_process_memory_limit_bytes", "gauge",
           "The memory limit of the coordinator's cgroup (memory.max); "
           "absent when unlimited.");
    absl::StrAppend(&out, "shardlm_process_memory_limit_bytes ", *limit, "\n");
  }
  return out;
}

void AppendRankMetrics(std::string& out, const std::vector<RankReport>& ranks,
                       int tp) {
  if (ranks.empty()) return;
  const auto series = [&](const char* name, const char* type, const char* help,
                          auto value) {
    bool header = false;
    for (const RankReport& r : ranks) {
      const std::optional<double> v = value(r);
      if (!v) continue;
      if (!header) Header(out, name, type, help);
      header = true;
      absl::StrAppend(&out, name, "{rank=\"", r.rank, "\"} ", Number(*v), "\n");
    }
  };
  using V = std::optional<double>;
  series("shardlm_rank_up", "gauge",
         "1 while the rank is ready and alive, else 0.",
         [](const RankReport& r) -> V { return r.up ? 1 : 0; });
  series("shardlm_rank_resident_memory_bytes", "gauge",
         "Resident memory of the rank's process (from its heartbeats).",
         [](const RankReport& r) -> V {
           if (!r.resident_bytes) return std::nullopt;
           return static_cast<double>(*r.resident_bytes);
         });
  series("shardlm_rank_memory_limit_bytes", "gauge",
         "The memory limit of the rank's cgroup; absent when unlimited.",
         [](const RankReport& r) -> V {
           if (!r.memory_limit_bytes) return std::nullopt;
           return static_cast<double>(*r.memory_limit_bytes);
         });
  series("shardlm_rank_gpu_memory_used_bytes", "gauge",
         "Memory in use on the rank's GPU (by every process), on CUDA.",
         [](const RankReport& r) -> V {
           if (!r.gpu_memory_used_bytes) return std::nullopt;
           return static_cast<double>(*r.gpu_memory_used_bytes);
         });
  series("shardlm_rank_gpu_memory_total_bytes", "gauge",
         "Memory of the rank's GPU, on CUDA.", [](const RankReport& r) -> V {
           if (!r.gpu_memory_total_bytes) return std::nullopt;
           return static_cast<double>(*r.gpu_memory_total_bytes);
         });
  series("shardlm_rank_heartbeat_age_seconds", "gauge",
         "Seconds since the rank's last message to the coordinator.",
         [](const RankReport& r) { return V(r.heartbeat_age_seconds); });
  series("shardlm_rank_weight_bytes", "gauge",
         "Bytes of the rank's shard of the weights in memory.",
         [](const RankReport& r) -> V {
           if (r.weight_bytes <= 0) return std::nullopt;
           return static_cast<double>(r.weight_bytes);
         });
  bool kv_header = false;
  for (const RankReport& r : ranks) {
    if (r.kv_bytes <= 0) continue;
    if (!kv_header) {
      Header(out, "shardlm_rank_kv_cache_bytes", "gauge",
             "Bytes of the rank's KV pool by tier (device; host: the CPU "
             "offload tier).");
    }
    kv_header = true;
    absl::StrAppend(&out, "shardlm_rank_kv_cache_bytes{rank=\"", r.rank,
                    "\",tier=\"device\"} ", r.kv_bytes, "\n",
                    "shardlm_rank_kv_cache_bytes{rank=\"", r.rank,
                    "\",tier=\"host\"} ", r.host_kv_bytes, "\n");
  }
  series("shardlm_rank_steps_total", "counter", "Forward steps the rank ran.",
         [](const RankReport& r) -> V {
           return static_cast<double>(r.stats.steps);
         });
  series("shardlm_rank_step_seconds_total", "counter",
         "Seconds the rank spent in forward steps.",
         [](const RankReport& r) -> V { return r.stats.forward_seconds; });
  series("shardlm_rank_communication_seconds_total", "counter",
         "Seconds of those in collectives and sends, including waits for "
         "peers (a slower TP rank, the previous stage).",
         [](const RankReport& r) -> V { return r.stats.comm_seconds; });
  bool experts_header = false;
  for (const RankReport& r : ranks) {
    if (r.stats.expert_tokens.empty()) continue;
    if (!experts_header) {
      Header(out, "shardlm_rank_expert_tokens_total", "counter",
             "Tokens routed to each expert the rank holds, over its layers: "
             "a mixture's load by expert (imbalance shows as uneven rates).");
    }
    experts_header = true;
    for (size_t e = 0; e < r.stats.expert_tokens.size(); ++e) {
      absl::StrAppend(&out, "shardlm_rank_expert_tokens_total{rank=\"", r.rank,
                      "\",expert=\"", r.stats.expert_begin + e, "\"} ",
                      r.stats.expert_tokens[e], "\n");
    }
  }
  series("shardlm_rank_kv_copy_seconds_total", "counter",
         "Seconds of those in KV block copies between tiers.",
         [](const RankReport& r) -> V { return r.stats.copy_seconds; });
  // Busy: in a step and not waiting in a collective or for the previous
  // stage. Its rate is the busy fraction; 1 minus it, the idle fraction.
  Header(out, "shardlm_rank_compute_seconds_total", "counter",
         "Seconds the rank computed: step seconds less communication and "
         "the waits in it. rate() is its busy fraction, by pipeline stage.");
  for (const RankReport& r : ranks) {
    absl::StrAppend(
        &out, "shardlm_rank_compute_seconds_total{rank=\"", r.rank,
        "\",stage=\"", (r.rank - 1) / std::max(1, tp), "\"} ",
        Number(std::max(0.0, r.stats.forward_seconds - r.stats.comm_seconds)),
        "\n");
  }
}

void AppendCpRankKvMetrics(std::string& out,
                           const std::vector<TierUsage>& device,
                           const std::vector<TierUsage>& host) {
  if (device.empty() && host.empty()) return;
  Header(out, "shardlm_kv_cp_rank_blocks", "gauge",
         "KV blocks of each CP rank by tier and state (used: held by "
         "sequences; cached: kept for prefix hits); they sum to "
         "shardlm_kv_blocks.");
  for (const bool is_host : {false, true}) {
    const std::vector<TierUsage>& tier = is_host ? host : device;
    for (size_t r = 0; r < tier.size(); ++r) {
      const std::pair<const char*, int32_t> states[] = {
          {"used", tier[r].used},
          {"cached", tier[r].cached},
          {"free", tier[r].free}};
      for (const auto& [state, n] : states) {
        absl::StrAppend(&out, "shardlm_kv_cp_rank_blocks{cp_rank=\"", r,
                        "\",tier=\"", is_host ? "host" : "device",
                        "\",state=\"", state, "\"} ", n, "\n");
      }
    }
  }
}

const char* ShardlmVersion() { return SHARDLM_VERSION; }

void AppendBuildInfo(std::string& out, const std::string& backend,
                     const std::string& precision,
                     const std::string& kv_cache_dtype, int ranks) {
  Header(out, "shardlm_build_info", "gauge",
         "Always 1; the labels say what runs: version, git commit (at "
         "configure time), backend, precision of the CPU matrix products "
         "(exact or fast), KV cache dtype, worker ranks.");
  absl::StrAppend(&out, "shardlm_build_info{version=\"", SHARDLM_VERSION,
                  "\",commit=\"", SHARDLM_COMMIT, "\",backend=\"", backend,
                  "\",precision=\"", precision, "\",kv_cache_dtype=\"",
                  kv_cache_dtype, "\",ranks=\"", ranks, "\"} 1\n");
}

// One Prometheus metric: its HELP and TYPE lines, then a sample per
// labels (empty: none).
void AppendMetric(std::string& out, const char* name, const char* type,
                  const char* help,
                  std::vector<std::pair<std::string, int64_t>> values) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                  type, "\n");
  for (const auto& [labels, v] : values) {
    absl::StrAppend(&out, name, labels.empty() ? "" : "{", labels,
                    labels.empty() ? "" : "}", " ", v, "\n");
  }
}

// The scheduler's figures: requests, KV blocks, steps, computed tokens,
// preemptions and speculative decoding.
void AppendSchedulerMetrics(std::string& out, const SchedulerStats& s) {
  AppendMetric(
      out, "shardlm_requests", "gauge", "Requests by state.",
      {{"state=\"running\"", s.running}, {"state=\"waiting\"", s.waiting}});
  AppendMetric(out, "shardlm_kv_blocks", "gauge",
               "KV blocks by tier and state (used: held by sequences; cached: "
               "kept for prefix hits).",
               {{"tier=\"device\",state=\"used\"", s.device.used},
                {"tier=\"device\",state=\"cached\"", s.device.cached},
                {"tier=\"device\",state=\"free\"", s.device.free},
                {"tier=\"host\",state=\"used\"", s.host.used},
                {"tier=\"host\",state=\"cached\"", s.host.cached},
                {"tier=\"host\",state=\"free\"", s.host.free}});
  AppendCpRankKvMetrics(out, s.device_by_cp_rank, s.host_by_cp_rank);
  AppendMetric(out, "shardlm_steps_total", "counter", "Forward steps run.",
               {{"", s.steps}});
  AppendMetric(out, "shardlm_steps_in_flight", "gauge",
               "Steps submitted whose tokens are not back yet (pipeline stages "
               "working at once): now, and the most so far.",
               {{"which=\"now\"", s.steps_in_flight},
                {"which=\"max\"", s.max_steps_in_flight}});
  AppendMetric(out, "shardlm_computed_tokens_total", "counter",
               "Tokens run through the model (prefix-cache hits are not).",
               {{"", s.computed_tokens}});
  AppendMetric(out, "shardlm_preemptions_total", "counter",
               "Preemptions by kind.",
               {{"kind=\"swap\"", s.preempted_swap},
                {"kind=\"recompute\"", s.preempted_recompute}});
  if (!s.spec_kept_histogram.empty()) {
    AppendMetric(out, "shardlm_spec_tokens_total", "counter",
                 "Speculative decoding: tokens drafted, and those the model's "
                 "samples confirmed (kept).",
                 {{"kind=\"drafted\"", s.spec_drafted},
                  {"kind=\"kept\"", s.spec_accepted}});
    AppendMetric(out, "shardlm_spec_verifications_total", "counter",
                 "Speculative decoding: a sequence's drafts checked in a step.",
                 {{"", s.spec_verifications}});
    std::vector<std::pair<std::string, int64_t>> kept;
    for (size_t k = 0; k < s.spec_kept_histogram.size(); ++k) {
      kept.push_back(
          {absl::StrCat("kept=\"", k, "\""), s.spec_kept_histogram[k]});
    }
    AppendMetric(
        out, "shardlm_spec_kept_drafts", "counter",
        "Speculative decoding: verifications by how many of their drafts "
        "were kept (each also yields one more token, sampled).",
        std::move(kept));
  }
}

// Interruptions and what recovering from them cost, and KV blocks moved
// between tiers.
void AppendRecoveryMetrics(std::string& out, const SchedulerStats& s) {
  AppendMetric(out, "shardlm_interruptions_total", "counter",
               "Failed steps (a lost rank) after which the requests holding KV "
               "were kept to resume (coordinator --rejoin).",
               {{"", s.interruptions}});
  AppendMetric(out, "shardlm_resumed_requests_total", "counter",
               "Requests put back in the queue after an interruption, to be "
               "recomputed from their tokens.",
               {{"", s.resumed}});
  AppendMetric(out, "shardlm_recomputed_tokens_total", "counter",
               "Tokens of KV lost to interruptions (recomputed on resuming).",
               {{"", s.recomputed_tokens}});
  AppendMetric(
      out, "shardlm_kv_checksum_failures_total", "counter",
      "Steps in which a KV block copied back from the host tier failed "
      "its checksum (--kv-checksum): their sequences were recomputed.",
      {{"", s.kv_checksum_failures}});
  AppendMetric(out, "shardlm_kv_blocks_moved_total", "counter",
               "KV blocks copied between tiers.",
               {{"kind=\"swap_out\"", s.blocks.swapped_out},
                {"kind=\"swap_in\"", s.blocks.swapped_in},
                {"kind=\"spill\"", s.blocks.spilled},
                {"kind=\"offload\"", s.offloaded}});
}

// The KV slots sequences hold, and how fragmented they are.
void AppendKvSlotMetrics(std::string& out, const SchedulerStats& s) {
  AppendMetric(
      out, "shardlm_kv_slots", "gauge",
      "Token slots of the KV blocks sequences hold, and how many hold a "
      "token (see shardlm_kv_fragmentation_ratio).",
      {{"state=\"allocated\"", s.kv_slots_allocated},
       {"state=\"filled\"", s.kv_slots_filled}});
  absl::StrAppend(
      &out,
      "# HELP shardlm_kv_fragmentation_ratio Slots allocated but not filled "
      "over slots allocated (0 when none is allocated).\n"
      "# TYPE shardlm_kv_fragmentation_ratio gauge\n"
      "shardlm_kv_fragmentation_ratio ",
      s.kv_slots_allocated == 0
          ? 0.0
          : 1.0 - static_cast<double>(s.kv_slots_filled) /
                      static_cast<double>(s.kv_slots_allocated),
      "\n");
}

}  // namespace shardlm
