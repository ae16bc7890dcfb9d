#include "simulator/cost_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/linear/linear.h"
#include "model/shard_plan.h"

namespace shardlm {
namespace {

constexpr double kGB = 1e9;

// Spec-sheet figures (dense BF16 tensor FLOPs, HBM bandwidth and size of
// the SXM parts); the efficiencies are typical of serving kernels, not
// measured here.
const DeviceProfile kDevices[] = {
    {.name = "h100",
     .memory_bytes = 80 * kGB,
     .memory_bandwidth = 3350 * kGB,
     .peak_flops = 989e12,
     .kernel_launch_seconds = 3e-6,
     .kernels_per_layer = 12,
     .step_overhead_seconds = 5e-4,
     .source = "NVIDIA H100 SXM5 datasheet: 80 GB HBM3, 3.35 TB/s, 989 "
               "TFLOPS dense BF16"},
    {.name = "h200",
     .memory_bytes = 141 * kGB,
     .memory_bandwidth = 4800 * kGB,
     .peak_flops = 989e12,
     .kernel_launch_seconds = 3e-6,
     .kernels_per_layer = 12,
     .step_overhead_seconds = 5e-4,
     .source = "NVIDIA H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, 989 "
               "TFLOPS dense BF16"},
    {.name = "a100",
     .memory_bytes = 80 * kGB,
     .memory_bandwidth = 2039 * kGB,
     .peak_flops = 312e12,
     .kernel_launch_seconds = 4e-6,
     .kernels_per_layer = 12,
     .step_overhead_seconds = 5e-4,
     .source = "NVIDIA A100 SXM4 80GB datasheet: 2.039 TB/s, 312 TFLOPS "
               "dense BF16"},
    // This project's CPU engine (2 threads, Q4_1 weights) on its 2-core
    // Intel Xeon (AVX-512) VM, calibrated with bench/simulator_validation.py
    // (docs/simulator.md): achieved rates, efficiencies folded in, each the
    // median of the three rounds' TP 1 calibrations. The decode kernels
    // handle at most kDecodeMaxRows rows as matrix-vector products. Such
    // VMs drift by up to a third between runs, and the attention rates are
    // the least certain (the rounds gave 0-64 GFLOP/s).
    {.name = "cpu-this-machine",
     .memory_bytes = 24 * 1024.0 * 1024 * 1024,
     .memory_bandwidth = 23.9 * kGB,
     .peak_flops = 144.0e9,
     .bandwidth_efficiency = 1.0,
     .flops_efficiency = 1.0,
     .kernel_launch_seconds = 0,
     .kernels_per_layer = 0,
     .step_overhead_seconds = 0,
     .devices_per_node = 2,
     .matvec_max_tokens = kDecodeMaxRows,
     .matvec_flops = 27.7e9,
     .matvec_small_batch_tokens = kMatvecSmallBatchTokens,
     .matvec_small_batch_flops = 73.3e9,
     .matvec_batch_flops = 57.4e9,
     .matvec_attention_flops = 19.1e9,
     .matvec_batch_attention_flops = 12.3e9,
     .dequantize_rate = 2.82e9,
     .source = "calibrated on the 2-core Intel Xeon VM (docs/simulator.md)"},
};

// Per direction. Alphas are per message (per ring hop for all-reduces).
const LinkProfile kLinks[] = {
    {"nvlink-h100", 1e-6, 450 * kGB},  // NVLink 4: 900 GB/s both ways.
    {"nvlink-a100", 1e-6, 300 * kGB},  // NVLink 3: 600 GB/s both ways.
    {"pcie4", 3e-6, 25 * kGB},         // x16, achieved.
    {"pcie5", 3e-6, 50 * kGB},
    {"ib-400g", 5e-6, 50 * kGB},  // NDR.
    {"ib-200g", 5e-6, 25 * kGB},  // HDR.
    {"eth-100g", 20e-6, 12.5 * kGB},
    {"shm", 20e-6, 5 * kGB},  // Ranks on one CPU host (MPI shared memory).
};

ModelConfig Llama(std::string name, int64_t layers, int64_t hidden, int64_t ffn,
                  int64_t heads, int64_t kv_heads, int64_t vocab,
                  int64_t context, float theta) {
  ModelConfig c;
  c.architecture = "llama";
  c.name = std::move(name);
  c.n_layers = layers;
  c.hidden = hidden;
  c.ffn_hidden = ffn;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.vocab_size = vocab;
  c.context_length = context;
  c.rope_theta = theta;
  return c;
}

std::vector<ModelConfig> Presets() {
  std::vector<ModelConfig> p = {
      Llama("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192, 500000),
      Llama("llama3-70b", 80, 8192, 28672, 64, 8, 128256, 8192, 500000),
      Llama("llama3.1-405b", 126, 16384, 53248, 128, 8, 128256, 131072, 500000),
      Llama("qwen2.5-7b", 28, 3584, 18944, 28, 4, 152064, 32768, 1e6),
      Llama("qwen2.5-72b", 80, 8192, 29568, 64, 8, 152064, 32768, 1e6),
      Llama("mistral-7b", 32, 4096, 14336, 32, 8, 32000, 32768, 10000),
      Llama("smollm2-135m", 30, 576, 1536, 9, 3, 49152, 8192, 100000),
      // Llama 3 with 3.1's 128K context (what long-context plans use).
      Llama("llama3.1-8b", 32, 4096, 14336, 32, 8, 128256, 131072, 500000),
      Llama("llama3.1-70b", 80, 8192, 28672, 64, 8, 128256, 131072, 500000),
  };
  p[3].architecture = p[4].architecture = "qwen2";
  p[3].attention_bias = p[4].attention_bias = true;
  p[6].tied_embeddings = true;
  // Mixtures of experts (their config.json files: num_experts or
  // num_local_experts, num_experts_per_tok, moe_intermediate_size).
  const auto moe = [](ModelConfig c, std::string arch, int64_t experts,
                      int64_t top_k, int64_t expert_ffn) {
    c.architecture = std::move(arch);
    c.n_experts = experts;
    c.n_experts_used = top_k;
    c.expert_ffn_hidden = expert_ffn;
    c.qk_norm = c.architecture == "qwen3moe";
    return c;
  };
  ModelConfig a3b =
      Llama("qwen3-30b-a3b", 48, 2048, 6144, 32, 4, 151936, 40960, 1e6);
  a3b.head_dim = 128;
  p.push_back(moe(a3b, "qwen3moe", 128, 8, 768));
  ModelConfig a22b =
      Llama("qwen3-235b-a22b", 94, 4096, 12288, 64, 4, 151936, 40960, 1e6);
  a22b.head_dim = 128;
  p.push_back(moe(a22b, "qwen3moe", 128, 8, 1536));
  p.push_back(
      moe(Llama("mixtral-8x7b", 32, 4096, 14336, 32, 8, 32000, 32768, 1e6),
          "mixtral", 8, 2, 14336));
  return p;
}

}  // namespace

absl::StatusOr<DeviceProfile> FindDeviceProfile(const std::string& name) {
  for (const DeviceProfile& d : kDevices) {
    if (d.name == name) return d;
  }
  return absl::NotFoundError(
      absl::StrCat("no device profile '", name,
                   "'; known: ", absl::StrJoin(DeviceProfileNames(), ", ")));
}

absl::StatusOr<LinkProfile> FindLinkProfile(const std::string& name) {
  for (const LinkProfile& l : kLinks) {
    if (l.name == name) return l;
  }
  return absl::NotFoundError(
      absl::StrCat("no link profile '", name,
                   "'; known: ", absl::StrJoin(LinkProfileNames(), ", ")));
}

std::vector<std::string> DeviceProfileNames() {
  std::vector<std::string> out;
  for (const DeviceProfile& d : kDevices) out.push_back(d.name);
  return out;
}

std::vector<std::string> LinkProfileNames() {
  std::vector<std::string> out;
  for (const LinkProfile& l : kLinks) out.push_back(l.name);
  return out;
}

absl::StatusOr<ModelConfig> FindModelPreset(const std::string& name) {
  for (ModelConfig& c : Presets()) {
    if (c.name == name) return std::move(c);
  }
  return absl::NotFoundError(
      absl::StrCat("no model preset '", name,
                   "'; known: ", absl::StrJoin(ModelPresetNames(), ", ")));
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> out;
  for (const ModelConfig& c : Presets()) out.push_back(c.name);
  return out;
}

double ExpectedDistinctExperts(double tokens, int64_t experts, int64_t top_k) {
  if (experts <= 0 || tokens <= 0) return 0;
  const double e = static_cast<double>(experts);
  return e * (1 - std::pow(1 - static_cast<double>(top_k) / e, tokens));
}

std::vector<double> FixedCostModel::StageSeconds(const StepInput& step) const {
  return std::vector<double>(
      pp_, per_step_ + per_token_ * static_cast<double>(step.tokens.size()));
}

RooflineCostModel::RooflineCostModel(ModelConfig config, DeviceProfile device,
                                     Layout layout)
    : config_(std::move(config)),
      device_(std::move(device)),
      layout_(std::move(layout)) {
  const ModelConfig& c = config_;
  for (int s = 0; s < layout_.pp; ++s) {
    const auto [begin, end] = EvenSplit(c.n_layers, layout_.pp, s);
    stage_layers_.push_back(end - begin);
  }
  // The slowest TP rank: the one with the most KV heads (each query head
  // stays with its KV head), FFN columns and vocabulary rows.
  const int64_t tp = layout_.tp;
  kv_heads_per_rank_ = (c.n_kv_heads + tp - 1) / tp;
  heads_per_rank_ = kv_heads_per_rank_ * (c.n_heads / c.n_kv_heads);
  const double hd = static_cast<double>(c.head_dim);
  const double hidden = static_cast<double>(c.hidden);
  const double ffn = static_cast<double>((c.ffn_hidden + tp - 1) / tp);
  layer_params_per_rank_ =
      hidden * hd *
      static_cast<double>(2 * heads_per_rank_ + 2 * kv_heads_per_rank_);
  if (c.is_moe()) {
    const bool whole = c.n_experts % tp == 0;  // ShardPlan's auto.
    experts_per_rank_ = whole ? c.n_experts / tp : c.n_experts;
    expert_params_per_rank_ =
        3 * hidden *
        static_cast<double>(whole ? c.expert_ffn_hidden
                                  : (c.expert_ffn_hidden + tp - 1) / tp);
    layer_params_per_rank_ += hidden * static_cast<double>(c.n_experts);
  } else {
    layer_params_per_rank_ += 3 * hidden * ffn;
  }
  lm_head_params_per_rank_ =
      hidden * static_cast<double>((c.vocab_size + tp - 1) / tp);
}

double RooflineCostModel::StageWeightBytes(int stage) const {
  double params =
      static_cast<double>(stage_layers_[stage]) *
      (layer_params_per_rank_ +
       static_cast<double>(experts_per_rank_) * expert_params_per_rank_);
  if (stage == layout_.pp - 1) params += lm_head_params_per_rank_;
  if (stage == 0 && !config_.tied_embeddings) {
    params += lm_head_params_per_rank_;  // The embedding table.
  }
  return params * layout_.weight_bytes_per_param;
}

double RooflineCostModel::KvBytesPerToken(int stage) const {
  // Per layer: K and V of this rank's KV heads, or under latent attention
  // one entry, which every TP rank holds whole.
  const double values =
      config_.is_mla()
          ? static_cast<double>(config_.CachedHeadDim())
          : 2.0 * static_cast<double>(kv_heads_per_rank_ * config_.head_dim);
  return static_cast<double>(stage_layers_[stage]) * values *
         layout_.kv_bytes_per_value;
}

double RooflineCostModel::MatvecSeconds(double weight_flops,
                                        double attention_flops,
                                        int64_t n) const {
  const DeviceProfile& d = device_;
  // Attention at its own rates, or folded into the weights'.
  const bool apart = d.matvec_attention_flops > 0;
  const double per_token =
      (apart ? weight_flops : weight_flops + attention_flops) / n;
  const double batch =
      d.matvec_batch_flops > 0 ? d.matvec_batch_flops : d.matvec_flops;
  const int64_t small =
      d.matvec_small_batch_flops > 0
          ? std::clamp<int64_t>(d.matvec_small_batch_tokens, 1, n) - 1
          : 0;
  double seconds =
      per_token / d.matvec_flops + (n - 1 - small) * per_token / batch;
  if (small > 0) seconds += small * per_token / d.matvec_small_batch_flops;
  if (apart) {
    const double first = attention_flops / n;
    seconds += first / d.matvec_attention_flops +
               (attention_flops - first) / (d.matvec_batch_attention_flops > 0
                                                ? d.matvec_batch_attention_flops
                                                : d.matvec_attention_flops);
  }
  return seconds;
}

namespace {

// Positions of [0, x) whose block (position / block) sits on CP rank r of
// cp, blocks dealt round robin.
double KeysBelowOnRank(int64_t x, int64_t block, int64_t cp, int64_t r) {
  const int64_t cycle = block * cp;
  return static_cast<double>(
      (x / cycle) * block +
      std::clamp<int64_t>(x % cycle - r * block, 0, block));
}

}  // namespace

RooflineCostModel::CpLayerBuffers RooflineCostModel::CpLayerBytes(
    int64_t n) const {
  const int64_t cp = layout_.cp;
  if (cp <= 1 || n <= 0) return {};
  const double hd = static_cast<double>(config_.head_dim);
  const double heads = static_cast<double>(heads_per_rank_);
  const double kv_heads = static_cast<double>(kv_heads_per_rank_);
  const double v = layout_.cp_activation_bytes;
  CpLayerBuffers b;
  if (n >= cp) {
    const double rows = static_cast<double>((n + cp - 1) / cp);
    b.qkv = rows * (heads + 2 * kv_heads) * hd * v;
  }
  const double out_rows = layout_.cp_scatter_outputs && n >= cp
                              ? static_cast<double>((n + cp - 1) / cp)
                              : static_cast<double>(n);
  b.lse = out_rows * heads * 4;
  b.output = out_rows * heads * hd * v + b.lse;
  return b;
}

CpBytes RooflineCostModel::StepCpBytes(const StepInput& step) const {
  const int64_t cp = layout_.cp;
  const int64_t n = static_cast<int64_t>(step.tokens.size());
  if (cp <= 1 || n == 0) return {};
  const CpLayerBuffers b = CpLayerBytes(n);
  const double peers = static_cast<double>(cp - 1);
  CpBytes out;
  out.all_gather =
      peers * static_cast<double>(config_.n_layers) * (b.qkv + b.output);
  if (n >= cp) {  // The logit rows, summed over the group.
    out.all_reduce = peers * static_cast<double>(step.logit_rows.size()) *
                     static_cast<double>(config_.hidden) *
                     layout_.cp_activation_bytes;
  }
  return out;
}

std::vector<double> RooflineCostModel::StageSeconds(
    const StepInput& step) const {
  const ModelConfig& c = config_;
  const int64_t n_tokens = static_cast<int64_t>(step.tokens.size());
  const double n = static_cast<double>(n_tokens);
  const double rows = static_cast<double>(step.logit_rows.size());
  const int64_t cp = std::max(1, layout_.cp);
  // Per CP rank and sequence: the KV it reads (its whole visible context
  // on that rank's blocks, once) and the query-key pairs its new tokens
  // attend to there, averaged over the layers (a window may apply to some
  // layers only, as in Qwen2). Without CP, rank 0 holds every block.
  int64_t windowed = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) windowed += c.LayerWindow(l) > 0;
  const double windowed_share =
      c.n_layers > 0 ? static_cast<double>(windowed) / c.n_layers : 0.0;
  const size_t seqs = step.seq_ids.size();
  std::vector<double> context(seqs * cp, 0), pairs(cp, 0);
  const int64_t block = std::max<int32_t>(1, layout_.block_size);
  for (size_t t = 0; t < step.tokens.size(); ++t) {
    const int64_t full = step.positions[t] + 1;
    const int64_t window =
        c.sliding_window > 0 ? std::min(full, c.sliding_window) : full;
    for (int64_t r = 0; r < cp; ++r) {
      const double all = cp == 1 ? static_cast<double>(full)
                                 : KeysBelowOnRank(full, block, cp, r);
      const double in_window =
          cp == 1 ? static_cast<double>(window)
                  : all - KeysBelowOnRank(full - window, block, cp, r);
      const double visible =
          windowed_share * in_window + (1 - windowed_share) * all;
      pairs[r] += visible;
      double& ctx = context[step.token_seq[t] * cp + r];
      ctx = std::max(ctx, visible);
    }
  }
  std::vector<double> kv_tokens(cp, 0);
  for (size_t q = 0; q < seqs; ++q) {
    for (int64_t r = 0; r < cp; ++r) kv_tokens[r] += context[q * cp + r];
  }

