#include "worker/llama_weights.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/dequantize.h"
#include "model/in_memory_weights.h"
#include "model/shard_plan.h"
#include "testing/status.h"

namespace shardlm {
namespace {

ModelConfig Config() { return SmallTestConfig(); }

struct Call {
  int64_t bytes;
  int done, total;
};

TEST(LoadProgressTest, ReportsEveryLayerOfTheShardAndEndsAtItsBytes) {
  auto source = RandomLlamaWeights(Config(), 1);
  auto plan = PlanShards(*source, 1, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const ShardSpec& spec = plan->at(1, 0);  // The last stage: 2 layers.
  std::vector<Call> calls;
  auto w = LoadLlamaWeights(*source, spec, [&](int64_t b, int d, int t) {
    calls.push_back({b, d, t});
  });
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(calls.size(), 3u);  // Head first, then each layer.
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].done, static_cast<int>(i));
    EXPECT_EQ(calls[i].total, 2);
    if (i > 0) EXPECT_GT(calls[i].bytes, calls[i - 1].bytes);
  }
  EXPECT_GT(calls[0].bytes, 0);  // The LM head.
  EXPECT_EQ(calls.back().bytes, w->bytes());
}

// A Q4_K model whose heads (64 values) and FFN columns cut 256-value
// super-blocks at TP 4: 6 KV heads split 2, 2, 1, 1 give query columns
// [0, 256), [256, 512), [512, 640), [640, 768) of attn_output, and 512 FFN
// columns (2 super-blocks for 4 ranks) split on 32: 128 each.
ModelConfig KQuantConfig() {
  ModelConfig c = Config();
  c.hidden = 256;
  c.ffn_hidden = 512;
  c.n_heads = 12;
  c.n_kv_heads = 6;
  c.head_dim = 64;
  return c;
}

TEST(LlamaWeightsTest, RanksWhoseColumnsCutBlocksHoldTheWholeBlocks) {
  auto source = RandomLlamaWeights(KQuantConfig(), 2, DType::kQ4_K);
  auto plan = PlanShards(*source, 4, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ffn_granule, 32);  // 2 super-blocks for 4 ranks.
  const TensorInfo* wo_info = source->Find("blk.0.attn_output.weight");
  ASSERT_NE(wo_info, nullptr);
  const int64_t q_cols[4][2] = {{0, 256}, {256, 512}, {512, 640}, {640, 768}};
  for (int t = 0; t < 4; ++t) {
    SCOPED_TRACE(t);
    const ShardSpec& spec = plan->at(0, t);
    EXPECT_EQ(spec.ffn_begin, 128 * t);
    auto w = LoadLlamaWeights(*source, spec);
    ASSERT_TRUE(w.ok()) << w.status();
    const LlamaLayerWeights& l = w->layers[0];
    // attn_output: the super-block(s) around this rank's columns, kept in
    // Q4_K, and where its columns start in them.
    const int64_t c0 = q_cols[t][0], c1 = q_cols[t][1];
    EXPECT_EQ(l.wo.dtype(), DType::kQ4_K);
    EXPECT_EQ(l.wo.dim(1), 256);
    EXPECT_EQ(l.wo_offset, c0 % 256);
    // Its exact columns are those of the file.
    auto exact = ExactColumns(l.wo, l.wo_offset, c1 - c0);
    ASSERT_TRUE(exact.ok()) << exact.status();
    auto want = DequantizeTensor(*source, *wo_info);  // [256, 768]
    ASSERT_TRUE(want.ok()) << want.status();
    for (int64_t r = 0; r < 256; ++r) {
      for (int64_t j = 0; j < c1 - c0; ++j) {
        ASSERT_EQ(exact->f32()[r * (c1 - c0) + j],
                  want->f32()[r * 768 + c0 + j])
            << "row " << r << " column " << j;
      }
    }
    // ffn_down: 128 columns inside one super-block.
    EXPECT_EQ(l.w_down.dim(1), 256);
    EXPECT_EQ(l.w_down_offset, (128 * t) % 256);
  }
  // At TP 2 the FFN splits on super-block edges (exact slices of ffn_down)
  // while 6 heads (384 columns) still cut one; at TP 3, 4 heads do not.
  auto plan2 = PlanShards(*source, 2, 1);
  ASSERT_TRUE(plan2.ok()) << plan2.status();
  EXPECT_EQ(plan2->ffn_granule, 256);
  EXPECT_NE(plan2->DebugString().find("multiples of 256"), std::string::npos)
      << plan2->DebugString();
  for (int t = 0; t < 2; ++t) {
    auto w = LoadLlamaWeights(*source, plan2->at(0, t));
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->layers[0].w_down.dim(1), 256);
    EXPECT_EQ(w->layers[0].w_down_offset, 0);
    EXPECT_EQ(w->layers[0].wo.dim(1), 512);
    EXPECT_EQ(w->layers[0].wo_offset, t == 0 ? 0 : 128);
  }
  auto plan3 = PlanShards(*source, 3, 1);
  ASSERT_TRUE(plan3.ok()) << plan3.status();
  auto w3 = LoadLlamaWeights(*source, plan3->at(0, 2));
  ASSERT_TRUE(w3.ok()) << w3.status();
  EXPECT_EQ(w3->layers[0].wo.dim(1), 256);
  EXPECT_EQ(w3->layers[0].wo_offset, 0);
  // Columns outside the slice are refused.
  EXPECT_FALSE(ExactColumns(w3->layers[0].wo, 200, 100).ok());
}

