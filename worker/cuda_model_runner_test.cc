// CudaModelRunner against the CPU ModelRunner, step for step:
//  - a synthetic model with bf16-exact random weights (both backends hold
//    identical weights), teacher-forced, mixed prefill and decode steps;
//  - SmolLM2-135M (the GGUF named by $SHARDLM_MODEL): 32 greedy tokens
//    from each backend running freely must be equal, and the logits of
//    the last prompt position within a bf16 bound.
// Skips, saying why, without a GPU or without the model file.
#include "worker/cuda_model_runner.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "core/half.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "model/tokenizer.h"
#include "model/weight_source.h"
#include "testing/gpu_parity_prompts.h"
#include "worker/activation_memory.h"
#include "worker/seq_step_testing.h"

namespace shardlm {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (auto n = CudaDeviceCount(); !n.ok()) GTEST_SKIP() << n.status().message()

using ForwardFn = std::function<absl::StatusOr<Tensor>(const StepInput&)>;

// A one-layer Llama of these dimensions (bf16-exact random weights come
// from RandomHostWeights).
struct ToyDims {
  int64_t hidden, ffn_hidden, n_heads, n_kv_heads, head_dim, vocab_size,
      context_length;
};
ModelConfig OneLayer(const ToyDims& d) {
  ModelConfig c;
  c.n_layers = 1;
  c.hidden = d.hidden;
  c.ffn_hidden = d.ffn_hidden;
  c.n_heads = d.n_heads;
  c.n_kv_heads = d.n_kv_heads;
  c.head_dim = d.head_dim;
  c.vocab_size = d.vocab_size;
  c.context_length = d.context_length;
  return c;
}

// `blocks` blocks of 16 tokens for every layer of `c`.
KvPoolConfig KvFor(const ModelConfig& c, int64_t blocks) {
  return {.n_layers = c.n_layers,
          .kv_heads = c.n_kv_heads,
          .head_dim = c.head_dim,
          .block_size = 16,
          .num_blocks = blocks};
}

// A runner on GPU 0 holding `host`'s weights (uploaded as bf16).
absl::StatusOr<std::unique_ptr<CudaModelRunner>> GpuRunner(
    const ModelConfig& c, const KvPoolConfig& kv, const LlamaWeights& host) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaModelRunner> gpu,
                   CudaModelRunner::Create(0, c, kv));
  ASSIGN_OR_RETURN(LlamaWeights weights,
                   UploadLlamaWeights(host, gpu->backend(), gpu->exec()));
  RETURN_IF_ERROR(gpu->SetWeights(std::move(weights)));
  return gpu;
}

int32_t Argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

struct Diff {
  double max_abs = 0, mean_abs = 0, max_ref = 0;
};
Diff Compare(const Tensor& got, const Tensor& want) {
  Diff d;
  const auto g = got.f32(), w = want.f32();
  for (size_t i = 0; i < w.size(); ++i) {
    double e = std::abs(double{g[i]} - w[i]);
    if (std::isnan(e)) e = INFINITY;  // std::max would drop a NaN.
    d.max_abs = std::max(d.max_abs, e);
    d.mean_abs += e / w.size();
    d.max_ref = std::max(d.max_ref, std::abs(double{w[i]}));
  }
  return d;
}