  const double hd = static_cast<double>(c.head_dim);
  // Context parallel: a step of at least cp tokens is cut into cp slices
  // (sequence parallel), the longest ceil(n / cp); a shorter one runs whole
  // on every rank. Every rank computes the LM head of all logit rows.
  const bool seq_parallel = cp > 1 && n_tokens >= cp;
  const double n_rank =
      seq_parallel ? static_cast<double>((n_tokens + cp - 1) / cp) : n;
  const double activations =
      n_rank * static_cast<double>(c.hidden) * layout_.activation_bytes;
  // Ring all-gather of one rank's buffer: cp - 1 hops.
  const auto cp_all_gather = [&](double buffer) {
    return static_cast<double>(cp - 1) *
           (layout_.cp_link.alpha_seconds + buffer / layout_.cp_link.bandwidth);
  };
  double cp_layer = 0;
  if (cp > 1) {
    const CpLayerBuffers b = CpLayerBytes(n_tokens);
    const double heads = static_cast<double>(heads_per_rank_);
    const double kv_heads = static_cast<double>(kv_heads_per_rank_);
    if (seq_parallel) {  // Q, K, V: three calls.
      cp_layer += cp_all_gather(b.qkv * heads / (heads + 2 * kv_heads)) +
                  2 * cp_all_gather(b.qkv * kv_heads / (heads + 2 * kv_heads));
    }
    // The output, then the lse.
    cp_layer += cp_all_gather(b.output - b.lse) + cp_all_gather(b.lse);
  }
  // The logit rows summed over the CP group (the MPI, Gloo and in-process
  // all-reduces gather every rank's buffer).
  const double cp_logits =
      seq_parallel && rows > 0
          ? cp_all_gather(rows * static_cast<double>(c.hidden) *
                          layout_.cp_activation_bytes)
          : 0.0;
  const auto ring_all_reduce = [&](double bytes) {
    const double p = layout_.tp;
    if (layout_.tp <= 1) return 0.0;
    return 2 * (p - 1) *
           (layout_.tp_link.alpha_seconds +
            bytes / (p * layout_.tp_link.bandwidth));
  };
  std::vector<double> out;
  for (int s = 0; s < layout_.pp; ++s) {
    // Swaps and spills: each copy moves one block's slice on every rank.
    const double copies = step.copies.empty()
                              ? 0.0
                              : static_cast<double>(step.copies.size()) *
                                    (layout_.host_link.alpha_seconds +
                                     layout_.block_size * KvBytesPerToken(s) /
                                         layout_.host_link.bandwidth);
    if (step.tokens.empty()) {
      out.push_back(copies);
      continue;
    }
    const double layers = static_cast<double>(stage_layers_[s]);
    const bool last = s == layout_.pp - 1;
    // A mixture reads the experts the step's tokens touch (those on this
    // rank: a share of the expected distinct ones) and computes with top-k
    // of them per token (the rank's share, routing taken as balanced).
    double expert_reads = 0, expert_flops_params = 0;
    if (c.is_moe()) {
      const double share = static_cast<double>(experts_per_rank_) / c.n_experts;
      expert_reads =
          share *
          ExpectedDistinctExperts(n_rank, c.n_experts, c.n_experts_used) *
          expert_params_per_rank_;
      expert_flops_params = share * c.n_experts_used * expert_params_per_rank_;
    }
    // The weights' FLOPs (this rank's tokens; the head's rows on all).
    double weight_flops =
        2 * n_rank * layers * (layer_params_per_rank_ + expert_flops_params);
    double weight_bytes = layers * (layer_params_per_rank_ + expert_reads) *
                          layout_.weight_bytes_per_param;
    if (last) {
      weight_bytes += lm_head_params_per_rank_ * layout_.weight_bytes_per_param;
      weight_flops += 2 * rows * lm_head_params_per_rank_;
    }
    // The slowest CP rank: the most query-key pairs and KV on its blocks.
    double roofline = 0;
    for (int64_t r = 0; r < cp; ++r) {
      const double bytes = weight_bytes + kv_tokens[r] * KvBytesPerToken(s);
      const double attention_flops =
          layers * 4 * hd * static_cast<double>(heads_per_rank_) * pairs[r];
      double compute = (weight_flops + attention_flops) /
                       (device_.peak_flops * device_.flops_efficiency);
      if (device_.matvec_max_tokens > 0 &&
          n_rank <= device_.matvec_max_tokens) {
        compute = MatvecSeconds(weight_flops, attention_flops,
                                static_cast<int64_t>(n_rank));
      } else if (device_.dequantize_rate > 0) {
        compute += (layers * (layer_params_per_rank_ + expert_reads) +
                    (last ? lm_head_params_per_rank_ : 0)) /
                   device_.dequantize_rate;
      }
      roofline =
          std::max(roofline, std::max(bytes / (device_.memory_bandwidth *
                                               device_.bandwidth_efficiency),
                                      compute));
    }
    double t = roofline;
    t += layers * device_.kernels_per_layer * device_.kernel_launch_seconds;
    t += layers * 2 * ring_all_reduce(activations);
    t += layers * cp_layer;
    if (last) t += cp_logits;
    if (s > 0) {
      t += layout_.pp_link.alpha_seconds +
           activations / layout_.pp_link.bandwidth;
    }
    if (last) t += device_.step_overhead_seconds;
    out.push_back(t + copies);
  }
  return out;
}

}  // namespace shardlm