// A copy of `source` in which `edit` may rename, reshape or drop (return
// false) each tensor.
std::unique_ptr<InMemoryWeights> Edited(
    const WeightSource& source, ModelConfig config,
    const std::function<bool(TensorInfo&)>& edit) {
  auto out = std::make_unique<InMemoryWeights>(std::move(config));
  for (TensorInfo t : source.tensors()) {
    const absl::Span<const uint8_t> data = source.Data(t);
    if (!edit(t)) continue;
    out->AddRaw(t.name, t.dtype, t.shape,
                std::vector<uint8_t>(data.begin(), data.end()));
  }
  return out;
}

ModelConfig MoeConfig() {
  ModelConfig c = Config();
  c.architecture = "qwen3moe";
  c.n_experts = 4;
  c.n_experts_used = 2;
  c.expert_ffn_hidden = 64;
  return c;
}

TEST(LlamaWeightsTest, MixturesWithBadExpertTensorsAreRefusedByName) {
  const ModelConfig c = MoeConfig();
  auto source = RandomLlamaWeights(c, 3);
  ASSERT_TRUE(LoadLlamaWeights(*source).ok());
  const auto refused = [&](const WeightSource& s, absl::StatusCode code,
                           const std::string& phrase) {
    auto w = LoadLlamaWeights(s);
    EXPECT_TRUE(testing_util::IsError(w, code, phrase)) << w.status();
  };
  // An expert missing (the last layer's, so that the check comes first).
  auto missing = Edited(*source, c, [](TensorInfo& t) {
    return t.name != "blk.3.ffn_up.2.weight";
  });
  refused(*missing, absl::StatusCode::kNotFound, "blk.3.ffn_up.2.weight");
  // An expert of the wrong width.
  auto narrow = Edited(*source, c, [](TensorInfo& t) {
    if (t.name == "blk.1.ffn_down.0.weight") t.shape = {32, 128};
    return true;
  });
  refused(*narrow, absl::StatusCode::kInvalidArgument,
          "'blk.1.ffn_down.0.weight' has shape [32, 128], expected [64, 64]");
  // A router of the wrong width.
  auto router = Edited(*source, c, [](TensorInfo& t) {
    if (t.name == "blk.0.ffn_gate_inp.weight") t.shape = {2, 128};
    return true;
  });
  refused(*router, absl::StatusCode::kInvalidArgument, "ffn_gate_inp");
  // Merged experts whose count disagrees with the config's.
  InMemoryWeights merged(c);
  for (const TensorInfo& t : source->tensors()) {
    const absl::Span<const uint8_t> data = source->Data(t);
    if (t.name.find("ffn_gate.") != std::string::npos) continue;
    merged.AddRaw(t.name, t.dtype, t.shape,
                  std::vector<uint8_t>(data.begin(), data.end()));
  }
  for (int l = 0; l < 4; ++l) {
    merged.AddRaw(absl::StrCat("blk.", l, ".ffn_gate_exps.weight"), DType::kF32,
                  {3, 64, 64}, std::vector<uint8_t>(3 * 64 * 64 * 4));
  }
  refused(merged, absl::StatusCode::kInvalidArgument,
          "has shape [3, 64, 64], expected [4, 64, 64] (4 experts");
  // Top-k beyond the expert count.
  ModelConfig too_many = c;
  too_many.n_experts_used = 5;
  EXPECT_TRUE(testing_util::IsError(too_many.Validate(),
                                    absl::StatusCode::kInvalidArgument,
                                    "n_experts_used (top-k) 5 exceeds"));
}