// Random host weights of `c`, rounded to bf16 so that the GPU's bf16 copy
// holds exactly the CPU's values. A mixture's router is random at
// `router_scale` (0: all zero, so every token's experts tie and go to the
// lowest indices on both backends).
LlamaWeights RandomHostWeights(const ModelConfig& c, uint32_t seed,
                               float router_scale = 1.0f) {
  std::mt19937 rng(seed);
  const auto make = [&](Shape shape, float scale, float offset = 0.0f) {
    Tensor t = *Tensor::Host(DType::kF32, std::move(shape));
    std::uniform_real_distribution<float> u(-scale, scale);
    for (float& v : t.f32()) v = Bf16ToFloat(FloatToBf16(offset + u(rng)));
    return t;
  };
  const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  const float sh = 1.0f / std::sqrt(static_cast<float>(c.hidden));
  LlamaWeights w;
  w.config = c;
  w.spec = WholeModelSpec(c);
  w.token_embd = make({c.vocab_size, c.hidden}, 1.0f);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LlamaLayerWeights lw;
    lw.attn_norm = make({c.hidden}, 0.2f, 1.0f);
    lw.ffn_norm = make({c.hidden}, 0.2f, 1.0f);
    lw.wq = make({q, c.hidden}, 2 * sh);
    lw.wk = make({kv, c.hidden}, 2 * sh);
    lw.wv = make({kv, c.hidden}, sh);
    lw.wo = make({c.hidden, q}, 1.0f / std::sqrt(static_cast<float>(q)));
    if (c.is_moe()) {
      const int64_t e = c.n_experts, f = c.expert_ffn_hidden;
      lw.router = make({e, c.hidden}, router_scale * 4 * sh);
      lw.exp_gate = make({e * f, c.hidden}, sh);
      lw.exp_up = make({e * f, c.hidden}, sh);
      lw.exp_down =
          make({e * c.hidden, f}, 1.0f / std::sqrt(static_cast<float>(f)));
    } else {
      lw.w_gate = make({c.ffn_hidden, c.hidden}, sh);
      lw.w_up = make({c.ffn_hidden, c.hidden}, sh);
      lw.w_down = make({c.hidden, c.ffn_hidden},
                       1.0f / std::sqrt(static_cast<float>(c.ffn_hidden)));
    }
    if (c.qk_norm) {  // Qwen3: per-head RMSNorm of q and k.
      lw.q_norm = make({c.head_dim}, 0.2f, 1.0f);
      lw.k_norm = make({c.head_dim}, 0.2f, 1.0f);
    }
    if (c.attention_bias) {  // Qwen2: biases of Q, K and V.
      lw.bq = make({q}, 0.5f);
      lw.bk = make({kv}, 0.5f);
      lw.bv = make({kv}, 0.5f);
    }
    w.layers.push_back(std::move(lw));
  }
  w.output_norm = make({c.hidden}, 0.2f, 1.0f);
  w.lm_head = make({c.vocab_size, c.hidden}, 2 * sh);
  return w;
}

TEST(CudaModelRunnerTest, SyntheticModelMatchesCpuStepByStep) {
  SKIP_WITHOUT_GPU();
  ModelConfig c;
  c.name = "synthetic";
  c.n_layers = 3;
  c.hidden = 288;
  c.ffn_hidden = 769;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.head_dim = 32;
  c.vocab_size = 1003;
  c.context_length = 1024;
  c.rope_theta = 10000.0f;
  c.rope_style = RopeStyle::kAdjacentPairs;
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  const KvPoolConfig kv{.n_layers = c.n_layers,
                        .kv_heads = c.n_kv_heads,
                        .head_dim = c.head_dim,
                        .block_size = 16,
                        .num_blocks = 64,
                        // The CPU reference keeps f32 KV.
                        .dtype = DType::kF32};
  LlamaWeights host = RandomHostWeights(c, 7);
  auto gpu = GpuRunner(c, kv, host);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  // The same without CUDA graphs, to check graph replays against.
  auto eager = GpuRunner(c, kv, host);
  ASSERT_TRUE(eager.ok()) << eager.status();
  (*eager)->set_cuda_graphs(false);
  ModelRunner cpu(std::move(host), *KvPool::Create(kv));

  // Teacher-forced on the CPU's greedy tokens: a 300-token prefill in
  // chunks of 128, then 20 decode steps. Bound: the GPU rounds GEMM
  // inputs and the KV cache to bf16 (2^-9 relative) at 7 points per
  // layer; 3% of the largest logit covers that with margin.
  std::vector<int32_t> prompt(300);
  std::mt19937 rng(3);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
  int32_t pos = 0;
  Tensor cpu_logits, gpu_logits;
  for (int32_t begin = 0; begin < 300; begin += 128) {
    const int32_t end = std::min(300, begin + 128);
    std::vector<int32_t> chunk(prompt.begin() + begin, prompt.begin() + end);
    StepInput s = SeqStep(chunk, pos, kv.block_size, kv.num_blocks);
    auto a = cpu.Forward(s);
    auto b = (*gpu)->Forward(s);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    cpu_logits = *a;
    gpu_logits = *b;
    pos = end;
  }
  int argmax_checked = 0;
  for (int step = 0; step < 20; ++step) {
    const Diff d = Compare(gpu_logits, cpu_logits);
    EXPECT_LE(d.max_abs, 0.03 * d.max_ref)
        << "step " << step << " mean " << d.mean_abs;
    // Argmax must agree unless the CPU's top two are within the bound.
    const int64_t vocab = c.vocab_size;
    std::vector<float> sorted(cpu_logits.f32().begin(), cpu_logits.f32().end());
    std::nth_element(sorted.begin(), sorted.begin() + 1, sorted.end(),
                     std::greater<float>());
    const int32_t want = Argmax(cpu_logits.f32().data(), vocab);
    if (sorted[0] - sorted[1] > 2 * d.max_abs) {
      EXPECT_EQ(Argmax(gpu_logits.f32().data(), vocab), want)
          << "step " << step;
      ++argmax_checked;
    }
    StepInput s = SeqStep({want}, pos++, kv.block_size, kv.num_blocks);
    auto a = cpu.Forward(s);
    auto b = (*gpu)->Forward(s);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    cpu_logits = *a;
    gpu_logits = *b;
    if (step == 0) {  // Bring the eager runner's cache to the same state.
      for (int32_t begin = 0; begin < 300; begin += 128) {
        const int32_t end = std::min(300, begin + 128);
        std::vector<int32_t> chunk(prompt.begin() + begin,
                                   prompt.begin() + end);
        ASSERT_TRUE(
            (*eager)
                ->Forward(SeqStep(chunk, begin, kv.block_size, kv.num_blocks))
                .ok());
      }
    }
    if (step < 19) {
      // Replays (after the first capture) against eager launches.
      auto e = (*eager)->Forward(s);
      ASSERT_TRUE(e.ok()) << e.status();
      // Same kernels; cuBLAS may pick another algorithm under capture, so
      // not necessarily bit for bit. A stale graph would be far off.
      const Diff g = Compare(*e, gpu_logits);
      EXPECT_LE(g.max_abs, 1e-4 * g.max_ref) << "step " << step;
    }
  }
  EXPECT_TRUE((*gpu)->cuda_graphs()) << "graph capture fell back to eager";
  EXPECT_GE((*gpu)->graph_captures(), 1);
  std::printf("synthetic: argmax compared on %d of 20 decode steps\n",
              argmax_checked);
  EXPECT_GT(argmax_checked, 10);
}

