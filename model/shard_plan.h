// Shard planning: which layers, heads, FFN columns and vocabulary rows each
// (pp_rank, tp_rank) holds. Plain CPU code (DESIGN.md section 3).
//
// PP: contiguous layer ranges balanced by weight bytes (stage 0 also holds
// the embedding, the last stage the final norm and LM head). TP
// (Megatron-style): KV heads split as evenly as possible with each query
// head kept with its KV head (SmolLM2's 3 KV heads over TP=2 give 2 and 1);
// FFN columns and vocabulary rows split evenly. FFN splits are multiples of
// ffn_down's block (32 values, or a K-quant's 256-value super-block) so
// that quantized rows are read block by block; a rank whose columns cut a
// block (heads inside a super-block, or fewer super-blocks than ranks)
// holds the whole block (worker/llama_weights.h).
#ifndef SHARDLM_MODEL_SHARD_PLAN_H_
#define SHARDLM_MODEL_SHARD_PLAN_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "model/weight_source.h"

namespace shardlm {

// How a TP group splits a mixture of experts' FFNs (DESIGN.md section 3):
// kTensor, every expert's columns as a dense FFN's; kExpert (expert
// parallel), whole experts per rank, contiguous ranges [E r / T,
// E (r + 1) / T) of the E experts; kAuto: kExpert when T divides E, else
// kTensor.
enum class MoeSharding { kAuto, kTensor, kExpert };
const char* MoeShardingName(MoeSharding m);  // "auto", "tp", "ep".
// "auto", "tp" or "ep"; InvalidArgument naming the flag otherwise.
absl::StatusOr<MoeSharding> ParseMoeSharding(std::string_view name);

// What PP's stage boundaries balance (--pp-balance). kDecode: the weights
// each stage computes with per decode step, the last stage's output head
// included (every decode row runs it; SmolLM2's tied head weighs about 8 of
// its 30 layers, so at PP 2 the last stage gets 11 layers to the first's
// 19). kPrefill: the layers' weights only, for long prompts, whose chunks
// run the head for at most one row, so each stage's share of a chunk's work
// is its share of the layers (15 and 15).
enum class PpBalance { kDecode, kPrefill };
const char* PpBalanceName(PpBalance b);  // "decode", "prefill".
// "decode" or "prefill"; InvalidArgument naming the flag otherwise.
absl::StatusOr<PpBalance> ParsePpBalance(std::string_view name);
// The help of --pp-balance, for every command that takes it.
inline constexpr char kPpBalanceHelp[] =
    "what PP's stage boundaries balance: decode (the layers and the last "
    "stage's output head, which every decode row runs) or prefill (the "
    "layers only: a long prompt's chunks run the head for at most one row, "
    "so its stages do equal work: faster time to first token for long "
    "prompts, slower decode, whose last stage then also runs the head)";

struct ShardSpec {
  int tp_rank = 0, tp_size = 1;
  int pp_rank = 0, pp_size = 1;
  // Context parallel (--cp): the ranks of a stage form TP x CP. CP ranks
  // hold the same weights (PlanShards plans TP x PP; the executor copies
  // each spec cp times) and each holds the KV blocks whose id is cp_rank
  // mod cp_size (worker/model_runner.h).
  int cp_rank = 0, cp_size = 1;
  int64_t layer_begin = 0, layer_end = 0;      // [begin, end)
  int64_t kv_head_begin = 0, kv_head_end = 0;  // KV heads held.
  int64_t head_begin = 0, head_end = 0;        // Query heads held.
  // FFN columns held: of the dense FFN, or of every expert held (a
  // mixture of experts: ModelConfig::SplitFfn()).
  int64_t ffn_begin = 0, ffn_end = 0;
  int64_t expert_begin = 0, expert_end = 0;  // Experts held (mixtures).
  // A mixture's other FFNs, split over TP by columns like a dense FFN
  // under either --moe-sharding: the dense layers' (ffn_hidden columns;
  // ModelConfig::n_dense_layers) and the shared experts' (SharedFfn()).
  int64_t dense_ffn_begin = 0, dense_ffn_end = 0;
  int64_t shared_ffn_begin = 0, shared_ffn_end = 0;
  int64_t vocab_begin = 0, vocab_end = 0;  // Vocabulary rows held.
  // Vocabulary rows every TP rank pads its slice to, so that logits can be
  // all-gathered in equal parts: ceil(vocab / tp).
  int64_t vocab_padded = 0;
  uint64_t weight_bytes = 0;  // Bytes of the model file this shard reads.

  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp_size - 1; }
  // Whether this shard samples: the last stage's TP rank 0 (of CP rank
  // 0), which holds the logits gathered over its TP group.
  bool samples() const { return last_stage() && tp_rank == 0 && cp_rank == 0; }
  int64_t n_layers() const { return layer_end - layer_begin; }
  int64_t n_kv_heads() const { return kv_head_end - kv_head_begin; }
  int64_t n_heads() const { return head_end - head_begin; }
  int64_t n_experts() const { return expert_end - expert_begin; }
  std::string DebugString() const;
};