TEST(LoadProgressTest, LogSaysNothingForAQuickLoadAndProgressForASlowOne) {
  testing::internal::CaptureStderr();
  LoadProgress quick = LogLoadProgress("worker rank 1");
  quick(10 << 20, 0, 2);
  quick(20 << 20, 2, 2);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");

  testing::internal::CaptureStderr();
  LoadProgress slow = LogLoadProgress("worker rank 2", absl::ZeroDuration());
  slow(10 << 20, 1, 4);
  slow(40 << 20, 4, 4);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("worker rank 2: loading weights: 1 of 4 layers, 10 MiB "
                      "(25%)"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("worker rank 2: loaded 40 MiB of weights (4 layers)"),
            std::string::npos)
      << said;
}

// A two-layer Qwen3.5 (layer 0 Gated DeltaNet, layer 1 gated attention)
// whose every value is distinct: tensor t's value i is t * 10000 + i, so a
// loaded slice names the file rows and columns it came from.
struct Qwen35Source {
  ModelConfig config;
  std::unique_ptr<InMemoryWeights> source;
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, Shape> shapes;
};

Qwen35Source TinyQwen35() {
  ModelConfig c = SmallTestConfig();
  c.architecture = "qwen35";
  c.n_layers = 2;
  c.linear_layers = {true, false};
  c.ssm_conv_width = 4;
  c.ssm_k_heads = 2;
  c.ssm_k_dim = 4;
  c.ssm_v_heads = 4;
  c.ssm_v_dim = 4;
  c.ssm_v_tiled = true;
  c.attention_gate = true;
  c.qk_norm = true;
  c.rope_dims = 4;
  c.norm_weight_offset = 1.0f;  // As a folder's: not for the gated norm.
  Qwen35Source q{c, std::make_unique<InMemoryWeights>(c), {}, {}};
  const int64_t h = c.hidden, f = c.ffn_hidden, d = c.head_dim;
  const int64_t ch = c.SsmConvChannels(), vd = c.ssm_v_heads * c.ssm_v_dim;
  const std::vector<std::pair<std::string, Shape>> tensors = {
      {"token_embd.weight", {c.vocab_size, h}},
      {"output_norm.weight", {h}},
      {"output.weight", {c.vocab_size, h}},
      {"blk.0.attn_norm.weight", {h}},
      {"blk.0.attn_qkv.weight", {ch, h}},
      {"blk.0.attn_gate.weight", {vd, h}},
      {"blk.0.ssm_beta.weight", {c.ssm_v_heads, h}},
      {"blk.0.ssm_alpha.weight", {c.ssm_v_heads, h}},
      {"blk.0.ssm_dt.bias", {c.ssm_v_heads}},
      {"blk.0.ssm_a", {c.ssm_v_heads}},
      {"blk.0.ssm_conv1d.weight", {ch, c.ssm_conv_width}},
      {"blk.0.ssm_norm.weight", {c.ssm_v_dim}},
      {"blk.0.ssm_out.weight", {h, vd}},
      {"blk.1.attn_norm.weight", {h}},
      {"blk.1.attn_q.weight", {2 * c.n_heads * d, h}},
      {"blk.1.attn_k.weight", {c.n_kv_heads * d, h}},
      {"blk.1.attn_v.weight", {c.n_kv_heads * d, h}},
      {"blk.1.attn_output.weight", {h, c.n_heads * d}},
      {"blk.1.attn_q_norm.weight", {d}},
      {"blk.1.attn_k_norm.weight", {d}},
  };
  std::vector<std::pair<std::string, Shape>> all = tensors;
  for (int l = 0; l < 2; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    all.push_back({p + "post_attention_norm.weight", {h}});
    all.push_back({p + "ffn_gate.weight", {f, h}});
    all.push_back({p + "ffn_up.weight", {f, h}});
    all.push_back({p + "ffn_down.weight", {h, f}});
  }
  for (size_t t = 0; t < all.size(); ++t) {
    int64_t n = 1;
    for (int64_t e : all[t].second) n *= e;
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) {
      v[i] = static_cast<float>(t * 10000 + i % 10000);
    }
    q.values[all[t].first] = v;
    q.shapes[all[t].first] = all[t].second;
    q.source->AddF32(all[t].first, all[t].second, std::move(v));
  }
  return q;
}