// The model families' features on the GPU against the CPU, teacher-forced
// on the CPU's greedy tokens (a prompt in chunks, then decode steps):
// Qwen2's Q/K/V biases with theta 1e6, Llama 3.1's RoPE scaling, YaRN (its
// cos/sin magnitude too), Mistral's sliding window shorter than the
// context (in prefill chunks and in decode), Qwen2's window in some layers
// only, and dynamic NTK served static. Bound as the synthetic test.
// Decode steps of varying batch sizes run as graphs padded to
// GraphBatchSize: one capture per padded size, replays after, and the same
// logits as eager launches of the unpadded steps (the padding sequences,
// whose table names block 0, must not write sequence 0's first block).
TEST(CudaModelRunnerTest, DecodeGraphsArePaddedAndKeptPerBatchSize) {
  SKIP_WITHOUT_GPU();
  ModelConfig c = OneLayer({.hidden = 256,
                            .ffn_hidden = 512,
                            .n_heads = 8,
                            .n_kv_heads = 2,
                            .head_dim = 32,
                            .vocab_size = 500,
                            .context_length = 512});
  c.n_layers = 2;
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  const KvPoolConfig kv = KvFor(c, 64);
  const LlamaWeights host = RandomHostWeights(c, 11);
  auto graphs = GpuRunner(c, kv, host);
  auto eager = GpuRunner(c, kv, host);
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  ASSERT_TRUE(eager.ok()) << eager.status();
  (*eager)->set_cuda_graphs(false);
  // As serving does at load: buffers that grow move, which drops every
  // graph captured over them (the first rounds would otherwise be
  // captured again after round 2 grows the rows from 4 to 8).
  for (auto* r : {&*graphs, &*eager}) {
    ASSERT_TRUE((*r)->ReserveActivations(64, 8).ok());
  }

  // Seven sequences; sequence s holds blocks 4s .. 4s + 3 (so sequence 0
  // holds block 0) and starts with a prompt of 10 + 3s tokens.
  constexpr int kSeqs = 7;
  std::vector<std::vector<int32_t>> tables(kSeqs);
  std::vector<int32_t> next_pos(kSeqs);
  std::mt19937 rng(5);
  const auto token = [&] { return static_cast<int32_t>(rng() % c.vocab_size); };
  for (int s = 0; s < kSeqs; ++s) {
    for (int b = 0; b < 4; ++b) tables[s].push_back(4 * s + b);
    StepInput p;
    for (int i = 0; i < 10 + 3 * s; ++i) {
      p.tokens.push_back(token());
      p.positions.push_back(i);
      p.token_seq.push_back(0);
    }
    p.block_tables = {tables[s]};
    p.seq_ids = {s};
    p.logit_rows = {static_cast<int32_t>(p.tokens.size() - 1)};
    p.sampling = {SamplingParams{}};
    p.sample_index = {0};
    next_pos[s] = static_cast<int32_t>(p.tokens.size());
    ASSERT_TRUE((*graphs)->Forward(p).ok());
    ASSERT_TRUE((*eager)->Forward(p).ok());
  }
  ASSERT_EQ((*graphs)->graph_captures(), 0) << "prefill steps are eager";

  // Batches of 3, 5, 7 and 2 sequences: padded to 4, 8, 8 and 2.
  const std::vector<std::vector<int>> rounds = {
      {0, 1, 2}, {0, 1, 2}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4, 5, 6},
      {5, 6},    {0, 1, 2}, {2, 3, 4, 5, 6}, {0, 1, 2, 3, 4, 5, 6},
      {1, 3, 5}, {5, 6},    {0, 1, 2, 3, 4}, {4, 5, 6}};
  for (size_t r = 0; r < rounds.size(); ++r) {
    StepInput d;
    for (const int s : rounds[r]) {
      const int32_t i = static_cast<int32_t>(d.tokens.size());
      d.tokens.push_back(token());
      d.positions.push_back(next_pos[s]++);
      d.token_seq.push_back(i);
      d.block_tables.push_back(tables[s]);
      d.seq_ids.push_back(s);
      d.logit_rows.push_back(i);
      d.sampling.push_back(SamplingParams{});
      d.sample_index.push_back(0);
    }
    auto g = (*graphs)->Forward(d);
    auto e = (*eager)->Forward(d);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_EQ(g->shape(), e->shape()) << "round " << r;
    const Diff diff = Compare(*g, *e);
    EXPECT_LE(diff.max_abs, 1e-4 * diff.max_ref) << "round " << r;
  }
  EXPECT_TRUE((*graphs)->cuda_graphs());
  // Padded sizes 4, 8 and 2, each captured once (the tables' width and the
  // split count stay put below 32 blocks).
  EXPECT_EQ((*graphs)->graph_captures(), 3);
  EXPECT_EQ((*graphs)->graph_replays(),
            static_cast<int64_t>(rounds.size()) - 3);
  EXPECT_EQ((*eager)->graph_captures(), 0);
}

