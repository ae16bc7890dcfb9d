// shardlm simulate: capacity planning with the real planner on simulated
// hardware (simulator/simulation.h). One layout, or with --sweep every
// TP x PP combination, each at the fewest replicas that meet the SLOs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/dtype.h"
#include "core/status.h"
#include "launch/commands.h"
#include "launch/flags.h"
#include "model/safetensors.h"
#include "model/shard_plan.h"
#include "model/weight_source.h"
#include "simulator/simulation.h"
#include "worker/activation_memory.h"
#include "worker/kv_pool.h"

namespace shardlm {
namespace {

struct SimulateFlags {
  std::string model_config;
  int64_t tp = 1, pp = 1, replicas = 1;
  int64_t cp = 1;  // Context parallel (issue #35).
  std::string cp_link;
  double cp_link_alpha = -1;  // Calibration: replaces the CP link's alpha.
  std::string cp_exchange_dtype = "f32";
  bool cp_scatter_outputs = false;
  std::string gpu = "h100";
  // Calibrated rates that replace the profile's (efficiency 1).
  double memory_bandwidth = 0, peak_flops = 0, step_overhead = -1;
  double matvec_flops = 0, matvec_batch_flops = 0, dequantize_rate = -1;
  double matvec_attention_flops = 0, matvec_small_batch_flops = 0;
  double matvec_batch_attention_flops = 0;
  std::string trace;
  double poisson = 0;
  int64_t concurrency = 0;
  double client_gap = 0.001;
  int64_t requests = 256;
  std::string prompt_len = "lognormal:512:1.0";
  std::string output_len = "lognormal:128:0.7";
  double duration = 60;
  int64_t kv_cache_bytes = 0;
  double memory_utilization = 0.9;
  int64_t cpu_offload_bytes = 0;
  int64_t max_batched_tokens = 2048;
  int64_t max_seqs = 256;
  int64_t max_queued = 100000;
  int64_t block_size = 16;
  int64_t max_steps_in_flight = 0;
  std::string weight_dtype = "bf16";
  std::string kv_cache_dtype = "bf16";
  std::string tp_link, pp_link, host_link;
  double tp_link_alpha = -1;  // Calibration: replaces the TP link's alpha.
  std::string router = "least-kv";
  bool prefix_caching = false;
  int64_t shared_prefix_tokens = 0;
  int64_t prefix_groups = 0;
  double slo_ttft = 0, slo_tpot = 0, slo_attainment = 0.9;
  std::vector<std::string> sweep;
  int64_t max_gpus = 1024;
  bool count_planner_time = false;
  int64_t seed = 1;
  std::string json;
  // Speculative decoding: the chance a drafted token is kept (0: off), the
  // drafts a sequence has each step, and the planner's adaptive policy.
  double speculative_acceptance = 0;
  int64_t num_speculative_tokens = 4;
  bool speculative_adaptive = true;
};

absl::StatusOr<ModelConfig> LoadConfig(const std::string& spec) {
  if (spec.empty()) {
    return absl::InvalidArgumentError(
        "--model-config is required (a preset, a config.json, a directory "
        "holding one, or a GGUF file)");
  }
  if (absl::StatusOr<ModelConfig> preset = FindModelPreset(spec); preset.ok()) {
    return preset;
  }
  std::error_code ec;
  if (std::filesystem::is_directory(spec, ec)) return ReadHfConfig(spec);
  if (absl::EndsWith(spec, ".json")) {
    return ReadHfConfig(std::filesystem::path(spec).parent_path().string());
  }
  if (std::filesystem::exists(spec, ec)) {
    absl::StatusOr<std::unique_ptr<WeightSource>> w = OpenWeights(spec);
    if (!w.ok()) return w.status();
    return (*w)->config();
  }
  return FindModelPreset(spec).status();  // Lists the presets.
}

// Bytes per weight of a GGUF type named as --weight-dtype takes it (f16,
// q4_k, ...: every type the loader reads).
absl::StatusOr<double> WeightBytesPerParam(const std::string& name) {
  std::string names;
  for (int i = 0; i <= static_cast<int>(DType::kMXFP4); ++i) {
    const DTypeTraits& t = Traits(static_cast<DType>(i));
    if (t.ggml_type < 0) continue;  // Not a weight format.
    std::string n = t.name;
    absl::AsciiStrToLower(&n);
    if (n == name) {
      return static_cast<double>(t.block_bytes) / t.block_elems;
    }
    absl::StrAppend(&names, names.empty() ? "" : ", ", n);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--weight-dtype '", name, "': want one of ", names));
}

// One layout to simulate: the cost model and the KV blocks per replica.
struct Planned {
  std::unique_ptr<RooflineCostModel> cost;
  SimOptions options;
  double activation_bytes = 0;  // Stage 0's step buffers per rank.
};

// The layout's degrees, link profiles and bytes per value, checked against
// the model.
absl::StatusOr<Layout> LayoutOf(const SimulateFlags& f,
                                const ModelConfig& config,
                                const DeviceProfile& device, int tp, int pp) {
  const auto fail = [&](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp ", tp, " x pp ", pp, ": ", parts...));
  };
  if (tp < 1 || pp < 1) return fail("degrees must be at least 1");
  if (tp > config.n_kv_heads) {
    return fail("tp exceeds the ", config.n_kv_heads,
                " KV heads (shardlm splits KV heads across TP ranks)");
  }
  if (pp > config.n_layers) return fail("pp exceeds the layer count");
  if (f.cp < 1 || f.cp > 64) return fail("--cp must be in [1, 64]");
  Layout layout{.tp = tp,
                .pp = pp,
                .cp = static_cast<int>(f.cp),
                .block_size = static_cast<int32_t>(f.block_size)};
  ASSIGN_OR_RETURN(layout.weight_bytes_per_param,
                   WeightBytesPerParam(f.weight_dtype));
  ASSIGN_OR_RETURN(const DType kv, ParseKvCacheDType(f.kv_cache_dtype));
  // int8 KV keeps an f32 scale per token and head (per latent entry under
  // MLA) beside the values.
  layout.kv_bytes_per_value = kv == DType::kI8
                                  ? 1.0 + 4.0 / config.CachedHeadDim()
                                  : static_cast<double>(BlockBytes(kv));
  const bool cpu = device.name.rfind("cpu", 0) == 0;
  const std::string nvlink =
      device.name == "a100" ? "nvlink-a100" : "nvlink-h100";
  const std::string within = cpu ? "shm" : nvlink;
  const std::string across = cpu ? "eth-100g" : "ib-400g";
  ASSIGN_OR_RETURN(layout.tp_link,
                   FindLinkProfile(f.tp_link.empty() ? within : f.tp_link));
  ASSIGN_OR_RETURN(
      layout.pp_link,
      FindLinkProfile(!f.pp_link.empty()                   ? f.pp_link
                      : tp * pp <= device.devices_per_node ? within
                                                           : across));
  ASSIGN_OR_RETURN(
      layout.cp_link,
      FindLinkProfile(!f.cp_link.empty()                          ? f.cp_link
                      : tp * pp * f.cp <= device.devices_per_node ? within
                                                                  : across));
  ASSIGN_OR_RETURN(layout.host_link,
                   FindLinkProfile(!f.host_link.empty()    ? f.host_link
                                   : cpu                   ? "shm"
                                   : device.name == "a100" ? "pcie4"
                                                           : "pcie5"));
  if (f.tp_link_alpha >= 0) layout.tp_link.alpha_seconds = f.tp_link_alpha;
  if (f.cp_link_alpha >= 0) layout.cp_link.alpha_seconds = f.cp_link_alpha;
  if (f.cp_exchange_dtype != "f32" && f.cp_exchange_dtype != "bf16") {
    return fail("--cp-exchange-dtype must be f32 or bf16");
  }
  layout.cp_activation_bytes = f.cp_exchange_dtype == "bf16" ? 2 : 4;
  layout.cp_scatter_outputs = f.cp_scatter_outputs;
  return layout;
}

// The KV blocks every rank holds on the device (`*blocks`) and in the host
// tier (`*host_blocks`); sets p.activation_bytes.
absl::Status CountKvBlocks(const SimulateFlags& f, const ModelConfig& config,
                           const DeviceProfile& device, int tp, int pp,
                           Planned& p, double* blocks, double* host_blocks) {
  const auto fail = [&](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp ", tp, " x pp ", pp, ": ", parts...));
  };
  const bool cpu = device.name.rfind("cpu", 0) == 0;
  // Every rank holds the same number of blocks: the fewest any stage's
  // memory leaves after its weights.
  *blocks = std::numeric_limits<double>::infinity();
  for (int s = 0; s < pp; ++s) {
    const double weights = p.cost->StageWeightBytes(s);
    // A GPU rank reserves its step buffers before sizing KV, as serving
    // does (worker/activation_memory.h). TP rank 0 holds the largest share,
    // split as PlanShards splits: by KV head (query heads follow their
    // group) and by FFN blocks of 32 columns.
    const int64_t kv_heads = EvenSplit(config.n_kv_heads, tp, 0).second;
    const double activations =
        cpu ? 0.0
            : static_cast<double>(GpuActivationBytes(
                  {.hidden = config.hidden,
                   .heads = kv_heads * (config.n_heads / config.n_kv_heads),
                   .kv_heads = kv_heads,
                   .head_dim = config.head_dim,
                   .ffn = 32 * EvenSplit(config.ffn_hidden / 32, tp, 0).second,
                   .vocab_padded = (config.vocab_size + tp - 1) / tp,
                   .tp = tp,
                   .last_stage = s == pp - 1},
                  f.max_batched_tokens, f.max_seqs));
    if (s == 0) p.activation_bytes = activations;
    double kv_bytes = static_cast<double>(f.kv_cache_bytes);
    if (kv_bytes == 0) {
      kv_bytes =
          device.memory_bytes * f.memory_utilization - weights - activations;
      if (kv_bytes <= 0) {
        return fail(absl::StrFormat(
            "stage %d's weights (%.1f GB per rank) and step buffers (%.2f GB) "
            "do not fit in %.0f%% of the %s's %.0f GB",
            s, weights / 1e9, activations / 1e9, 100 * f.memory_utilization,
            device.name, device.memory_bytes / 1e9));
      }
    }
    *blocks = std::min(
        *blocks,
        std::floor(kv_bytes / (f.block_size * p.cost->KvBytesPerToken(s))));
  }
  if (*blocks < 1) return fail("no room for a single KV block");
  *host_blocks = 0;
  if (f.cpu_offload_bytes > 0) {
    *host_blocks = std::numeric_limits<double>::infinity();
    for (int s = 0; s < pp; ++s) {
      *host_blocks =
          std::min(*host_blocks,
                   std::floor(f.cpu_offload_bytes /
                              (f.block_size * p.cost->KvBytesPerToken(s))));
    }
  }
  return absl::OkStatus();
}

// The simulation's options: the flags, and the blocks a rank holds.
void FillSimOptions(const SimulateFlags& f, const ModelConfig& config, int pp,
                    int replicas, double blocks, double host_blocks,
                    SimOptions& o) {
  // The planner counts blocks in 32 bits.
  constexpr double kMaxBlocks = 1 << 30;
  o.replicas = replicas;
  o.max_steps_in_flight =
      f.max_steps_in_flight > 0 ? static_cast<int>(f.max_steps_in_flight) : pp;
  o.scheduler = {
      .max_batched_tokens = static_cast<int32_t>(f.max_batched_tokens),
      .max_seqs = static_cast<int32_t>(f.max_seqs),
      .max_queued = static_cast<int32_t>(f.max_queued)};
  o.block_size = static_cast<int32_t>(f.block_size);
  // Context parallel: each CP rank holds its share of every sequence's
  // blocks, so the replica holds cp times the blocks of one rank.
  o.device_blocks = static_cast<int64_t>(std::min(blocks * f.cp, kMaxBlocks));
  o.host_blocks =
      static_cast<int64_t>(std::min(host_blocks * f.cp, kMaxBlocks));
  o.prefix_caching = f.prefix_caching;
  o.context_length = config.context_length;
  o.router = f.router == "round-robin"  ? Router::kRoundRobin
             : f.router == "kv"         ? Router::kKv
             : f.router == "least-load" ? Router::kLeastLoad
                                        : Router::kLeastKv;
  o.shared_prefix_tokens = static_cast<int32_t>(f.shared_prefix_tokens);
  o.prefix_groups = static_cast<int32_t>(f.prefix_groups);
  o.slo_ttft = f.slo_ttft;
  o.slo_tpot = f.slo_tpot;
  o.count_planner_time = f.count_planner_time;
  o.seed = static_cast<uint64_t>(f.seed);
  o.concurrency = static_cast<int>(f.concurrency);
  o.client_gap = f.client_gap;
  o.spec_acceptance = f.speculative_acceptance;
  o.spec_tokens = static_cast<int>(f.num_speculative_tokens);
  o.spec_adaptive = f.speculative_adaptive;
}

absl::StatusOr<Planned> PlanLayout(const SimulateFlags& f,
                                   const ModelConfig& config,
                                   const DeviceProfile& device, int tp, int pp,
                                   int replicas) {
  ASSIGN_OR_RETURN(const Layout layout, LayoutOf(f, config, device, tp, pp));
  Planned p;
  p.cost = std::make_unique<RooflineCostModel>(config, device, layout);
  double blocks = 0, host_blocks = 0;
  RETURN_IF_ERROR(
      CountKvBlocks(f, config, device, tp, pp, p, &blocks, &host_blocks));
  FillSimOptions(f, config, pp, replicas, blocks, host_blocks, p.options);
  return p;
}

absl::StatusOr<std::vector<int>> ParseList(
    const std::string& key, const std::vector<std::string>& specs) {
  std::vector<int> out;
  for (const std::string& spec : specs) {
    std::pair<std::string, std::string> kv = absl::StrSplit(spec, '=');
    if (kv.first != key) continue;
    for (absl::string_view v : absl::StrSplit(kv.second, ',')) {
      int x = 0;
      if (!absl::SimpleAtoi(v, &x) || x < 1 || x > 4096) {
        return absl::InvalidArgumentError(
            absl::StrCat("--sweep ", spec, ": '", v, "' is not a degree"));
      }
      out.push_back(x);
    }
  }
  return out;
}

void PrintLayout(const char* what, const ModelConfig& config,
                 const DeviceProfile& device, const Planned& p) {
  const Layout& l = p.cost->layout();
  std::printf(
      "%s: %s on %s, tp %d x pp %d x cp %d x %d replicas = %d devices; "
      "%.2f GB of weights and %.2f GB of step buffers per rank (stage 0), "
      "%lld KV blocks of %d tokens per replica (%lld tokens) + %lld host "
      "blocks; links tp %s, pp %s, host %s%s; %d steps in flight\n",
      what,
      config.name.empty() ? config.architecture.c_str() : config.name.c_str(),
      device.name.c_str(), l.tp, l.pp, l.cp, p.options.replicas,
      l.tp * l.pp * l.cp * p.options.replicas,
      p.cost->StageWeightBytes(0) / 1e9, p.activation_bytes / 1e9,
      static_cast<long long>(p.options.device_blocks), p.options.block_size,
      static_cast<long long>(p.options.device_blocks * p.options.block_size),
      static_cast<long long>(p.options.host_blocks), l.tp_link.name.c_str(),
      l.pp_link.name.c_str(), l.host_link.name.c_str(),
      l.cp > 1 ? absl::StrCat(", cp ", l.cp_link.name).c_str() : "",
      p.options.max_steps_in_flight);
}

// Refused requests count against attainment (they met no SLO).
bool MeetsSlo(const SimReport& r, double attainment) {
  return r.slo_attainment >= attainment;
}

// The model, the layout and the device.
void RegisterLayoutFlags(FlagSet& flags, SimulateFlags& f) {
  flags.Add("model-config", &f.model_config, "model preset or config");
  flags.Add("tp", &f.tp, "tensor-parallel degree");
  flags.Add("pp", &f.pp, "pipeline-parallel degree");
  flags.Add("cp", &f.cp,
            "context-parallel degree, as the CPU path runs it: each sequence's "
            "KV split by block over cp ranks that hold the same weights, a "
            "step's tokens split into cp slices for the projections and MLP, "
            "Q/K/V and the partial attention outputs all-gathered "
            "(docs/long-context.md)");
  flags.Add("cp-link", &f.cp_link,
            "link profile between CP ranks (default: the TP link within a "
            "node, ib-400g across nodes)");
  flags.Add("cp-link-alpha", &f.cp_link_alpha,
            "seconds per CP message, replacing the link's (calibration)");
  flags.Add("cp-exchange-dtype", &f.cp_exchange_dtype,
            "f32 (what the CPU path sends) or bf16 (not built): the dtype "
            "of CP's Q/K/V, attention outputs and logit rows");
  flags.Add("cp-scatter-outputs", &f.cp_scatter_outputs,
            "not built, to compare: each CP rank sends each peer only that "
            "peer's slice of its partial attention outputs, not all rows");
  flags.Add("replicas", &f.replicas, "engine replicas behind the router");
  flags.Add("gpu", &f.gpu,
            "device profile: " + absl::StrJoin(DeviceProfileNames(), ", "));
}

// Measured rates that replace the device profile's.
void RegisterCalibrationFlags(FlagSet& flags, SimulateFlags& f) {
  flags.Add("memory-bandwidth", &f.memory_bandwidth,
            "achieved bytes/s, replacing the profile's (calibration)");
  flags.Add("peak-flops", &f.peak_flops,
            "achieved FLOP/s, replacing the profile's (calibration)");
  flags.Add("matvec-flops", &f.matvec_flops,
            "FLOP/s of small-batch CPU kernels (calibration)");
  flags.Add("matvec-batch-flops", &f.matvec_batch_flops,
            "FLOP/s of each token after a small-batch step's first "
            "(calibration)");
  flags.Add("matvec-small-batch-flops", &f.matvec_small_batch_flops,
            "FLOP/s of tokens 2-4 of a small-batch step (calibration)");
  flags.Add("matvec-attention-flops", &f.matvec_attention_flops,
            "FLOP/s of a small-batch CPU step's first token's attention "
            "(calibration)");
  flags.Add("matvec-batch-attention-flops", &f.matvec_batch_attention_flops,
            "FLOP/s of the further tokens' attention in a small-batch CPU "
            "step (calibration)");
  flags.Add("dequantize-rate", &f.dequantize_rate,
            "parameters/s the CPU dequantizes into tiles (calibration)");
  flags.Add("step-overhead", &f.step_overhead,
            "host seconds per step, replacing the profile's (calibration)");
}

// The requests: a trace, or drawn arrivals and lengths.
void RegisterWorkloadFlags(FlagSet& flags, SimulateFlags& f) {
  flags.Add("trace", &f.trace, "CSV trace of requests");
  flags.Add("poisson", &f.poisson, "Poisson arrivals per second");
  flags.Add("concurrency", &f.concurrency,
            "closed loop of this many clients (as shardlm bench), each "
            "sending its next request when its last ends");
  flags.Add("client-gap", &f.client_gap,
            "seconds (at most, uniform) between a --concurrency client's "
            "request ending and its next reaching the server");
  flags.Add("requests", &f.requests,
            "requests of a --concurrency run without --trace");
  flags.Add("duration", &f.duration, "seconds of Poisson arrivals");
  flags.Add("prompt-len", &f.prompt_len, "prompt length distribution");
  flags.Add("output-len", &f.output_len, "output length distribution");
}

// Each replica's memory, scheduler limits, dtypes and links.
void RegisterReplicaFlags(FlagSet& flags, SimulateFlags& f) {
  flags.Add("kv-cache-bytes", &f.kv_cache_bytes,
            "KV cache per rank (0: what --memory-utilization leaves after "
            "the weights and, on GPUs, the step buffers)");
  flags.Add("memory-utilization", &f.memory_utilization,
            "share of device memory for weights, step buffers and KV");
  flags.Add("cpu-offload-bytes", &f.cpu_offload_bytes, "host KV tier per rank");
  flags.Add("max-batched-tokens", &f.max_batched_tokens, "tokens per step");
  flags.Add("max-seqs", &f.max_seqs, "sequences running per replica");
  flags.Add("max-queued", &f.max_queued, "requests waiting per replica");
  flags.Add("block-size", &f.block_size, "tokens per KV block");
  flags.Add("max-steps-in-flight", &f.max_steps_in_flight,
            "steps in flight per replica (0: pp)");
  flags.Add("weight-dtype", &f.weight_dtype,
            "bytes per weight of this GGUF type (f16, bf16, q8_0, q4_k, "
            "iq4_xs, ...: any the loader reads)");
  flags.Add("kv-cache-dtype", &f.kv_cache_dtype, "f32, f16, bf16 or int8");
  flags.Add("tp-link", &f.tp_link,
            "link profile (" + absl::StrJoin(LinkProfileNames(), ", ") +
                "); default NVLink (shm on a CPU)");
  flags.Add("tp-link-alpha", &f.tp_link_alpha,
            "seconds per TP message, replacing the link's (calibration)");
  flags.Add("pp-link", &f.pp_link,
            "default: the TP link within a node, ib-400g across nodes");
  flags.Add("host-link", &f.host_link, "device <-> host tier link");
}

// Routing, prefixes, SLOs, the sweep, speculation and the output.
void RegisterRunFlags(FlagSet& flags, SimulateFlags& f) {
  flags.Add("router", &f.router,
            "least-kv (the simulator's own: most free KV blocks), or the "
            "router's policies kv, least-load, round-robin "
            "(docs/router.md)");
  flags.Add("prefix-caching", &f.prefix_caching,
            "cache prefix blocks (simulated prompts share none unless "
            "--shared-prefix-tokens)");
  flags.Add("shared-prefix-tokens", &f.shared_prefix_tokens,
            "with --prefix-groups: request i's prompt begins with these many "
            "tokens of group i mod G's prefix");
  flags.Add("prefix-groups", &f.prefix_groups,
            "how many distinct shared prefixes (see --shared-prefix-tokens)");
  flags.Add("slo-ttft", &f.slo_ttft, "time-to-first-token SLO, seconds");
  flags.Add("slo-tpot", &f.slo_tpot, "time-per-output-token SLO, seconds");
  flags.Add("slo-attainment", &f.slo_attainment,
            "share of requests that must meet the SLOs (--sweep)");
  flags.Add("sweep", &f.sweep, "tp=LIST or pp=LIST (repeatable)");
  flags.Add("max-gpus", &f.max_gpus, "most devices a --sweep layout may use");
  flags.Add("count-planner-time", &f.count_planner_time,
            "add the planner's measured time on this machine to the clock");
  flags.Add("seed", &f.seed, "seed of arrivals, lengths and prompts");
  flags.Add("speculative-acceptance", &f.speculative_acceptance,
            "speculative decoding: the chance that a drafted token is kept "
            "(as /metrics' shardlm_spec_tokens_total kept / drafted of a "
            "real workload); 0 = off");
  flags.Add("num-speculative-tokens", &f.num_speculative_tokens,
            "speculative decoding: drafts a sequence has each step, 1-16");
  flags.Add("speculative-adaptive", &f.speculative_adaptive,
            "speculative decoding: the planner's policy chooses how many to "
            "verify from the simulated step times (as the server's flag)");
  flags.Add("json", &f.json, "also write the report(s) here as JSON");
}

void RegisterSimulateFlags(FlagSet& flags, SimulateFlags& f) {
  RegisterLayoutFlags(flags, f);
  RegisterCalibrationFlags(flags, f);
  RegisterWorkloadFlags(flags, f);
  RegisterReplicaFlags(flags, f);
  RegisterRunFlags(flags, f);
}

// Empty when the flags make sense together, else the problem.
std::string SimulateProblem(const SimulateFlags& f) {
  if ((f.trace.empty() && f.poisson <= 0 && f.concurrency <= 0) ||
      (!f.trace.empty() && f.poisson > 0) ||
      (f.poisson > 0 && f.concurrency > 0)) {
    return "give one of --trace FILE, --poisson RATE or --concurrency C "
           "(--trace may come with --concurrency)";
  }
  if (!(f.client_gap >= 0 && f.client_gap <= 60)) {
    return "--client-gap must be from 0 to 60 seconds";
  }
  if (!(f.speculative_acceptance >= 0 && f.speculative_acceptance < 1) ||
      f.num_speculative_tokens < 1 || f.num_speculative_tokens > 16) {
    return "--speculative-acceptance must be in [0, 1) and "
           "--num-speculative-tokens in [1, 16]";
  }
  if (f.concurrency < 0 || f.concurrency > 1000000 || f.requests < 1 ||
      f.requests > 100000000) {
    return "--concurrency and --requests must be sane";
  }
  if (f.duration <= 0 || f.duration > 1e7) {
    return "--duration must be in (0, 1e7] seconds";
  }
  if (f.replicas < 1 || f.replicas > 100000 || f.block_size < 1 ||
      f.block_size > 4096 || f.max_batched_tokens < 1 ||
      f.max_batched_tokens > (1 << 24) || f.max_seqs < 1 ||
      f.max_seqs > (1 << 24) || f.max_queued < 0 || f.max_queued > (1 << 30) ||
      f.max_steps_in_flight < 0 || f.max_steps_in_flight > 64 ||
      f.kv_cache_bytes < 0 || f.cpu_offload_bytes < 0 || f.max_gpus < 1) {
    return "--replicas, --block-size, --max-batched-tokens, --max-seqs and "
           "--max-gpus must be positive and sane; byte sizes not negative";
  }
  if (!(f.memory_utilization > 0 && f.memory_utilization <= 1)) {
    return "--memory-utilization must be in (0, 1]";
  }
  if (f.router != "least-kv" && f.router != "round-robin" && f.router != "kv" &&
      f.router != "least-load") {
    return "--router must be least-kv, kv, least-load or round-robin";
  }
  if (f.shared_prefix_tokens < 0 || f.shared_prefix_tokens > (1 << 20) ||
      f.prefix_groups < 0 || f.prefix_groups > (1 << 20)) {
    return "--shared-prefix-tokens and --prefix-groups must be 0..1048576";
  }
  if ((f.shared_prefix_tokens > 0) != (f.prefix_groups > 0)) {
    return "--shared-prefix-tokens and --prefix-groups go together";
  }
  return "";
}

// The --memory-bandwidth, --peak-flops, --matvec-* ... calibration
// replacing the profile's figures.
absl::Status Calibrate(const SimulateFlags& f, DeviceProfile& d) {
  if (f.memory_bandwidth < 0 || f.peak_flops < 0 || f.step_overhead > 10 ||
      f.matvec_flops < 0 || f.matvec_batch_flops < 0 ||
      f.matvec_attention_flops < 0 || f.matvec_small_batch_flops < 0 ||
      f.matvec_batch_attention_flops < 0) {
    return absl::InvalidArgumentError(
        "--memory-bandwidth, --peak-flops and the --matvec-* rates must be "
        "positive, --step-overhead at most "
        "10 s");
  }
  if (f.memory_bandwidth > 0) {
    d.memory_bandwidth = f.memory_bandwidth;
    d.bandwidth_efficiency = 1;
  }
  if (f.peak_flops > 0) {
    d.peak_flops = f.peak_flops;
    d.flops_efficiency = 1;
  }
  if (f.step_overhead >= 0) d.step_overhead_seconds = f.step_overhead;
  if (f.matvec_flops > 0) d.matvec_flops = f.matvec_flops;
  if (f.matvec_batch_flops > 0) {
    d.matvec_batch_flops = f.matvec_batch_flops;
  }
  if (f.matvec_small_batch_flops > 0) {
    d.matvec_small_batch_tokens = kMatvecSmallBatchTokens;
    d.matvec_small_batch_flops = f.matvec_small_batch_flops;
  }
  if (f.matvec_attention_flops > 0) {
    d.matvec_attention_flops = f.matvec_attention_flops;
  }
  if (f.matvec_batch_attention_flops > 0) {
    d.matvec_batch_attention_flops = f.matvec_batch_attention_flops;
  }
  if (f.dequantize_rate >= 0) d.dequantize_rate = f.dequantize_rate;

  return absl::OkStatus();
}

// The requests: --trace, or drawn (--poisson or --concurrency).
absl::StatusOr<std::vector<SimRequest>> MakeTrace(const SimulateFlags& f) {
  std::vector<SimRequest> trace;
  if (!f.trace.empty()) {
    absl::StatusOr<std::vector<SimRequest>> t = ReadTraceCsv(f.trace);
    if (!t.ok()) return t.status();
    return *std::move(t);
  } else {
    absl::StatusOr<LengthDistribution> in =
        LengthDistribution::Parse(f.prompt_len);
    absl::StatusOr<LengthDistribution> out =
        LengthDistribution::Parse(f.output_len);
    if (!in.ok()) return in.status();
    if (!out.ok()) return out.status();
    if (f.poisson > 0) {
      trace = PoissonTrace(f.poisson, f.duration, *in, *out,
                           static_cast<uint64_t>(f.seed));
    } else {
      std::mt19937_64 rng(static_cast<uint64_t>(f.seed));
      for (int64_t i = 0; i < f.requests; ++i) {
        trace.push_back(
            {.prompt_tokens = in->Draw(rng), .output_tokens = out->Draw(rng)});
      }
    }
  }
  return trace;
}

struct SweepRow {
  int tp, pp, replicas;
  SimReport report;
};

// The fewest replicas (up to `most`) at which tp x pp meets the SLOs:
// double, then bisect. None, with `*why_not`, if no count does.
std::optional<SweepRow> FewestReplicas(const SimulateFlags& f,
                                       const ModelConfig& config,
                                       const DeviceProfile& device,
                                       const std::vector<SimRequest>& trace,
                                       int tp, int pp, int most,
                                       std::string* why_not) {
  std::optional<SweepRow> best;
  std::string why;
  const auto run = [&](int replicas) -> std::optional<SimReport> {
    absl::StatusOr<Planned> p = PlanLayout(f, config, device, tp, pp, replicas);
    if (!p.ok()) {
      why = std::string(p.status().message());
      return std::nullopt;
    }
    absl::StatusOr<SimReport> r =
        Simulate(*p->cost, p->options, config.vocab_size, trace);
    if (!r.ok()) {
      why = std::string(r.status().message());
      return std::nullopt;
    }
    return *std::move(r);
  };
  int lo = 0, hi = 1;
  std::optional<SimReport> r;
  for (; hi <= most; hi *= 2) {
    r = run(hi);
    if (!r.has_value()) break;
    if (MeetsSlo(*r, f.slo_attainment)) {
      best = SweepRow{tp, pp, hi, *r};
      break;
    }
    lo = hi;
  }
  if (!best.has_value() && r.has_value() && hi > most && lo < most) {
    hi = most;  // The last try: all that --max-gpus allows.
    r = run(hi);
    if (r.has_value() && MeetsSlo(*r, f.slo_attainment)) {
      best = SweepRow{tp, pp, hi, *r};
    }
  }
  if (!best.has_value()) {
    *why_not = why.empty() ? absl::StrFormat(
                                 "tp %d x pp %d: SLOs not met within %d "
                                 "devices",
                                 tp, pp, most * tp * pp)
                           : why;
    return std::nullopt;
  }
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    std::optional<SimReport> m = run(mid);
    if (m.has_value() && MeetsSlo(*m, f.slo_attainment)) {
      hi = mid;
      best = SweepRow{tp, pp, mid, *m};
    } else {
      lo = mid;
    }
  }
  return best;
}

// The sweep's table, fewest devices first, and the layouts that met no
// SLO; returns the table's JSON.
std::string PrintSweep(const SimulateFlags& f, std::vector<SweepRow>& met,
                       const std::vector<std::string>& skipped) {
  std::sort(met.begin(), met.end(), [](const SweepRow& a, const SweepRow& b) {
    const int ga = a.tp * a.pp * a.replicas, gb = b.tp * b.pp * b.replicas;
    if (ga != gb) return ga < gb;
    return a.report.ttft.p90 < b.report.ttft.p90;
  });
  std::printf(
      "\nlayouts meeting the SLOs (%.0f%% of requests with TTFT <= %g s, "
      "TPOT <= %g s), fewest devices first:\n"
      "  devices   tp   pp replicas  attain  TTFT p90  TPOT p90  "
      "out tok/s\n",
      100 * f.slo_attainment, f.slo_ttft, f.slo_tpot);
  std::string json = "[";
  for (const SweepRow& row : met) {
    std::printf("  %7d %4d %4d %8d  %5.1f%% %8.1fms %8.1fms %10.0f\n",
                row.tp * row.pp * row.replicas, row.tp, row.pp, row.replicas,
                100 * row.report.slo_attainment, 1e3 * row.report.ttft.p90,
                1e3 * row.report.tpot.p90, row.report.output_token_rate());
    absl::StrAppendFormat(
        &json, "%s{\"tp\": %d, \"pp\": %d, \"replicas\": %d, \"report\": %s}",
        json.size() > 1 ? ", " : "", row.tp, row.pp, row.replicas,
        ReportJson(row.report));
  }
  json += "]";
  for (const std::string& s : skipped)
    std::printf("  not met: %s\n", s.c_str());
  if (met.empty()) std::printf("  none\n");
  return json;
}

// --sweep: every TP x PP layout at the fewest replicas that meet the SLOs;
// prints the table and returns its JSON.
absl::StatusOr<std::string> Sweep(const SimulateFlags& f,
                                  const ModelConfig& config,
                                  const DeviceProfile& device,
                                  const std::vector<SimRequest>& trace) {
  absl::StatusOr<std::vector<int>> tps = ParseList("tp", f.sweep);
  absl::StatusOr<std::vector<int>> pps = ParseList("pp", f.sweep);
  if (!tps.ok()) return tps.status();
  if (!pps.ok()) return pps.status();
  if (tps->empty()) tps->push_back(static_cast<int>(f.tp));
  if (pps->empty()) pps->push_back(static_cast<int>(f.pp));
  if (f.slo_ttft <= 0 && f.slo_tpot <= 0) {
    return absl::InvalidArgumentError(
        "--sweep needs --slo-ttft and/or --slo-tpot");
  }
  if (f.cp > 1) {
    return absl::InvalidArgumentError(
        "--sweep counts devices as tp x pp x replicas: run --cp without "
        "--sweep");
  }
  std::vector<SweepRow> met;
  std::vector<std::string> skipped;
  for (int tp : *tps) {
    for (int pp : *pps) {
      const int most = static_cast<int>(f.max_gpus / (tp * pp));
      if (most < 1) continue;
      std::string why_not;
      std::optional<SweepRow> best =
          FewestReplicas(f, config, device, trace, tp, pp, most, &why_not);
      if (!best.has_value()) {
        skipped.push_back(why_not);
        continue;
      }
      met.push_back(*std::move(best));
    }
  }
  return PrintSweep(f, met, skipped);
}

}  // namespace

int SimulateCommand(int argc, char** argv) {
  SimulateFlags f;
  FlagSet flags(
      "usage: shardlm simulate --model-config CONFIG [--tp T --pp P "
      "--replicas R]\n"
      "         [--gpu h100|h200|a100|cpu-this-machine]\n"
      "         (--trace FILE | --poisson RATE --duration S [--prompt-len "
      "DIST --output-len DIST])\n"
      "         [--slo-ttft S --slo-tpot S] [--sweep tp=1,2,4,8 --sweep "
      "pp=1,2,4] [--json OUT]\n"
      "Runs the real scheduler (BatchPlanner, BlockManager) against simulated\n"
      "workers on a virtual clock and reports throughput, latency "
      "percentiles,\n"
      "queueing, preemptions, KV use and goodput. CONFIG is a preset (" +
      absl::StrJoin(ModelPresetNames(), ", ") +
      "), a config.json, a directory holding one, or a GGUF file. DIST is N,\n"
      "uniform:A:B or lognormal:MEDIAN:SIGMA. A trace is CSV lines of\n"
      "arrival_seconds,prompt_tokens,output_tokens[,priority]. With --sweep,\n"
      "every TP x PP layout is run at the fewest replicas (up to --max-gpus)\n"
      "whose SLO attainment reaches --slo-attainment, cheapest first.\n"
      "Figures come from a roofline model (docs/simulator.md says how far\n"
      "to trust them).");
  RegisterSimulateFlags(flags, f);
  const auto usage_error = [&](const std::string& why) {
    std::fprintf(stderr, "shardlm simulate: %s\n\n%s", why.c_str(),
                 flags.Usage().c_str());
    return 2;
  };
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) {
    return usage_error(std::string(s.message()));
  }
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  // `--sweep tp=1,2 pp=1,2`: the second list may come as a positional.
  for (const std::string& p : flags.positional()) {
    if (f.sweep.empty() || p.find('=') == std::string::npos) {
      return usage_error("unexpected argument '" + p + "'");
    }
    f.sweep.push_back(p);
  }
  if (std::string p = SimulateProblem(f); !p.empty()) return usage_error(p);
  absl::StatusOr<ModelConfig> config = LoadConfig(f.model_config);
  if (!config.ok()) return usage_error(std::string(config.status().message()));
  absl::StatusOr<DeviceProfile> device = FindDeviceProfile(f.gpu);
  if (!device.ok()) return usage_error(std::string(device.status().message()));
  if (absl::Status s = Calibrate(f, *device); !s.ok()) {
    return usage_error(std::string(s.message()));
  }