// Each TP rank holds its value heads (a contiguous range of the file's)
// and every q/k head; the attention's query rows come with their gates.
TEST(LlamaWeightsTest, GatedDeltaNetSlicesByValueHeads) {
  Qwen35Source q = TinyQwen35();
  const ModelConfig& c = q.config;
  EXPECT_TRUE(testing_util::IsError(RefuseUnbuiltLayers(c),
                                    absl::StatusCode::kUnimplemented,
                                    "Gated DeltaNet"));
  auto plan = PlanShards(*q.source, 2, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t h = c.hidden, dv = c.ssm_v_dim, w = c.ssm_conv_width;
  const int64_t qk = 2 * c.ssm_k_heads * c.ssm_k_dim;
  for (int t = 0; t < 2; ++t) {
    SCOPED_TRACE(t);
    const ShardSpec& spec = plan->at(0, t);
    const auto [v0, v1] = SsmValueHeads(c, spec);
    EXPECT_EQ(v0, 2 * t);
    EXPECT_EQ(v1, 2 * t + 2);
    auto loaded = LoadLlamaWeights(*q.source, spec);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const LlamaLayerWeights& l = loaded->layers[0];
    EXPECT_TRUE(l.wq.empty() && l.wo.empty() && l.q_norm.empty());
    // A row r of a loaded matrix must be row `from` of the file's.
    const auto rows_are = [&](const Tensor& m, const std::string& name,
                              int64_t from, int64_t n, int64_t cols) {
      ASSERT_EQ(m.shape(), (Shape{n, cols})) << name;
      const std::vector<float>& file = q.values.at(name);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
          ASSERT_EQ(m.f32()[r * cols + j], file[(from + r) * cols + j])
              << name << " [" << r << ", " << j << "]";
        }
      }
    };
    rows_are(l.ssm_qk, "blk.0.attn_qkv.weight", 0, qk, h);
    rows_are(l.ssm_v, "blk.0.attn_qkv.weight", qk + v0 * dv, 2 * dv, h);
    rows_are(l.ssm_z, "blk.0.attn_gate.weight", v0 * dv, 2 * dv, h);
    rows_are(l.ssm_beta, "blk.0.ssm_beta.weight", v0, 2, h);
    rows_are(l.ssm_alpha, "blk.0.ssm_alpha.weight", v0, 2, h);
    EXPECT_EQ(l.ssm_dt.f32()[0], q.values.at("blk.0.ssm_dt.bias")[v0]);
    EXPECT_EQ(l.ssm_a.f32()[1], q.values.at("blk.0.ssm_a")[v0 + 1]);
    // The convolution: every q/k channel, then this rank's v channels.
    ASSERT_EQ(l.ssm_conv.shape(), (Shape{qk + 2 * dv, w}));
    const std::vector<float>& conv = q.values.at("blk.0.ssm_conv1d.weight");
    EXPECT_EQ(l.ssm_conv.f32()[(qk - 1) * w], conv[(qk - 1) * w]);
    EXPECT_EQ(l.ssm_conv.f32()[qk * w + 1], conv[(qk + v0 * dv) * w + 1]);
    // The gated norm as stored; the others plus the config's offset.
    EXPECT_EQ(l.ssm_norm.f32()[2], q.values.at("blk.0.ssm_norm.weight")[2]);
    EXPECT_EQ(l.attn_norm.f32()[2],
              q.values.at("blk.0.attn_norm.weight")[2] + 1.0f);
    // ssm_out: this rank's value columns.
    ASSERT_EQ(l.ssm_out.shape(), (Shape{h, 2 * dv}));
    EXPECT_EQ(l.ssm_out_offset, 0);
    EXPECT_EQ(l.ssm_out.f32()[3 * 2 * dv + 1],
              q.values.at("blk.0.ssm_out.weight")[3 * 4 * dv + v0 * dv + 1]);
    // Layer 1 attends: its query heads' rows with their gates' (2 d each).
    const LlamaLayerWeights& a = loaded->layers[1];
    EXPECT_TRUE(a.ssm_qk.empty());
    rows_are(a.wq, "blk.1.attn_q.weight", 2 * spec.head_begin * c.head_dim,
             2 * spec.n_heads() * c.head_dim, h);
  }
}