TEST(CudaModelRunnerTest, ModelFamilyFeaturesMatchCpu) {
  SKIP_WITHOUT_GPU();
  struct Variant {
    const char* name;
    std::function<void(ModelConfig&)> apply;
    float router_scale = 1.0f;  // Mixtures (RandomHostWeights).
  };
  const Variant variants[] = {
      {"qwen2 biases",
       [](ModelConfig& c) {
         c.architecture = "qwen2";
         c.attention_bias = true;
         c.rope_theta = 1000000.0f;
         c.tied_embeddings = true;
       }},
      {"llama3 rope scaling",
       [](ModelConfig& c) {
         c.rope_theta = 500000.0f;
         c.rope_scaling = {.type = RopeScalingType::kLlama3,
                           .factor = 8,
                           .original_context = 64,
                           .low_freq_factor = 1,
                           .high_freq_factor = 4};
       }},
      {"yarn",
       [](ModelConfig& c) {
         c.rope_scaling = {.type = RopeScalingType::kYarn,
                           .factor = 4,
                           .original_context = 64};
       }},
      {"sliding window 20",
       [](ModelConfig& c) {
         c.architecture = "mistral";
         c.sliding_window = 20;
       }},
      {"qwen2 window in layer 1 only",
       [](ModelConfig& c) {
         c.architecture = "qwen2";
         c.attention_bias = true;
         c.sliding_window = 20;
         c.window_layers = {false, true};
       }},
      {"dynamic ntk (static base)",
       [](ModelConfig& c) {
         c.rope_scaling = {.type = RopeScalingType::kDynamic,
                           .factor = 2,
                           .original_context = 128};
       }},
      {"qwen3 qk norm, head_dim 64 of hidden 192 / 6 heads",
       [](ModelConfig& c) {
         c.architecture = "qwen3";
         c.qk_norm = true;
         c.head_dim = 64;
         c.rope_theta = 1000000.0f;
       }},
      // Mixtures. Routing is discontinuous: a token whose k-th and
      // (k+1)-th router logits differ by less than bf16's rounding of the
      // normed input could pick another expert on the GPU than on the CPU.
      // So: every expert for every token (weights continuous in the
      // logits), and a zero router (exact ties, the lowest indices win on
      // both; experts 2 and 3 get no tokens). The ops' own test checks
      // gathers of arbitrary rows exactly.
      {"qwen3moe, top-4 of 4 experts",
       [](ModelConfig& c) {
         c.architecture = "qwen3moe";
         c.qk_norm = true;
         c.n_experts = 4;
         c.n_experts_used = 4;
         c.expert_ffn_hidden = 96;
         c.expert_weights_norm = true;
       }},
      {"mixtral, tied router: top-2 of 4 experts",
       [](ModelConfig& c) {
         c.architecture = "mixtral";
         c.n_experts = 4;
         c.n_experts_used = 2;
         c.expert_ffn_hidden = 96;
       },
       /*router_scale=*/0.0f},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    ModelConfig c;
    c.name = v.name;
    c.n_layers = 2;
    c.hidden = 192;
    c.ffn_hidden = 320;
    c.n_heads = 6;
    c.n_kv_heads = 2;
    c.head_dim = 32;
    c.vocab_size = 501;
    c.context_length = 256;
    c.rope_style = RopeStyle::kRotateHalf;
    v.apply(c);
    ASSERT_TRUE(c.Validate().ok()) << c.Validate();
    const KvPoolConfig kv{.n_layers = c.n_layers,
                          .kv_heads = c.n_kv_heads,
                          .head_dim = c.head_dim,
                          .block_size = 16,
                          .num_blocks = 16,
                          .dtype = DType::kF32};  // The CPU's: f32 KV.
    LlamaWeights host = RandomHostWeights(c, 17, v.router_scale);
    auto gpu = GpuRunner(c, kv, host);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    ModelRunner cpu(std::move(host), *KvPool::Create(kv));
    std::vector<int32_t> prompt(100);
    std::mt19937 rng(9);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
    // The prompt in chunks of 32, then 24 decode steps (past the window's
    // reach of the prompt), each on the CPU's greedy token.
    Tensor cpu_logits;
    for (int32_t pos = 0, step = 0; pos < 124; ++step) {
      const int32_t end = pos < 100 ? std::min(100, pos + 32) : pos + 1;
      const std::vector<int32_t> tokens =
          pos < 100
              ? std::vector<int32_t>(prompt.begin() + pos, prompt.begin() + end)
              : std::vector<int32_t>{
                    Argmax(cpu_logits.f32().data(), c.vocab_size)};
      const StepInput s = SeqStep(tokens, pos, kv.block_size, kv.num_blocks);
      auto a = cpu.Forward(s);
      auto b = (*gpu)->Forward(s);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      const Diff d = Compare(*b, *a);
      EXPECT_LE(d.max_abs, 0.03 * d.max_ref)
          << "step " << step << " mean " << d.mean_abs;
      cpu_logits = *a;
      pos = end;
    }
  }
}

