// What a step costs on simulated hardware: the time each pipeline stage
// spends on one StepInput, from first principles (bytes over memory
// bandwidth, FLOPs over peak, an alpha-beta model per link, launch
// overheads) with device profiles from published specs, or from constants
// (for tests with hand-checked results).
#ifndef SHARDLM_SIMULATOR_COST_MODEL_H_
#define SHARDLM_SIMULATOR_COST_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "step/step.h"

namespace shardlm {

// The small batch of the CPU profile's matrix-vector steps: tokens 2-4 are
// calibrated apart from the rest (bench/simulator_validation.py).
inline constexpr int kMatvecSmallBatchTokens = 4;

// One accelerator (or one CPU rank). Rates are the spec sheet's; the
// efficiencies say what share of them a serving kernel reaches.
struct DeviceProfile {
  std::string name;
  double memory_bytes = 0;      // Per device.
  double memory_bandwidth = 0;  // Bytes per second.
  double peak_flops = 0;        // Dense, in the weights' compute type.
  double bandwidth_efficiency = 0.8;
  double flops_efficiency = 0.6;
  double kernel_launch_seconds = 0;  // Per kernel.
  int kernels_per_layer = 0;         // Launched per layer per step.
  double step_overhead_seconds = 0;  // Host work per step (sampling, I/O).
  int devices_per_node = 8;
  // CPU kernels (0: not modelled). A step of at most matvec_max_tokens
  // tokens runs matrix-vector kernels that dequantize in registers and read
  // each weight row from memory once for all the step's tokens. Its
  // weights' FLOPs, a share per token: the first token's / matvec_flops,
  // those of tokens 2 .. matvec_small_batch_tokens /
  // matvec_small_batch_flops (0: matvec_batch_flops), and any further
  // token's / matvec_batch_flops (0: matvec_flops). Its attention's FLOPs
  // (4 x head_dim per query-key pair and query head), a share per token:
  // the first's / matvec_attention_flops (0: all counted with the
  // weights'), the others' / matvec_batch_attention_flops (0:
  // matvec_attention_flops). A larger step first dequantizes every weight
  // into tiles (parameters / dequantize_rate seconds) and then multiplies
  // at peak_flops.
  int matvec_max_tokens = 0;
  double matvec_flops = 0;
  int matvec_small_batch_tokens = 0;
  double matvec_small_batch_flops = 0;
  double matvec_batch_flops = 0;
  double matvec_attention_flops = 0;
  double matvec_batch_attention_flops = 0;
  double dequantize_rate = 0;  // Parameters per second.
  std::string source;          // Where the figures come from.
};

// A link between ranks: time(bytes) = alpha + bytes / bandwidth.
struct LinkProfile {
  std::string name;
  double alpha_seconds = 0;
  double bandwidth = 0;  // Bytes per second, one direction.
};

// The named profiles (h100, h200, a100, cpu-this-machine); NotFound lists
// the names.
absl::StatusOr<DeviceProfile> FindDeviceProfile(const std::string& name);
// nvlink-h100, nvlink-a100, pcie4, pcie5, ib-400g, ib-200g, eth-100g, shm.
absl::StatusOr<LinkProfile> FindLinkProfile(const std::string& name);
std::vector<std::string> DeviceProfileNames();
std::vector<std::string> LinkProfileNames();

// Model configurations users plan with, by name (llama3-8b, llama3-70b,
// llama3.1-8b, llama3.1-70b (their 128K context),
// llama3.1-405b, qwen2.5-7b, qwen2.5-72b, mistral-7b, smollm2-135m, and the
// mixtures qwen3-30b-a3b, qwen3-235b-a22b, mixtral-8x7b), from their
// published config.json files.
absl::StatusOr<ModelConfig> FindModelPreset(const std::string& name);
std::vector<std::string> ModelPresetNames();

// The expected number of distinct experts, of `experts`, that `tokens`
// tokens each routed to `top_k` of them touch, when every set of top_k is
// equally likely and tokens route independently: each expert is missed by
// one token with probability 1 - top_k / experts, so
//   E x (1 - (1 - k / E)^B).
// (Real routers are skewed, which touches fewer.) A mixture's decode step
// reads only these experts' weights.
double ExpectedDistinctExperts(double tokens, int64_t experts, int64_t top_k);

// What one CP rank sends to its CP peers for one step, summed over the
// pipeline stages (each stage's CP group sends for its own layers), counted
// as collectives/communicator.h's CommBytes counts it: an all-gather or an
// all-reduce of a rank's buffer as (cp - 1) x the buffer (each peer gets
// it once; a ring's links carry the same). Zero without CP.
struct CpBytes {
  double all_gather = 0;  // Q/K/V slices, attention outputs and lses.
  double all_reduce = 0;  // The last stage's logit rows.
  double total() const { return all_gather + all_reduce; }
};

class CostModel {
 public:
  virtual ~CostModel() = default;
  // Seconds each of the `pp` stages spends on `step` (stage s starts once
  // stage s - 1 has handed it the activations).
  virtual std::vector<double> StageSeconds(const StepInput& step) const = 0;
  // Context parallel's traffic for `step` (none unless overridden).
  virtual CpBytes StepCpBytes(const StepInput& /*step*/) const { return {}; }
};

// A fixed cost per step and per token, the same for every stage.
class FixedCostModel : public CostModel {
 public:
  FixedCostModel(int pp, double per_step, double per_token)
      : pp_(pp), per_step_(per_step), per_token_(per_token) {}
  std::vector<double> StageSeconds(const StepInput& step) const override;