// Qwen3-Next's fused tensors: ssm_ba (per key head, its value heads'
// betas then alphas) and older files' ssm_in (per key head: q, k, its value
// heads' v, their z), gathered into the same per-rank tensors as the split
// ones they were made from, at TP 1 and 2.
TEST(LlamaWeightsTest, Qwen3NextFusedTensorsLoadAsTheSplitOnes) {
  Qwen35Source split = TinyQwen35();
  ModelConfig c = split.config;
  c.architecture = "qwen3next";
  c.ssm_v_tiled = false;
  split.source = std::make_unique<InMemoryWeights>(c);
  InMemoryWeights fused(c);
  const int64_t h = c.hidden, hk = c.ssm_k_heads, dk = c.ssm_k_dim,
                dv = c.ssm_v_dim, nv = c.ssm_v_heads, r = nv / hk;
  const auto row = [&](const std::string& name, int64_t i) {
    const std::vector<float>& m = split.values.at(name);
    return std::vector<float>(m.begin() + i * h, m.begin() + (i + 1) * h);
  };
  std::vector<float> ssm_in, ba;
  const auto append = [](std::vector<float>& to, std::vector<float> rows) {
    to.insert(to.end(), rows.begin(), rows.end());
  };
  for (int64_t g = 0; g < hk; ++g) {
    for (int64_t e = 0; e < dk; ++e) {
      append(ssm_in, row("blk.0.attn_qkv.weight", g * dk + e));
    }
    for (int64_t e = 0; e < dk; ++e) {
      append(ssm_in, row("blk.0.attn_qkv.weight", hk * dk + g * dk + e));
    }
    for (int64_t e = 0; e < r * dv; ++e) {
      append(ssm_in,
             row("blk.0.attn_qkv.weight", 2 * hk * dk + g * r * dv + e));
    }
    for (int64_t e = 0; e < r * dv; ++e) {
      append(ssm_in, row("blk.0.attn_gate.weight", g * r * dv + e));
    }
    for (int64_t j = 0; j < r; ++j)
      append(ba, row("blk.0.ssm_beta.weight", g * r + j));
    for (int64_t j = 0; j < r; ++j)
      append(ba, row("blk.0.ssm_alpha.weight", g * r + j));
  }
  for (const auto& [name, values] : split.values) {
    const Shape& shape = split.shapes.at(name);
    split.source->AddF32(name, shape, values);
    const bool replaced =
        name == "blk.0.attn_qkv.weight" || name == "blk.0.attn_gate.weight" ||
        name == "blk.0.ssm_beta.weight" || name == "blk.0.ssm_alpha.weight";
    if (!replaced) fused.AddF32(name, shape, values);
  }
  fused.AddF32("blk.0.ssm_in.weight", {hk * (2 * dk + 2 * r * dv), h}, ssm_in);
  fused.AddF32("blk.0.ssm_ba.weight", {2 * nv, h}, ba);
  for (int tp : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("tp ", tp));
    auto plan = PlanShards(fused, tp, 1);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (int t = 0; t < tp; ++t) {
      auto want = LoadLlamaWeights(*split.source, plan->at(0, t));
      auto got = LoadLlamaWeights(fused, plan->at(0, t));
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      const LlamaLayerWeights &w = want->layers[0], &g = got->layers[0];
      for (auto [name, a, b] : {std::tuple{"ssm_qk", &w.ssm_qk, &g.ssm_qk},
                                {"ssm_v", &w.ssm_v, &g.ssm_v},
                                {"ssm_z", &w.ssm_z, &g.ssm_z},
                                {"ssm_beta", &w.ssm_beta, &g.ssm_beta},
                                {"ssm_alpha", &w.ssm_alpha, &g.ssm_alpha}}) {
        ASSERT_EQ(a->shape(), b->shape()) << name;
        EXPECT_TRUE(
            std::equal(a->f32().begin(), a->f32().end(), b->f32().begin()))
            << name << " of rank " << t;
      }
    }
  }
}

}  // namespace
}  // namespace shardlm