// The scheduler's real pattern: several sequences in one step, prefill
// chunks and decode tokens mixed, scattered blocks; then all-decode steps
// over the same sequences. Every logit row against the CPU.
TEST(CudaModelRunnerTest, MixedBatchesOfSequencesMatchCpu) {
  SKIP_WITHOUT_GPU();
  ModelConfig c;
  c.n_layers = 2;
  c.hidden = 192;
  c.ffn_hidden = 320;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  c.vocab_size = 777;
  c.context_length = 512;
  c.rope_style = RopeStyle::kRotateHalf;
  const KvPoolConfig kv{.n_layers = c.n_layers,
                        .kv_heads = c.n_kv_heads,
                        .head_dim = c.head_dim,
                        .block_size = 16,
                        .num_blocks = 40,
                        // The CPU reference keeps f32 KV.
                        .dtype = DType::kF32};
  LlamaWeights host = RandomHostWeights(c, 11);
  auto gpu = GpuRunner(c, kv, host);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ModelRunner cpu(std::move(host), *KvPool::Create(kv));

  // Three sequences, blocks interleaved across the pool.
  const std::vector<std::vector<int32_t>> tables = {
      {5, 17, 2, 30, 9}, {11, 0, 23, 7, 38}, {33, 14, 26, 1, 20}};
  std::vector<int32_t> len = {0, 0, 0};
  std::mt19937 rng(5);
  // Per step: how many new tokens each sequence gets (0: not in the step).
  const std::vector<std::vector<int32_t>> plan = {
      {20, 0, 0}, {1, 37, 0}, {1, 1, 50}, {1, 16, 1},
      {1, 1, 1},  {1, 1, 1},  {0, 1, 1},  {1, 1, 1}};
  for (size_t p = 0; p < plan.size(); ++p) {
    StepInput s;
    for (int q = 0; q < 3; ++q) {
      for (int32_t t = 0; t < plan[p][q]; ++t) {
        s.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
        s.positions.push_back(len[q]++);
        s.token_seq.push_back(q);
      }
      if (plan[p][q] > 0) {
        s.logit_rows.push_back(static_cast<int32_t>(s.tokens.size() - 1));
        s.sampling.push_back({});
        s.sample_index.push_back(0);
      }
      s.block_tables.push_back(tables[q]);
      s.seq_ids.push_back(q);
    }
    auto a = cpu.Forward(s);
    auto b = (*gpu)->Forward(s);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    const Diff d = Compare(*b, *a);
    // As the synthetic test: bf16 GEMM inputs and KV cache.
    EXPECT_LE(d.max_abs, 0.03 * d.max_ref)
        << "step " << p << " mean " << d.mean_abs;
  }
}