// The columns of a dense FFN layer `spec` holds: ffn_begin/end in a
// dense model, dense_ffn_begin/end in a mixture's dense layers.
inline std::pair<int64_t, int64_t> DenseFfnColumns(const ModelConfig& c,
                                                   const ShardSpec& spec) {
  return c.is_moe() ? std::pair{spec.dense_ffn_begin, spec.dense_ffn_end}
                    : std::pair{spec.ffn_begin, spec.ffn_end};
}

// The value heads of a Gated DeltaNet layer (ModelConfig::LayerIsLinear)
// `spec` holds: an even, contiguous split over its TP group, in the
// file's order (every rank computes every q/k head).
inline std::pair<int64_t, int64_t> SsmValueHeads(const ModelConfig& c,
                                                 const ShardSpec& spec) {
  const int64_t v = c.ssm_v_heads, tp = spec.tp_size, r = spec.tp_rank;
  return {v * r / tp, v * (r + 1) / tp};
}

// The index (pp_rank * tp + tp_rank) of the shard that samples in a tp x
// pp layout: ShardSpec::samples() of the last stage's TP rank 0. With CP
// ranks (below), that of the last stage's CP rank 0, TP rank 0.
constexpr int SamplingShard(int tp, int pp, int cp = 1) {
  return (pp - 1) * cp * tp;
}

// Where rank index i (a worker's rank - 1; an in-process shard's index)
// sits in a TP x CP x PP layout: i = (pp_rank * cp + cp_rank) * tp +
// tp_rank, so that cp = 1 is the TP x PP layout (pp_rank * tp + tp_rank).
struct RankPlace {
  int tp_rank = 0, cp_rank = 0, pp_rank = 0;
};
constexpr RankPlace PlaceOfRank(int index, int tp, int cp) {
  return {.tp_rank = index % tp,
          .cp_rank = (index / tp) % cp,
          .pp_rank = index / (tp * cp)};
}
constexpr int RankIndex(const RankPlace& p, int tp, int cp) {
  return (p.pp_rank * cp + p.cp_rank) * tp + p.tp_rank;
}

// One communicator group of a TP x CP x PP layout: one TP group per stage
// and CP rank, one CP group per stage and TP index (cp > 1 only), one PP
// chain per CP rank and TP index. The one list every launcher (threads,
// MPI, Gloo, NCCL) builds its groups from.
enum class GroupKind { kTp, kCp, kPp };
struct ShardGroup {
  GroupKind kind = GroupKind::kTp;
  // "tp group of stage P", "cp group of stage P tp T", "pp chain of tp T";
  // the TP group's and PP chain's names end in " cp C" only with CP ranks,
  // so that a cp 1 cluster's rendezvous keys are what they were.
  std::string name;
  int color = 0;             // Which group of its kind (an MPI split's color).
  int rank = 0;              // The rank's place in the group.
  std::vector<int> members;  // Rank indices (RankIndex), in group order.
  int size() const { return static_cast<int>(members.size()); }
};
// The groups of the rank at `place`, in the order every rank joins them:
// its TP group, its CP group (cp > 1), its PP chain. TP groups and PP
// chains of one rank are listed too; launchers that need none skip them.
std::vector<ShardGroup> ShardGroups(const RankPlace& place, int tp, int cp,
                                    int pp);

struct ShardPlan {
  int tp = 1, pp = 1;
  std::vector<ShardSpec> shards;  // Index pp_rank * tp + tp_rank.
  // FFN columns split in multiples of this: the block of ffn_down's format
  // (256 for the K-quants) when each rank can have one, else 32.
  int64_t ffn_granule = 32;
  // For a mixture of experts, kTensor or kExpert (never kAuto); kAuto for
  // a dense model.
  MoeSharding moe_sharding = MoeSharding::kAuto;

  const ShardSpec& at(int pp_rank, int tp_rank) const {
    return shards[pp_rank * tp + tp_rank];
  }
  // The spec of the rank at `place` in a layout of `cp` CP ranks per
  // stage: CP ranks hold the same weights, so it is at(pp, tp) with the CP
  // place set.
  ShardSpec ForRank(const RankPlace& place, int cp) const {
    ShardSpec spec = at(place.pp_rank, place.tp_rank);
    spec.cp_rank = place.cp_rank;
    spec.cp_size = cp;
    return spec;
  }
  std::string DebugString() const;  // A table: one line per rank.
};

// Unimplemented, naming the model's attention, when CP ranks cannot run
// it (cp > 1 with multi-head latent attention: its kernel reads whole
// sequences; worker/forward.h).
absl::Status CheckContextParallel(const ModelConfig& config, int cp);

// The plan for TP x PP ranks over `source`. InvalidArgument when tp
// exceeds the KV head count, pp the layer count, or either is < 1, and
// for kExpert when tp does not divide the expert count (or the model has
// no experts).
absl::StatusOr<ShardPlan> PlanShards(const WeightSource& source, int tp, int pp,
                                     MoeSharding moe = MoeSharding::kAuto,
                                     PpBalance balance = PpBalance::kDecode);

// [begin, end) of part `i` of `n` items split into `parts` as evenly as
// possible, earlier parts taking the remainder.
std::pair<int64_t, int64_t> EvenSplit(int64_t n, int64_t parts, int64_t i);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_SHARD_PLAN_H_