 private:
  int pp_;
  double per_step_, per_token_;
};

struct Layout {
  int tp = 1;
  int pp = 1;
  // Context parallel (issue #35; docs/design-notes.md section 3): each
  // TP x PP rank becomes cp ranks, which hold the same weights and split
  // every sequence's KV by block (block j of a sequence on CP rank j mod
  // cp). A step of n >= cp tokens is cut into cp contiguous slices, each
  // rank running ceil(n / cp) or fewer through the projections and MLP
  // (sequence parallel); the slices' Q, K and V are all-gathered, every rank
  // attends all n queries over its own blocks, and the partial outputs with
  // their log-sum-exps are all-gathered and merged. A step of fewer than cp
  // tokens runs whole on every rank (attention still split by block).
  int cp = 1;
  double weight_bytes_per_param = 2;  // bf16; 1.0625 for Q8_0, 0.5625 Q4_0.
  double kv_bytes_per_value = 2;      // The KV cache's dtype.
  double activation_bytes = 2;        // What TP and PP links carry.
  // What CP's exchanges carry per value of Q/K/V, attention outputs and
  // logit rows: the CPU path sends f32 (lses are f32 in any case).
  double cp_activation_bytes = 4;
  // Not built (a design option to compare): under sequence parallel, each
  // rank sends each peer only the rows of that peer's slice of its partial
  // outputs and lses (a reduce-scatter-style exchange: ceil(n / cp) rows
  // instead of all n).
  bool cp_scatter_outputs = false;
  int32_t block_size = 16;  // Tokens per KV block.
  // TP all-reduces, PP sends, KV block copies between the device and the
  // host tier, and CP's all-gathers.
  LinkProfile tp_link, pp_link, host_link, cp_link;
};

// The roofline of each stage's slowest TP rank: the larger of (weights +
// KV read) / achieved bandwidth and the compute time (FLOPs / achieved
// peak, or the CPU kernels' terms of DeviceProfile), plus kernel
// launches, two ring all-reduces per layer over the TP link, the
// activations received from the previous stage over the PP link, the
// step's KV block copies over the host link, and the host's per-step
// overhead on the last stage. A step of copies alone costs its copies.
// With cp > 1, the slowest CP rank: ceil(n / cp) of the step's n tokens
// through the weights when n >= cp (all n otherwise), the LM head of all
// the step's logit rows (every rank computes them), the query-key pairs
// and KV reads of its own blocks, the whole weights read (and, on the CPU
// profile's tiled path, dequantized), and per layer the all-gathers of
// CpLayerBytes over the CP link (ring: cp - 1 hops of alpha + one rank's
// buffer / bandwidth), with one all-reduce of the logit rows per step.
class RooflineCostModel : public CostModel {
 public:
  RooflineCostModel(ModelConfig config, DeviceProfile device, Layout layout);
  std::vector<double> StageSeconds(const StepInput& step) const override;
  CpBytes StepCpBytes(const StepInput& step) const override;

  // What one CP rank sends each of its cp - 1 peers per layer for a step of
  // n tokens (0 without CP): its slice's Q, K and V, ceil(n / cp) rows of
  // (heads + 2 kv_heads) x head_dim values when n >= cp (0 otherwise: every
  // rank has all n), and its attention output and lse of all n queries, n x
  // heads x head_dim values and n x heads f32 (ceil(n / cp) rows with
  // cp_scatter_outputs under sequence parallel); heads and KV heads those
  // of its TP rank, values of cp_activation_bytes.
  struct CpLayerBuffers {
    double qkv = 0;     // Three all-gathers (Q, K, V).
    double output = 0;  // Two all-gathers (output, lse): their sum.
    double lse = 0;     // Of which the lses.
  };
  CpLayerBuffers CpLayerBytes(int64_t n) const;

  // Weight bytes one TP rank of stage `stage` holds.
  double StageWeightBytes(int stage) const;
  // KV cache bytes one token takes on one rank of stage `stage`.
  double KvBytesPerToken(int stage) const;
  // Compute seconds of a matrix-vector step of n tokens (DeviceProfile).
  double MatvecSeconds(double weight_flops, double attention_flops,
                       int64_t n) const;
  const ModelConfig& config() const { return config_; }
  const DeviceProfile& device() const { return device_; }
  const Layout& layout() const { return layout_; }

 private:
  ModelConfig config_;
  DeviceProfile device_;
  Layout layout_;
  std::vector<int64_t> stage_layers_;
  int64_t heads_per_rank_ = 0, kv_heads_per_rank_ = 0;
  // Per layer, per rank: the parameters every step reads (attention, a
  // dense FFN, a mixture's router) and, for a mixture, one expert's share
  // on this rank and the experts the rank holds (ShardPlan's split: whole
  // experts when TP divides them, else every expert's columns).
  double layer_params_per_rank_ = 0, lm_head_params_per_rank_ = 0;
  double expert_params_per_rank_ = 0;
  int64_t experts_per_rank_ = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_SIMULATOR_COST_MODEL_H_