// The host KV tier: a sequence swapped out to pinned memory (device ->
// host copies), decoding from there in place (its blocks past the device
// pool, the new token written there too), swapped back in to other device
// blocks, while a second sequence decodes on the device; and a copies-only
// step. The CPU runner runs the same copies on its one allocation; every
// step's logits against it.
TEST(CudaModelRunnerTest, HostTierSwapsMatchCpu) {
  SKIP_WITHOUT_GPU();
  ModelConfig c;
  c.n_layers = 2;
  c.hidden = 192;
  c.ffn_hidden = 320;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  c.vocab_size = 301;
  c.context_length = 512;
  KvPoolConfig kv{.n_layers = c.n_layers,
                  .kv_heads = c.n_kv_heads,
                  .head_dim = c.head_dim,
                  .block_size = 16,
                  .num_blocks = 8,
                  .num_host_blocks = 8,
                  .dtype = DType::kF32};
  LlamaWeights host = RandomHostWeights(c, 23);
  auto gpu = GpuRunner(c, kv, host);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE((*gpu)->SetKvBlocks(8, 8).ok());
  ModelRunner cpu(std::move(host), *KvPool::Create(kv));

  std::mt19937 rng(13);
  const auto token = [&] { return static_cast<int32_t>(rng() % c.vocab_size); };
  // Sequence 0 at `pos0` (n0 tokens) over table0, and optionally sequence 1
  // decoding one token at `pos1` over table1.
  const auto step = [&](int32_t pos0, int n0, std::vector<int32_t> table0,
                        int32_t pos1, std::vector<int32_t> table1,
                        std::vector<BlockCopy> copies) {
    StepInput s;
    for (int i = 0; i < n0; ++i) {
      s.tokens.push_back(token());
      s.positions.push_back(pos0 + i);
      s.token_seq.push_back(0);
    }
    s.logit_rows.push_back(static_cast<int32_t>(s.tokens.size()) - 1);
    s.block_tables.push_back(std::move(table0));
    s.seq_ids.push_back(0);
    if (pos1 >= 0) {
      s.tokens.push_back(token());
      s.positions.push_back(pos1);
      s.token_seq.push_back(1);
      s.logit_rows.push_back(static_cast<int32_t>(s.tokens.size()) - 1);
      s.block_tables.push_back(std::move(table1));
      s.seq_ids.push_back(1);
    }
    s.sampling.resize(s.logit_rows.size());
    s.sample_index.resize(s.logit_rows.size());
    s.copies = std::move(copies);
    return s;
  };
  const auto expect_same = [&](const StepInput& s) {
    auto a = cpu.Forward(s);
    auto b = (*gpu)->Forward(s);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    const Diff d = Compare(*b, *a);
    // As the synthetic test: bf16 GEMM inputs and KV cache.
    EXPECT_LE(d.max_abs, 0.03 * d.max_ref) << "mean " << d.mean_abs;
  };
  expect_same(step(0, 40, {0, 1, 2}, -1, {}, {}));  // Prefill on the device.
  {
    // A copies-only step: a spill of device block 7 (unused) to the host.
    StepInput copies_only;
    copies_only.copies = {{7, 15}};
    ASSERT_TRUE(cpu.Forward(copies_only).ok());
    auto g = (*gpu)->Forward(copies_only);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(g->empty());
  }
  // Swap out; decode from the host tier; swap back in; decode.
  expect_same(step(40, 1, {8, 9, 10}, 0, {6}, {{0, 8}, {1, 9}, {2, 10}}));
  expect_same(step(41, 1, {8, 9, 10}, 1, {6}, {}));
  expect_same(step(42, 1, {3, 4, 5}, 2, {6}, {{8, 3}, {9, 4}, {10, 5}}));
  expect_same(step(43, 1, {3, 4, 5}, 3, {6}, {}));
  EXPECT_EQ((*gpu)->stats().copied_blocks, 7);
  // A copy outside the pools is refused before anything runs.
  StepInput bad = step(44, 1, {3, 4, 5}, -1, {}, {{3, 16}});
  EXPECT_EQ((*gpu)->Forward(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaModelRunnerTest, BadStepIsInvalidArgumentAndWritesNothing) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = OneLayer({.hidden = 64,
                                  .ffn_hidden = 96,
                                  .n_heads = 2,
                                  .n_kv_heads = 1,
                                  .head_dim = 32,
                                  .vocab_size = 50,
                                  .context_length = 64});
  const KvPoolConfig kv = KvFor(c, /*blocks=*/2);
  auto gpu = GpuRunner(c, kv, RandomHostWeights(c, 1));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  StepInput bad_token = SeqStep({50}, 0, 16, 2);
  EXPECT_EQ((*gpu)->Forward(bad_token).status().code(),
            absl::StatusCode::kInvalidArgument);
  StepInput no_block = SeqStep({1}, 40, 16, 2);  // Needs block 2 of 2.
  EXPECT_EQ((*gpu)->Forward(no_block).status().code(),
            absl::StatusCode::kInvalidArgument);
  StepInput ok = SeqStep({1, 2, 3}, 0, 16, 2);
  auto out = (*gpu)->Step(ok);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->tokens.size(), 1u);
}

