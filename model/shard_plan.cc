#include "model/shard_plan.h"

#include <algorithm>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"

namespace shardlm {

std::vector<ShardGroup> ShardGroups(const RankPlace& place, int tp, int cp,
                                    int pp) {
  const auto [t, c, p] = place;
  const std::string cp_suffix = cp > 1 ? absl::StrCat(" cp ", c) : "";
  std::vector<ShardGroup> groups;
  ShardGroup tp_group{.kind = GroupKind::kTp,
                      .name = absl::StrCat("tp group of stage ", p, cp_suffix),
                      .color = p * cp + c,
                      .rank = t};
  for (int i = 0; i < tp; ++i) {
    tp_group.members.push_back(RankIndex({i, c, p}, tp, cp));
  }
  groups.push_back(std::move(tp_group));
  if (cp > 1) {
    ShardGroup cp_group{
        .kind = GroupKind::kCp,
        .name = absl::StrCat("cp group of stage ", p, " tp ", t),
        .color = p * tp + t,
        .rank = c};
    for (int i = 0; i < cp; ++i) {
      cp_group.members.push_back(RankIndex({t, i, p}, tp, cp));
    }
    groups.push_back(std::move(cp_group));
  }
  ShardGroup pp_chain{.kind = GroupKind::kPp,
                      .name = absl::StrCat("pp chain of tp ", t, cp_suffix),
                      .color = c * tp + t,
                      .rank = p};
  for (int i = 0; i < pp; ++i) {
    pp_chain.members.push_back(RankIndex({t, c, i}, tp, cp));
  }
  groups.push_back(std::move(pp_chain));
  return groups;
}
namespace {

// Elements (weights) of every tensor whose name starts with `prefix`, or of
// the one named `name`: what a step computes with, whatever the format.
uint64_t ElementsWithPrefix(const WeightSource& source,
                            const std::string& prefix) {
  uint64_t total = 0;
  for (const TensorInfo& t : source.tensors()) {
    if (t.name.rfind(prefix, 0) != 0) continue;
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    total += n;
  }
  return total;
}
uint64_t TensorElements(const WeightSource& source, const std::string& name) {
  const TensorInfo* t = source.Find(name);
  if (t == nullptr) return 0;
  uint64_t n = 1;
  for (int64_t d : t->shape) n *= static_cast<uint64_t>(d);
  return n;
}

uint64_t TensorBytes(const WeightSource& source, const std::string& name) {
  const TensorInfo* t = source.Find(name);
  return t == nullptr ? 0 : t->bytes;
}

// Bytes of the tensors named `prefix`...`infix`... (a layer's merged
// expert tensors: "blk.3." and "_exps.").
uint64_t ElementsWithPrefixBytes(const WeightSource& source,
                                 const std::string& prefix,
                                 std::string_view infix) {
  uint64_t total = 0;
  for (const TensorInfo& t : source.tensors()) {
    if (absl::StartsWith(t.name, prefix) &&
        t.name.find(infix) != std::string::npos) {
      total += t.bytes;
    }
  }
  return total;
}

// Contiguous split of `costs` into `parts` non-empty ranges minimizing the
// largest range cost, where range p also costs extra[p]. Returns the
// boundaries (parts + 1 entries).
std::vector<int64_t> BalancedPartition(const std::vector<uint64_t>& costs,
                                       const std::vector<uint64_t>& extra) {
  const int64_t n = static_cast<int64_t>(costs.size());
  const int64_t parts = static_cast<int64_t>(extra.size());
  std::vector<uint64_t> prefix(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  constexpr uint64_t kInf = std::numeric_limits<uint64_t>::max();
  // best[p][i]: the smallest max cost of splitting the first i layers into
  // p + 1 ranges; cut[p][i]: where range p starts.
  std::vector<std::vector<uint64_t>> best(parts,
                                          std::vector<uint64_t>(n + 1, kInf));
  std::vector<std::vector<int64_t>> cut(parts, std::vector<int64_t>(n + 1, 0));
  for (int64_t i = 1; i <= n; ++i) best[0][i] = prefix[i] + extra[0];
  for (int64_t p = 1; p < parts; ++p) {
    for (int64_t i = p + 1; i <= n; ++i) {
      for (int64_t j = p; j < i; ++j) {
        if (best[p - 1][j] == kInf) continue;
        const uint64_t cost =
            std::max(best[p - 1][j], prefix[i] - prefix[j] + extra[p]);
        if (cost < best[p][i]) {
          best[p][i] = cost;
          cut[p][i] = j;
        }
      }
    }
  }
  std::vector<int64_t> bounds(parts + 1);
  bounds[parts] = n;
  for (int64_t p = parts - 1, i = n; p > 0; --p) {
    i = cut[p][i];
    bounds[p] = i;
  }
  bounds[0] = 0;
  return bounds;
}

// The column granule of the FFN split: the largest block of any layer's
// ffn_down format (the experts' too: ffn_down_exps, ffn_down.E) (at least
// 32) when ffn_hidden holds one per rank.
int64_t FfnGranule(const WeightSource& source, int64_t ffn_hidden, int tp) {
  int64_t granule = 32;
  for (const TensorInfo& t : source.tensors()) {
    if (absl::StartsWith(t.name, "blk.") &&
        (absl::EndsWith(t.name, ".ffn_down.weight") ||
         absl::EndsWith(t.name, ".ffn_down_exps.weight") ||
         absl::StrContains(t.name, ".ffn_down."))) {
      granule = std::max(granule, BlockElems(t.dtype));
    }
  }
  if (ffn_hidden / granule < tp) return 32;
  return granule;
}

}  // namespace

const char* MoeShardingName(MoeSharding m) {
  switch (m) {
    case MoeSharding::kTensor:
      return "tp";
    case MoeSharding::kExpert:
      return "ep";
    default:
      return "auto";
  }
}

absl::StatusOr<MoeSharding> ParseMoeSharding(std::string_view name) {
  if (name == "auto") return MoeSharding::kAuto;
  if (name == "tp") return MoeSharding::kTensor;
  if (name == "ep") return MoeSharding::kExpert;
  return absl::InvalidArgumentError(
      absl::StrCat("--moe-sharding '", Sv(name), "': want auto, tp or ep"));
}

const char* PpBalanceName(PpBalance b) {
  return b == PpBalance::kPrefill ? "prefill" : "decode";
}

absl::StatusOr<PpBalance> ParsePpBalance(std::string_view name) {
  if (name == "decode") return PpBalance::kDecode;
  if (name == "prefill") return PpBalance::kPrefill;
  return absl::InvalidArgumentError(
      absl::StrCat("--pp-balance '", Sv(name), "': want decode or prefill"));
}

std::pair<int64_t, int64_t> EvenSplit(int64_t n, int64_t parts, int64_t i) {
  const int64_t base = n / parts, extra = n % parts;
  const int64_t begin = i * base + std::min(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

std::string ShardSpec::DebugString() const {
  return absl::StrFormat(
      "pp %d tp %d%s: layers [%d, %d) heads [%d, %d) kv [%d, %d) ffn [%d, %d) "
      "experts [%d, %d)%s vocab [%d, %d) %.1f MiB",
      pp_rank, tp_rank,
      cp_size > 1 ? absl::StrFormat(" cp %d of %d", cp_rank, cp_size) : "",
      layer_begin, layer_end, head_begin, head_end, kv_head_begin, kv_head_end,
      ffn_begin, ffn_end, expert_begin, expert_end,
      (dense_ffn_end > 0 ? absl::StrFormat(" dense ffn [%d, %d)",
                                           dense_ffn_begin, dense_ffn_end)
                         : std::string()) +
          (shared_ffn_end > 0
               ? absl::StrFormat(" shared ffn [%d, %d)", shared_ffn_begin,
                                 shared_ffn_end)
               : std::string()),
      vocab_begin, vocab_end, weight_bytes / 1048576.0);
}

std::string ShardPlan::DebugString() const {
  const bool moe = moe_sharding != MoeSharding::kAuto;
  std::string out;
  if (moe_sharding == MoeSharding::kExpert) {
    out = "experts held whole (--moe-sharding ep), in contiguous ranges\n";
  } else {
    out = absl::StrFormat(
        "%s columns split in multiples of %d (the %s of ffn_down's format)%s\n",
        moe ? "every expert's FFN" : "FFN", ffn_granule,
        ffn_granule > 32 ? "super-block" : "32-value block",
        moe ? " (--moe-sharding tp)" : "");
  }
  absl::StrAppendFormat(&out, "%-5s %-3s %-3s %-10s %-11s %-8s %-12s %-14s ",
                        "rank", "pp", "tp", "layers", "q heads", "kv heads",
                        "ffn cols", "vocab rows");
  if (moe) absl::StrAppendFormat(&out, "%-10s ", "experts");
  absl::StrAppendFormat(&out, "%10s\n", "MiB read");
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardSpec& s = shards[i];
    absl::StrAppendFormat(
        &out, "%-5d %-3d %-3d %-10s %-11s %-8s %-12s %-14s ", i + 1, s.pp_rank,
        s.tp_rank, absl::StrFormat("%d-%d", s.layer_begin, s.layer_end - 1),
        absl::StrFormat("%d-%d (%d)", s.head_begin, s.head_end - 1,
                        s.n_heads()),
        absl::StrFormat("%d-%d", s.kv_head_begin, s.kv_head_end - 1),
        absl::StrFormat("%d-%d", s.ffn_begin, s.ffn_end - 1),
        absl::StrFormat("%d-%d", s.vocab_begin, s.vocab_end - 1));
    if (moe) {
      absl::StrAppendFormat(
          &out, "%-10s ",
          absl::StrFormat("%d-%d", s.expert_begin, s.expert_end - 1));
    }
    absl::StrAppendFormat(&out, "%10.1f\n", s.weight_bytes / 1048576.0);
  }
  return out;
}

absl::Status CheckContextParallel(const ModelConfig& config, int cp) {
  if (cp > 1 && config.is_mla()) {
    return absl::UnimplementedError(absl::StrCat(
        "--cp ", cp, ": ", config.architecture,
        "'s multi-head latent attention does not run under context "
        "parallelism yet; use --cp 1 (TP and PP work)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardPlan> PlanShards(const WeightSource& source, int tp, int pp,
                                     MoeSharding moe, PpBalance balance) {
  const ModelConfig& c = source.config();
  if (tp < 1 || pp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp (", tp, ") and pp (", pp, ") must be >= 1"));
  }
  if (tp > c.n_kv_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp ", tp, " exceeds the model's ", c.n_kv_heads,
                     " KV heads: every TP rank needs at least one KV head"));
  }
  if (pp > c.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pp ", pp, " exceeds the model's ", c.n_layers, " layers"));
  }
  // Experts: whole per rank (ep) or split like a dense FFN (tp).
  MoeSharding moe_sharding = MoeSharding::kAuto;
  if (c.is_moe()) {
    const bool divides = c.n_experts % tp == 0;
    moe_sharding = moe == MoeSharding::kAuto
                       ? (divides ? MoeSharding::kExpert : MoeSharding::kTensor)
                       : moe;
    if (moe_sharding == MoeSharding::kExpert && !divides) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--moe-sharding ep: tp ", tp, " does not divide the model's ",
          c.n_experts, " experts; use tp (every expert split across the ",
          "group) or a TP size that divides ", c.n_experts));
    }
  } else if (moe == MoeSharding::kExpert) {
    return absl::InvalidArgumentError(
        "--moe-sharding ep: the model has no experts (a dense FFN)");
  }
  // The FFN columns split over TP: a dense FFN's, or every expert's (tp).
  const int64_t split_ffn = c.SplitFfn();
  const bool split_columns = moe_sharding != MoeSharding::kExpert;
  if (split_columns && (split_ffn % 32 != 0 || split_ffn / 32 < tp)) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.is_moe() ? "expert_ffn_hidden " : "ffn_hidden ", split_ffn,
        " cannot be split into whole 32-column blocks over tp ", tp));
  }
  // FFN columns split on the blocks of ffn_down's format (256 for the
  // K-quants), so that each rank reads whole blocks of its columns; when
  // there are fewer such blocks than ranks, on 32 columns, and a rank whose
  // columns cut a block holds the whole block (LlamaLayerWeights).
  const int64_t ffn_granule =
      split_columns ? FfnGranule(source, split_ffn, tp) : split_ffn;
  const int64_t ffn_blocks = split_ffn / ffn_granule;
  if (c.vocab_size < tp) {
    return absl::InvalidArgumentError("vocabulary smaller than tp");
  }
  // A mixture's dense layers and shared experts: by columns, on the same
  // kind of granule as a dense model's FFN.
  struct ColumnSplit {
    int64_t width = 0, granule = 32;
  };
  const auto column_split =
      [&](int64_t width, const char* what) -> absl::StatusOr<ColumnSplit> {
    if (width == 0) return ColumnSplit{};
    if (width % 32 != 0 || width / 32 < tp) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", width,
          " cannot be split into whole 32-column blocks over tp ", tp));
    }
    return ColumnSplit{width, FfnGranule(source, width, tp)};
  };
  ASSIGN_OR_RETURN(
      const ColumnSplit dense_split,
      column_split(c.is_moe() && c.n_dense_layers > 0 ? c.ffn_hidden : 0,
                   "the dense layers' ffn_hidden"));
  ASSIGN_OR_RETURN(const ColumnSplit shared_split,
                   column_split(c.SharedFfn(), "the shared experts' FFN"));
  const auto columns_of = [&](const ColumnSplit& split, int t) {
    if (split.width == 0) return std::pair<int64_t, int64_t>{0, 0};
    auto [b, e] = EvenSplit(split.width / split.granule, tp, t);
    return std::pair<int64_t, int64_t>{
        b * split.granule, t == tp - 1 ? split.width : e * split.granule};
  };

  // Stage boundaries, balanced by the weights each stage computes with per
  // step: its layers, and on the last stage the output head (the whole
  // vocabulary matrix, every decode step; kPrefill leaves it out, since a
  // prompt's chunks run it for at most one row). The first stage's embedding
  // gathers a few rows per step, not the table, so it adds nothing. Weights,
  // not bytes: the dequantizing kernels' time follows the element count more
  // than the format (SmolLM2's tied Q8_0 head weighs 15 Q4_1 layers in
  // bytes, measured ~7 in time, 8 in weights). The old byte balance that
  // also charged the embedding left the last stage ~1.5x the first's work
  // at PP=2, which pipelining cannot hide (bench/pp_overlap.py).
  std::vector<uint64_t> layer_weights(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    layer_weights[l] = ElementsWithPrefix(source, absl::StrCat("blk.", l, "."));
  }
  const uint64_t embd = TensorBytes(source, "token_embd.weight");
  const uint64_t head =
      TensorElements(source, "output_norm.weight") +
      TensorElements(source,
                     c.tied_embeddings ? "token_embd.weight" : "output.weight");
  std::vector<uint64_t> extra(pp, 0);
  if (balance == PpBalance::kDecode) extra[pp - 1] += head;
  const std::vector<int64_t> bounds = BalancedPartition(layer_weights, extra);

  ShardPlan plan{.tp = tp,
                 .pp = pp,
                 .ffn_granule = ffn_granule,
                 .moe_sharding = moe_sharding};
  const int64_t group = c.n_heads / c.n_kv_heads;
  for (int p = 0; p < pp; ++p) {
    for (int t = 0; t < tp; ++t) {
      ShardSpec s{.tp_rank = t, .tp_size = tp, .pp_rank = p, .pp_size = pp};
      s.layer_begin = bounds[p];
      s.layer_end = bounds[p + 1];
      std::tie(s.kv_head_begin, s.kv_head_end) = EvenSplit(c.n_kv_heads, tp, t);
      s.head_begin = s.kv_head_begin * group;
      s.head_end = s.kv_head_end * group;
      if (split_columns) {
        auto [fb, fe] = EvenSplit(ffn_blocks, tp, t);
        s.ffn_begin = fb * ffn_granule;
        s.ffn_end = t == tp - 1 ? split_ffn : fe * ffn_granule;
        s.expert_end = c.n_experts;  // Every expert (none when dense).
      } else {
        s.ffn_end = split_ffn;
        std::tie(s.expert_begin, s.expert_end) = EvenSplit(c.n_experts, tp, t);
      }
      std::tie(s.dense_ffn_begin, s.dense_ffn_end) = columns_of(dense_split, t);
      std::tie(s.shared_ffn_begin, s.shared_ffn_end) =
          columns_of(shared_split, t);
      std::tie(s.vocab_begin, s.vocab_end) = EvenSplit(c.vocab_size, tp, t);
      s.vocab_padded = (c.vocab_size + tp - 1) / tp;
      // Bytes read: this rank's share of each sharded tensor, all of each
      // replicated one (norms).
      const double share_kv = double(s.n_kv_heads()) / c.n_kv_heads;
      const double share_ffn =
          double(s.ffn_end - s.ffn_begin) / split_ffn *
          (c.is_moe() ? double(s.n_experts()) / c.n_experts : 1.0);
      const double share_vocab =
          double(s.vocab_end - s.vocab_begin) / c.vocab_size;
      double bytes = 0;
      for (int64_t l = s.layer_begin; l < s.layer_end; ++l) {
        const std::string pre = absl::StrCat("blk.", l, ".");
        bytes += TensorBytes(source, pre + "attn_norm.weight") +
                 TensorBytes(source, pre + "ffn_norm.weight") +
                 TensorBytes(source, pre + "post_attention_norm.weight");
        bytes += share_kv * (TensorBytes(source, pre + "attn_q.weight") +
                             TensorBytes(source, pre + "attn_k.weight") +
                             TensorBytes(source, pre + "attn_v.weight") +
                             TensorBytes(source, pre + "attn_output.weight"));
        const double share_dense =
            c.is_moe() ? (dense_split.width == 0
                              ? 0.0
                              : double(s.dense_ffn_end - s.dense_ffn_begin) /
                                    dense_split.width)
                       : share_ffn;
        bytes += share_dense * (TensorBytes(source, pre + "ffn_gate.weight") +
                                TensorBytes(source, pre + "ffn_up.weight") +
                                TensorBytes(source, pre + "ffn_down.weight"));
        if (shared_split.width > 0) {
          bytes += double(s.shared_ffn_end - s.shared_ffn_begin) /
                   shared_split.width *
                   (TensorBytes(source, pre + "ffn_gate_shexp.weight") +
                    TensorBytes(source, pre + "ffn_up_shexp.weight") +
                    TensorBytes(source, pre + "ffn_down_shexp.weight"));
        }
        bytes += TensorBytes(source, pre + "exp_probs_b.bias");
        if (c.LayerIsMoe(l)) {
          // The router on every rank; the experts (merged or one tensor
          // each) by share.
          bytes += TensorBytes(source, pre + "ffn_gate_inp.weight");
          bytes += share_ffn * ElementsWithPrefixBytes(source, pre, "_exps.");
          for (int64_t e = 0; e < c.n_experts; ++e) {
            for (const char* kind : {"ffn_gate.", "ffn_up.", "ffn_down."}) {
              bytes +=
                  share_ffn *
                  TensorBytes(source, absl::StrCat(pre, kind, e, ".weight"));
            }
          }
        }
      }
      if (s.first_stage()) bytes += share_vocab * embd;
      if (s.last_stage()) {
        bytes += TensorBytes(source, "output_norm.weight");
        // A tied head on the first stage re-uses the rows already read.
        if (!(c.tied_embeddings && s.first_stage())) {
          bytes += share_vocab * TensorBytes(source, c.tied_embeddings
                                                         ? "token_embd.weight"
                                                         : "output.weight");
        }
      }
      s.weight_bytes = static_cast<uint64_t>(bytes);
      plan.shards.push_back(s);
    }
  }
  return plan;
}

}  // namespace shardlm