  absl::StatusOr<std::vector<SimRequest>> made = MakeTrace(f);
  if (!made.ok()) return usage_error(std::string(made.status().message()));
  const std::vector<SimRequest>& trace = *made;
  if (f.concurrency > 0) {
    std::printf("trace: %zu requests from %lld closed-loop clients\n",
                trace.size(), static_cast<long long>(f.concurrency));
  } else {
    std::printf("trace: %zu requests over %.1f s\n", trace.size(),
                trace.empty() ? 0.0 : trace.back().arrival);
  }

  std::string json;
  if (f.sweep.empty()) {
    absl::StatusOr<Planned> p =
        PlanLayout(f, *config, *device, static_cast<int>(f.tp),
                   static_cast<int>(f.pp), static_cast<int>(f.replicas));
    if (!p.ok()) return usage_error(std::string(p.status().message()));
    PrintLayout("layout", *config, *device, *p);
    absl::StatusOr<SimReport> r =
        Simulate(*p->cost, p->options, config->vocab_size, trace);
    if (!r.ok()) {
      std::fprintf(stderr, "shardlm simulate: %s\n",
                   std::string(r.status().message()).c_str());
      return 1;
    }
    std::fputs(FormatReport(*r).c_str(), stdout);
    json = ReportJson(*r);
  } else {
    absl::StatusOr<std::string> swept = Sweep(f, *config, *device, trace);
    if (!swept.ok()) return usage_error(std::string(swept.status().message()));
    json = *std::move(swept);
  }
  if (!f.json.empty()) {
    std::ofstream out(f.json);
    out << json << "\n";
    if (!out) {
      std::fprintf(stderr, "shardlm simulate: cannot write %s\n",
                   f.json.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace shardlm