// The step buffers ReserveActivations allocates are what
// GpuActivationBytes counts (serving reserves them before sizing KV, and
// `shardlm simulate` subtracts the same figure): the device's free memory
// drops by at least that, and by no more than cudaMalloc's 2 MiB rounding
// of each buffer.
void ExpectReservedBuffersCounted(const ModelConfig& c) {
  const KvPoolConfig kv = KvFor(c, /*blocks=*/4);
  auto gpu = GpuRunner(c, kv, RandomHostWeights(c, 1));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE((*gpu)->Synchronize().ok());
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  constexpr int64_t kTokens = 4096, kRows = 256;
  ASSERT_TRUE((*gpu)->ReserveActivations(kTokens, kRows).ok());
  ASSERT_TRUE((*gpu)->Synchronize().ok());
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  const RankActivationDims dims = ActivationDimsOf(c, (*gpu)->weights().spec);
  const int64_t counted = GpuActivationBytes(dims, kTokens, kRows);
  // The step buffers and the decode workspace, each rounded up.
  const int64_t buffers = static_cast<int64_t>(GpuStepBuffers(dims).size()) + 1;
  const int64_t dropped = static_cast<int64_t>(free_before - free_after);
  EXPECT_GE(dropped, counted);
  EXPECT_LE(dropped, counted + buffers * (int64_t{2} << 20));
}

TEST(CudaModelRunnerTest, ReservedStepBuffersAreWhatActivationMemoryCounts) {
  SKIP_WITHOUT_GPU();
  ModelConfig dense = OneLayer({.hidden = 512,
                                .ffn_hidden = 1024,
                                .n_heads = 8,
                                .n_kv_heads = 2,
                                .head_dim = 64,
                                .vocab_size = 5000,
                                .context_length = 4096});
  ModelConfig moe = dense;  // The experts' buffers in place of the FFN's.
  moe.architecture = "qwen3moe";
  moe.n_experts = 8;
  moe.n_experts_used = 2;
  moe.expert_ffn_hidden = 384;
  for (const ModelConfig& c : {dense, moe}) {
    SCOPED_TRACE(c.architecture);
    ExpectReservedBuffersCounted(c);
  }
}

// Greedy generation through `forward`: the prompt as one step, then
// `steps` single-token steps. Returns the tokens; `first` gets the logits
// of the last prompt position.
std::vector<int32_t> Greedy(const ForwardFn& forward,
                            const std::vector<int32_t>& prompt, int steps,
                            int64_t block_size, int64_t blocks, Tensor& first) {
  std::vector<int32_t> out;
  auto logits = forward(SeqStep(prompt, 0, block_size, blocks));
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (!logits.ok()) return out;
  first = *logits;
  int32_t pos = static_cast<int32_t>(prompt.size());
  for (int i = 0; i < steps; ++i) {
    const int32_t next = Argmax(logits->f32().data(), logits->dim(1));
    out.push_back(next);
    if (i + 1 == steps) break;
    logits = forward(SeqStep({next}, pos++, block_size, blocks));
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) return out;
  }
  return out;
}

TEST(CudaModelRunnerTest, SmolLM2GreedyParityWithCpu) {
  SKIP_WITHOUT_GPU();
  const char* env = std::getenv("SHARDLM_MODEL");
  const std::string path =
      env != nullptr ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) {
    // The build always provides it (scripts/fetch-model.sh; the GPU kit
    // carries a cut of it): a missing model is a broken setup, not a skip.
    FAIL() << "no model at " << path << " (set SHARDLM_MODEL)";
  }
  auto source = OpenWeights(path);
  ASSERT_TRUE(source.ok()) << source.status();
  auto tokenizer = LoadTokenizer(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto host = LoadLlamaWeights(**source);
  ASSERT_TRUE(host.ok()) << host.status();
  const ModelConfig& c = host->config;
  const KvPoolConfig kv{.n_layers = c.n_layers,
                        .kv_heads = c.n_kv_heads,
                        .head_dim = c.head_dim,
                        .block_size = 16,
                        .num_blocks = 64,
                        // The CPU reference keeps f32 KV.
                        .dtype = DType::kF32};
  auto gpu = GpuRunner(c, kv, *host);
  ASSERT_TRUE(gpu.ok()) << gpu.status();

  for (const char* text : kGpuParityPrompts) {
    SCOPED_TRACE(text);
    // A fresh CPU runner per prompt: its pool starts empty, like the GPU's
    // is overwritten from position 0.
    auto cpu_weights = LoadLlamaWeights(**source);
    ASSERT_TRUE(cpu_weights.ok());
    ModelRunner cpu(std::move(*cpu_weights), *KvPool::Create(kv));
    const std::vector<int32_t> prompt = (*tokenizer)->Encode(text);
    Tensor cpu_first, gpu_first;
    const auto want =
        Greedy([&](const StepInput& s) { return cpu.Forward(s); }, prompt, 32,
               kv.block_size, kv.num_blocks, cpu_first);
    const auto got =
        Greedy([&](const StepInput& s) { return (*gpu)->Forward(s); }, prompt,
               32, kv.block_size, kv.num_blocks, gpu_first);
    EXPECT_EQ(got, want);
    // Bound: the GPU rounds weights, GEMM inputs and the KV cache to
    // bf16. A CPU forward with exactly those roundings (measured while
    // writing this test) differs from the f32 CPU by at most 0.26 (mean
    // 0.093) at the last prompt position of these prompts, and by 0.50 at
    // worst over 32 steps; changing only the BLAS thread count moves these
    // by ~0.02, so the GPU's other summation order adds little. 1.0 / 0.25
    // leave about 2-4x margin and stay far below what a wrong RoPE convention
    // or head mapping gives.
    const Diff d = Compare(gpu_first, cpu_first);
    std::printf(
        "parity: prompt of %zu tokens: logits max |diff| %.4f, "
        "mean %.5f, max |logit| %.2f\n",
        prompt.size(), d.max_abs, d.mean_abs, d.max_ref);
    EXPECT_LE(d.max_abs, 1.0);
    EXPECT_LE(d.mean_abs, 0.25);
  }
}

}  // namespace
}  // namespace shardlm
