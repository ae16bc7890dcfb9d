// The simulator: exact, hand-worked timelines with a fixed-cost model; the
// roofline's arithmetic and the CPU kernel terms on a tiny config; refusals;
// the same seed gives the same report; and at scale every request finishes or
// is refused with a reason and no KV block leaks.
#include "simulator/simulation.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

SimOptions Options(int64_t device_blocks = 1024) {
  SimOptions o;
  o.scheduler = {.max_batched_tokens = 64, .max_seqs = 16, .max_queued = 64};
  o.block_size = 4;
  o.device_blocks = device_blocks;
  return o;
}

TEST(SimulateTest, OneRequestTakesOneStepPerToken) {
  FixedCostModel cost(/*pp=*/1, /*per_step=*/1.0, /*per_token=*/0);
  absl::StatusOr<SimReport> r = Simulate(
      cost, Options(), 100, {{.prompt_tokens = 4, .output_tokens = 3}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->finished, 1);
  EXPECT_EQ(r->steps, 3);
  EXPECT_DOUBLE_EQ(r->duration, 3.0);
  EXPECT_DOUBLE_EQ(r->ttft.p50, 1.0);
  EXPECT_DOUBLE_EQ(r->tpot.p50, 1.0);
  EXPECT_DOUBLE_EQ(r->e2e.p50, 3.0);
  EXPECT_DOUBLE_EQ(r->queueing.max, 0.0);
  EXPECT_EQ(r->output_tokens, 3);
  EXPECT_EQ(r->leaked_blocks, 0);
}

// Speculation in the simulator: the planner's own verification and
// policy against simulated step times. Where a step costs the same
// whatever its rows (per_token 0: bound by reading the weights), drafts
// kept 80% of the time cut the steps of a 64-token answer; where each row
// costs a whole step, the policy drafts (nearly) nothing after measuring
// it, and the steps stay those of decoding without it.
TEST(SimulateTest, SpeculationPaysOnlyWhereRowsAreCheap) {
  const std::vector<SimRequest> one = {
      {.prompt_tokens = 4, .output_tokens = 64}};
  FixedCostModel flat(1, 1.0, 0);
  SimOptions o = Options();
  absl::StatusOr<SimReport> plain = Simulate(flat, o, 100, one);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->steps, 64);
  o.spec_acceptance = 0.8;
  absl::StatusOr<SimReport> spec = Simulate(flat, o, 100, one);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->output_tokens, 64);
  EXPECT_GT(spec->spec_kept, 0);
  // About 1 + 0.8 + 0.64 + 0.51 + 0.41 = 3.4 tokens a step.
  EXPECT_LT(spec->steps, 64 / 2);
  EXPECT_LT(spec->duration, plain->duration / 2);
  EXPECT_EQ(spec->leaked_blocks, 0);

  FixedCostModel per_row(1, 0.0, 1.0);  // Every row costs a step's time.
  o.spec_acceptance = 0.5;
  absl::StatusOr<SimReport> costly = Simulate(per_row, o, 100, one);
  ASSERT_TRUE(costly.ok()) << costly.status();
  EXPECT_EQ(costly->output_tokens, 64);
  // Tried while unmeasured, then no more: at most a few verifications.
  EXPECT_LT(costly->spec_drafted, 16);
}

TEST(SimulateTest, ALateArrivalJoinsTheNextStep) {
  // A arrives at 0 (prefill [0, 1)); B at 0.5 waits for A's step to come
  // back, then prefills beside A's decode ([1, 2)) and decodes alone.
  FixedCostModel cost(1, 1.0, 0);
  absl::StatusOr<SimReport> r =
      Simulate(cost, Options(), 100,
               {{.arrival = 0, .prompt_tokens = 4, .output_tokens = 2},
                {.arrival = 0.5, .prompt_tokens = 4, .output_tokens = 2}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->steps, 3);
  EXPECT_DOUBLE_EQ(r->duration, 3.0);
  EXPECT_DOUBLE_EQ(r->ttft.mean, (1.0 + 1.5) / 2);
  EXPECT_DOUBLE_EQ(r->e2e.max, 2.5);
  EXPECT_DOUBLE_EQ(r->queueing.max, 0.5);
  EXPECT_DOUBLE_EQ(r->itl.mean, 1.0);
}

TEST(SimulateTest, PipelineStagesOverlapStepsInFlight) {
  // Two stages of 1 s each; two requests of 3 tokens.
  FixedCostModel cost(2, 1.0, 0);
  std::vector<SimRequest> trace = {{.prompt_tokens = 4, .output_tokens = 3},
                                   {.prompt_tokens = 4, .output_tokens = 3}};
  // One step in flight: both in every step, each 2 s end to end.
  SimOptions o = Options();
  absl::StatusOr<SimReport> serial = Simulate(cost, o, 100, trace);
  ASSERT_TRUE(serial.ok()) << serial.status();
  EXPECT_EQ(serial->steps, 3);
  EXPECT_DOUBLE_EQ(serial->duration, 6.0);
  EXPECT_DOUBLE_EQ(serial->stage_utilization, 6.0 / 12.0);
  // Two in flight: one request each, stage 0 of one beside stage 1 of the
  // other. A's tokens come at 2, 4, 6; B's at 3, 5, 7.
  o.max_steps_in_flight = 2;
  absl::StatusOr<SimReport> overlap = Simulate(cost, o, 100, trace);
  ASSERT_TRUE(overlap.ok()) << overlap.status();
  EXPECT_EQ(overlap->steps, 6);
  EXPECT_DOUBLE_EQ(overlap->duration, 7.0);
  EXPECT_DOUBLE_EQ(overlap->ttft.max, 3.0);
  EXPECT_DOUBLE_EQ(overlap->tpot.max, 2.0);
  EXPECT_DOUBLE_EQ(overlap->stage_utilization, 12.0 / 14.0);
}

TEST(SimulateTest, AClosedLoopSendsTheNextRequestWhenOneEnds) {
  FixedCostModel cost(1, 1.0, 0);
  const std::vector<SimRequest> trace = {
      {.arrival = 50, .prompt_tokens = 4, .output_tokens = 2},
      {.arrival = 60, .prompt_tokens = 4, .output_tokens = 2}};
  SimOptions o = Options();
  o.concurrency = 1;  // B starts when A ends at 2; arrivals are ignored.
  absl::StatusOr<SimReport> one = Simulate(cost, o, 100, trace);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_DOUBLE_EQ(one->duration, 4.0);
  EXPECT_DOUBLE_EQ(one->e2e.max, 2.0);
  o.concurrency = 2;  // Both at 0, batched.
  absl::StatusOr<SimReport> two = Simulate(cost, o, 100, trace);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_DOUBLE_EQ(two->duration, 2.0);
  EXPECT_EQ(two->steps, 2);
}

// With a client gap the two clients' first requests reach the server at
// two instants in [0, 1 ms): the idle loop starts a step with the first
// (A's prefill, 0-1 s), the second waits for the next (A's last token and
// B's prefill, 1-2 s), and B's last token takes a third step (2-3 s).
TEST(SimulateTest, AClientGapKeepsClientsOutOfLockstep) {
  FixedCostModel cost(1, 1.0, 0);
  const std::vector<SimRequest> trace = {
      {.arrival = 0, .prompt_tokens = 4, .output_tokens = 2},
      {.arrival = 0, .prompt_tokens = 4, .output_tokens = 2}};
  SimOptions o = Options();
  o.concurrency = 2;
  o.client_gap = 0.001;
  absl::StatusOr<SimReport> r = Simulate(cost, o, 100, trace);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->steps, 3);
  EXPECT_GT(r->duration, 3.0);
  EXPECT_LT(r->duration, 3.001);
  EXPECT_NEAR(r->ttft.mean, 1.5, 0.001);  // A: one step; B: two.
  EXPECT_NEAR(r->ttft.max, 2.0, 0.001);
}

TEST(SimulateTest, RequestsThatCannotRunAreRefusedWithAReason) {
  FixedCostModel cost(1, 1.0, 0);
  SimOptions o = Options(/*device_blocks=*/8);  // 32 tokens.
  o.context_length = 40;
  o.scheduler.max_queued = 1;
  absl::StatusOr<SimReport> r =
      Simulate(cost, o, 100,
               {{.arrival = 0, .prompt_tokens = 30, .output_tokens = 20},
                {.arrival = 0, .prompt_tokens = 30, .output_tokens = 5},
                {.arrival = 1, .prompt_tokens = 4, .output_tokens = 4},
                {.arrival = 1, .prompt_tokens = 4, .output_tokens = 4},
                {.arrival = 1.5, .prompt_tokens = 4, .output_tokens = 4}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->refused["context_length"], 1);
  EXPECT_EQ(r->refused["kv_capacity"], 1);
  // The two at 1 s arrive together: the first waits in the queue until the
  // loop admits it, the second finds the queue full. The one at 1.5 s finds
  // the queue empty again.
  EXPECT_EQ(r->refused["queue_full"], 1);
  EXPECT_EQ(r->finished, 2);
}

// The roofline tests' model: 2 layers of 36,864 parameters, a 64,000-
// parameter LM head, 256 KV bytes per token in bf16.
ModelConfig ToyConfig() {
  ModelConfig c;
  c.n_layers = 2;
  c.hidden = 64;
  c.ffn_hidden = 128;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 1000;
  c.context_length = 512;
  return c;
}

// 1 GB of memory, 1 GB/s and 1 GFLOP/s, all achieved: times by hand.
DeviceProfile ToyDevice() {
  return {.name = "toy",
          .memory_bytes = 1e9,
          .memory_bandwidth = 1e9,
          .peak_flops = 1e9,
          .bandwidth_efficiency = 1,
          .flops_efficiency = 1};
}

TEST(SimulateTest, TheRooflineAddsUpByHand) {
  const ModelConfig c = ToyConfig();
  const DeviceProfile d = ToyDevice();
  StepInput decode;
  decode.tokens = {5};
  decode.positions = {99};
  decode.token_seq = {0};
  decode.seq_ids = {0};
  decode.logit_rows = {0};
  // TP = 1. Per layer: 64 x 16 x (2 x 4 + 2 x 2) + 3 x 64 x 128 = 36,864
  // parameters; LM head 64,000. Bytes: 2 x 36,864 x 2 + 64,000 x 2 + 100
  // tokens x 256 KV bytes = 301,056. FLOPs: 2 x 2 x 36,864 + 2 x 4 x 16 x 4
  // x 100 + 2 x 64,000 = 326,656: compute-bound at 1 GFLOP/s.
  RooflineCostModel tp1(c, d, {.tp = 1, .pp = 1});
  EXPECT_DOUBLE_EQ(tp1.KvBytesPerToken(0), 256.0);
  {
    // Latent attention: one entry of kv_lora_rank + rope_dims values per
    // layer, whole on each TP rank: 2 layers x (32 + 8) x 2 bytes (f16).
    ModelConfig mla = c;
    mla.n_kv_heads = mla.n_heads;
    mla.kv_lora_rank = 32;
    mla.rope_dims = 8;
    EXPECT_DOUBLE_EQ(
        RooflineCostModel(mla, d, {.tp = 2, .pp = 1}).KvBytesPerToken(0),
        2 * 40 * 2.0);
  }
  ASSERT_EQ(tp1.StageSeconds(decode).size(), 1u);
  EXPECT_DOUBLE_EQ(tp1.StageSeconds(decode)[0], 326656e-9);
  // TP = 2: 18,432 parameters per layer and 32,000 of the head per rank,
  // 2 query heads: 150,528 bytes; 2 x 2 x 18,432 + 2 x 4 x 16 x 2 x 100 + 2
  // x 32,000 = 163,328 FLOPs; plus 2 layers x 2 ring all-reduces of 128
  // bytes: 2 x (1 us + 128 / (2 x 1 GB/s)) each.
  RooflineCostModel tp2(
      c, d,
      {.tp = 2, .pp = 1, .tp_link = {.alpha_seconds = 1e-6, .bandwidth = 1e9}});
  EXPECT_NEAR(tp2.StageSeconds(decode)[0], 163328e-9 + 4 * 2 * (1e-6 + 64e-9),
              1e-15);
  // PP = 2: a stage per layer; only the last reads the head, and the second
  // receives the activations.
  RooflineCostModel pp2(
      c, d,
      {.tp = 1, .pp = 2, .pp_link = {.alpha_seconds = 2e-6, .bandwidth = 1e9}});
  const std::vector<double> st = pp2.StageSeconds(decode);
  ASSERT_EQ(st.size(), 2u);
  // Stage 0: 73,728 + 12,800 bytes; 73,728 + 25,600 FLOPs.
  EXPECT_DOUBLE_EQ(st[0], 99328e-9);
  // Stage 1: 73,728 + 12,800 + 128,000 bytes = 214,528; FLOPs 227,328.
  EXPECT_NEAR(st[1], 227328e-9 + 2e-6 + 128e-9, 1e-15);
}

// Context parallel as built (docs/design-notes.md section 3): the
// buffers each CP rank sends per layer, by the design notes' formula.
TEST(SimulateTest, ContextParallelBytesFollowTheDesignNotes) {
  const ModelConfig c = ToyConfig();  // 2 layers, 4 heads, 2 KV heads of 16.
  const DeviceProfile d{.name = "toy",
                        .memory_bytes = 1e9,
                        .memory_bandwidth = 1e9,
                        .peak_flops = 1e9};
  const auto step = [](int n, int logit_rows) {
    StepInput s;
    for (int i = 0; i < n; ++i) {
      s.tokens.push_back(1);
      s.positions.push_back(i);
      s.token_seq.push_back(0);
    }
    s.seq_ids = {0};
    for (int i = 0; i < logit_rows; ++i) s.logit_rows.push_back(n - 1 - i);
    return s;
  };
  // CP 2, a chunk of 1024: each rank's slice of 512 rows of Q, K and V,
  // (4 + 2 x 2) x 16 f32 values each (262,144 bytes), and the output with
  // its lse of all 1024 queries, 4 x (16 + 1) f32 each (278,528 bytes), to
  // its 1 peer, in each of 2 layers; the one logit row's 64 f32 summed.
  RooflineCostModel cp2(c, d, {.tp = 1, .pp = 1, .cp = 2});
  EXPECT_DOUBLE_EQ(cp2.CpLayerBytes(1024).qkv, 512.0 * 8 * 16 * 4);
  EXPECT_DOUBLE_EQ(cp2.CpLayerBytes(1024).output, 1024.0 * 4 * 17 * 4);
  CpBytes b = cp2.StepCpBytes(step(1024, 1));
  EXPECT_DOUBLE_EQ(b.all_gather, 1 * 2 * (262144.0 + 278528.0));
  EXPECT_DOUBLE_EQ(b.all_reduce, 1 * 1 * 64 * 4.0);
  // CP 4, 1025 tokens: slices of 256 or 257 rows, each sent padded to 257,
  // to 3 peers; three logit rows (a batch's) summed.
  RooflineCostModel cp4(c, d, {.tp = 1, .pp = 1, .cp = 4});
  EXPECT_DOUBLE_EQ(cp4.CpLayerBytes(1025).qkv, 257.0 * 8 * 16 * 4);
  b = cp4.StepCpBytes(step(1025, 3));
  EXPECT_DOUBLE_EQ(b.all_gather,
                   3 * 2 * (257.0 * 8 * 16 * 4 + 1025.0 * 4 * 17 * 4));
  EXPECT_DOUBLE_EQ(b.all_reduce, 3 * 3 * 64 * 4.0);
  // Fewer tokens than ranks: no slices (every rank runs all of them), only
  // the outputs and lses; no logit rows to sum.
  EXPECT_DOUBLE_EQ(cp4.CpLayerBytes(3).qkv, 0);
  b = cp4.StepCpBytes(step(3, 3));
  EXPECT_DOUBLE_EQ(b.all_gather, 3 * 2 * (3.0 * 4 * 17 * 4));
  EXPECT_DOUBLE_EQ(b.all_reduce, 0);
  // TP 2 x CP 2: each rank sends its TP rank's heads (2 and 1 KV head).
  RooflineCostModel tp2cp2(c, d, {.tp = 2, .pp = 1, .cp = 2});
  EXPECT_DOUBLE_EQ(tp2cp2.CpLayerBytes(10).qkv, 5.0 * 4 * 16 * 4);
  EXPECT_DOUBLE_EQ(tp2cp2.CpLayerBytes(10).output, 10.0 * 2 * 17 * 4);
  // Not built, to compare: bf16 exchanges (lses stay f32), and outputs
  // scattered (each peer gets its slice's 512 rows; a decode's single row
  // still goes to every rank).
  Layout bf16{.tp = 1, .pp = 1, .cp = 2};
  bf16.cp_activation_bytes = 2;
  RooflineCostModel half(c, d, bf16);
  EXPECT_DOUBLE_EQ(half.CpLayerBytes(1024).qkv, 512.0 * 8 * 16 * 2);
  EXPECT_DOUBLE_EQ(half.CpLayerBytes(1024).output, 1024.0 * 4 * (32 + 4));
  Layout scatter{.tp = 1, .pp = 1, .cp = 2};
  scatter.cp_scatter_outputs = true;
  RooflineCostModel scattered(c, d, scatter);
  EXPECT_DOUBLE_EQ(scattered.CpLayerBytes(1024).output, 512.0 * 4 * 17 * 4);
  EXPECT_DOUBLE_EQ(scattered.CpLayerBytes(1024).lse, 512.0 * 4 * 4);
  EXPECT_DOUBLE_EQ(scattered.CpLayerBytes(1).output, 1.0 * 4 * 17 * 4);
  // No CP: nothing.
  RooflineCostModel cp1(c, d, {.tp = 1, .pp = 1, .cp = 1});
  EXPECT_DOUBLE_EQ(cp1.StepCpBytes(step(1024, 1)).total(), 0);
}

// CP 1 is the model without CP, whatever the CP link.
TEST(SimulateTest, ContextParallelOneIsNoContextParallel) {
  const ModelConfig c = ToyConfig();
  const DeviceProfile d = ToyDevice();
  RooflineCostModel plain(c, d, {.tp = 2, .pp = 2});
  RooflineCostModel cp1(c, d,
                        {.tp = 2,
                         .pp = 2,
                         .cp = 1,
                         .cp_link = {.alpha_seconds = 1, .bandwidth = 1}});
  for (int n : {1, 3, 700}) {
    StepInput s;
    for (int i = 0; i < n; ++i) {
      s.tokens.push_back(1);
      s.positions.push_back(40 + i);
      s.token_seq.push_back(0);
    }
    s.seq_ids = {0};
    s.logit_rows = {n - 1};
    EXPECT_EQ(cp1.StageSeconds(s), plain.StageSeconds(s)) << n;
    EXPECT_DOUBLE_EQ(cp1.StepCpBytes(s).total(), 0);
  }
}

// Context parallel's time by hand: a decode step (one token, fewer than
// CP: replicated) and a prefill chunk (sequence parallel).
TEST(SimulateTest, ContextParallelAddsUpByHand) {
  const ModelConfig c = ToyConfig();
  const DeviceProfile d = ToyDevice();
  const LinkProfile link{.alpha_seconds = 1e-6, .bandwidth = 1e9};
  RooflineCostModel cp2(c, d, {.tp = 1, .pp = 1, .cp = 2, .cp_link = link});
  StepInput decode;
  decode.tokens = {5};
  decode.positions = {99};
  decode.token_seq = {0};
  decode.seq_ids = {0};
  decode.logit_rows = {0};
  // The token at position 99 sees 100 keys in blocks 0-6 of 16 (the last
  // holding 4); rank 0 holds blocks 0, 2, 4, 6: 52 keys, rank 1 48. The
  // slowest rank runs the whole token through the weights (147,456 FLOPs),
  // the head (128,000) and 52 keys' attention (2 x 4 x 16 x 4 x 52 =
  // 26,624): 302,080 FLOPs, more than its 275,456 + 52 x 256 bytes, so
  // compute-bound. Per layer two all-gathers to its 1 peer: the output (4 x
  // 16 f32 = 256 bytes) and the lse (16 bytes); no Q/K/V, no logit sum.
  EXPECT_NEAR(cp2.StageSeconds(decode)[0],
              302080e-9 + 2 * ((1e-6 + 256e-9) + (1e-6 + 16e-9)), 1e-15);
  // A chunk of 1024 prompt tokens: each rank runs a slice of 512 through
  // the weights, the head's one row, and all 1024 queries over its blocks.
  StepInput chunk;
  for (int i = 0; i < 1024; ++i) {
    chunk.tokens.push_back(1);
    chunk.positions.push_back(i);
    chunk.token_seq.push_back(0);
  }
  chunk.seq_ids = {0};
  chunk.logit_rows = {1023};
  // The slowest rank's query-key pairs, counted key by key.
  double pairs[2] = {0, 0};
  for (int q = 0; q < 1024; ++q) {
    for (int k = 0; k <= q; ++k) pairs[(k / 16) % 2] += 1;
  }
  const double most = std::max(pairs[0], pairs[1]);
  EXPECT_LT(most, 0.51 * 1024 * 1025 / 2);
  const double flops =
      2 * 512 * 2 * 36864.0 + 2 * 64000.0 + 2 * 4 * 16 * 4 * most;
  // Per layer: Q (512 x 4 x 16 f32), K and V (512 x 2 x 16 f32 each), the
  // output (1024 x 4 x 16 f32) and lse (1024 x 4 f32); per step the logit
  // row (64 f32).
  const double layer = (1e-6 + 131072e-9) + 2 * (1e-6 + 65536e-9) +
                       (1e-6 + 262144e-9) + (1e-6 + 16384e-9);
  const double two = cp2.StageSeconds(chunk)[0];
  EXPECT_NEAR(two, flops * 1e-9 + 2 * layer + (1e-6 + 256e-9), 1e-12);
  RooflineCostModel cp1(c, d, {.tp = 1, .pp = 1});
  EXPECT_LT(two, 0.6 * cp1.StageSeconds(chunk)[0]);
}

// The expected distinct experts against exact enumeration: 4 experts, top
// 2, every token choosing each of the 6 pairs with equal probability.
TEST(SimulateTest, ExpectedDistinctExpertsIsExactForUniformRouting) {
  const std::vector<std::pair<int, int>> pairs = {{0, 1}, {0, 2}, {0, 3},
                                                  {1, 2}, {1, 3}, {2, 3}};
  for (int tokens = 1; tokens <= 4; ++tokens) {
    double sum = 0;
    int cases = 1;
    for (int t = 0; t < tokens; ++t) cases *= 6;
    for (int code = 0; code < cases; ++code) {
      int mask = 0;
      for (int t = 0, c = code; t < tokens; ++t, c /= 6) {
        mask |= 1 << pairs[c % 6].first | 1 << pairs[c % 6].second;
      }
      sum += __builtin_popcount(mask);
    }
    EXPECT_NEAR(ExpectedDistinctExperts(tokens, 4, 2), sum / cases, 1e-12)
        << tokens << " tokens";
  }
  EXPECT_DOUBLE_EQ(ExpectedDistinctExperts(1, 128, 8), 8);
  EXPECT_NEAR(ExpectedDistinctExperts(1e6, 128, 8), 128, 1e-9);
}

// A mixture's decode reads the router and the experts its tokens touch:
// one token reads top-k experts; at TP 2 (which divides the experts) each
// rank holds half of them and reads its share of the expected touched ones.
TEST(SimulateTest, AMixtureReadsTheExpertsItsTokensTouch) {
  ModelConfig c = ToyConfig();
  c.n_experts = 8;
  c.n_experts_used = 2;
  c.expert_ffn_hidden = 32;
  const DeviceProfile d{.name = "toy",
                        .memory_bytes = 1e9,
                        .memory_bandwidth = 1e9,
                        .peak_flops = 1e12,
                        .bandwidth_efficiency = 1,
                        .flops_efficiency = 1};
  StepInput decode;
  decode.tokens = {5};
  decode.positions = {99};
  decode.token_seq = {0};
  decode.seq_ids = {0};
  decode.logit_rows = {0};
  // TP = 1, per layer: attention 64 x 16 x 12 = 12,288, router 64 x 8 =
  // 512, 2 experts of 3 x 64 x 32 = 6,144 each: 25,088 parameters read.
  // Bytes: 2 layers x 25,088 x 2 + head 64,000 x 2 + 100 x 256 KV =
  // 253,952; memory-bound at 1 GB/s.
  RooflineCostModel tp1(c, d, {.tp = 1, .pp = 1});
  EXPECT_NEAR(tp1.StageSeconds(decode)[0], 253952e-9, 1e-15);
  // Held: 12,288 + 512 + 8 x 6,144 per layer, x 2 layers, + the embedding
  // and the head (64,000 each, untied), x 2 bytes.
  EXPECT_DOUBLE_EQ(tp1.StageWeightBytes(0),
                   (2 * (12288 + 512 + 8 * 6144) + 2 * 64000) * 2.0);
  // TP = 2: 4 experts per rank; one token touches 2 of 8, so a rank reads
  // half of that: 1 expert. Per layer 6,144 + 512 + 6,144 = 12,800; bytes
  // 2 x 12,800 x 2 + 32,000 x 2 + 100 x 128 = 128,000; plus the 2 x 2
  // all-reduces (as in TheRooflineAddsUpByHand).
  RooflineCostModel tp2(
      c, d,
      {.tp = 2, .pp = 1, .tp_link = {.alpha_seconds = 1e-6, .bandwidth = 1e9}});
  EXPECT_NEAR(tp2.StageSeconds(decode)[0], 128000e-9 + 4 * 2 * (1e-6 + 64e-9),
              1e-15);
}

// The CPU profile's kernel terms on the same toy config: steps of at most
// matvec_max_tokens tokens pay the first token at matvec_flops and the rest
// at matvec_batch_flops; larger ones dequantize every weight, then multiply
// at peak_flops. Bandwidth is ample, so each step is compute-bound.
TEST(SimulateTest, TheCpuKernelTermsAddUpByHand) {
  const ModelConfig c = ToyConfig();
  const DeviceProfile d{.name = "toy cpu",
                        .memory_bytes = 1e9,
                        .memory_bandwidth = 1e12,
                        .peak_flops = 1e10,
                        .bandwidth_efficiency = 1,
                        .flops_efficiency = 1,
                        .matvec_max_tokens = 4,
                        .matvec_flops = 1e9,
                        .matvec_batch_flops = 4e9,
                        .dequantize_rate = 1e9};
  // `n` sequences, each decoding one token at position 99.
  const auto decode = [](int n) {
    StepInput s;
    for (int i = 0; i < n; ++i) {
      s.tokens.push_back(5);
      s.positions.push_back(99);
      s.token_seq.push_back(i);
      s.seq_ids.push_back(i);
      s.logit_rows.push_back(i);
    }
    return s;
  };
  RooflineCostModel cpu(c, d, {.tp = 1, .pp = 1});
  // One token: 326,656 FLOPs (as above) at 1 GFLOP/s.
  EXPECT_NEAR(cpu.StageSeconds(decode(1))[0], 326656e-9, 1e-15);
  // Three: 2 x 3 x 2 x 36,864 + 2 x 4 x 16 x 4 x 300 + 2 x 3 x 64,000 =
  // 979,968 FLOPs, the first third at 1 GFLOP/s and the rest at 4.
  EXPECT_NEAR(cpu.StageSeconds(decode(3))[0],
              326656e-9 + (979968 - 326656) / 4e9, 1e-15);
  // Five take the tiled path: 137,728 parameters dequantized at 1 G/s, then
  // 2 x 5 x 2 x 36,864 + 2 x 4 x 16 x 4 x 500 + 2 x 5 x 64,000 = 1,633,280
  // FLOPs at 10 GFLOP/s.
  EXPECT_NEAR(cpu.StageSeconds(decode(5))[0], 137728e-9 + 163328e-9, 1e-15);
  // Without a batched rate every token pays matvec_flops (three: 979,968
  // FLOPs at 1 GFLOP/s).
  DeviceProfile unbatched = d;
  unbatched.matvec_batch_flops = 0;
  RooflineCostModel flat(c, unbatched, {.tp = 1, .pp = 1});
  EXPECT_NEAR(flat.StageSeconds(decode(3))[0], 979968e-9, 1e-15);
  // Attention at a rate of its own (2 GFLOP/s): per token 51,200 of the
  // 326,656 FLOPs (2 x 4 x 16 x 4 x 100), the other 275,456 the weights'.
  DeviceProfile apart = d;
  apart.matvec_attention_flops = 2e9;
  RooflineCostModel split(c, apart, {.tp = 1, .pp = 1});
  EXPECT_NEAR(split.StageSeconds(decode(1))[0], 275456e-9 + 25600e-9, 1e-15);
  // Three: the weights' 826,368, the first third at 1 GFLOP/s and the rest
  // at 4; attention's 153,600 at 2.
  EXPECT_NEAR(split.StageSeconds(decode(3))[0],
              275456e-9 + 550912 / 4e9 + 153600 / 2e9, 1e-15);
  // The tiled path is not affected (as above).
  EXPECT_NEAR(split.StageSeconds(decode(5))[0], 137728e-9 + 163328e-9, 1e-15);
  // A small batch of 2 tokens at 2 GFLOP/s: of three tokens' 979,968 FLOPs,
  // a third each at 1, 2 and 4 GFLOP/s; one token is not affected.
  DeviceProfile small = d;
  small.matvec_small_batch_tokens = 2;
  small.matvec_small_batch_flops = 2e9;
  RooflineCostModel grouped(c, small, {.tp = 1, .pp = 1});
  EXPECT_NEAR(grouped.StageSeconds(decode(1))[0], 326656e-9, 1e-15);
  EXPECT_NEAR(grouped.StageSeconds(decode(3))[0],
              326656 / 1e9 + 326656 / 2e9 + 326656 / 4e9, 1e-15);
  // The further tokens' attention at 8 GFLOP/s: of three tokens' 153,600
  // attention FLOPs, the first third at 2 GFLOP/s and the rest at 8.
  DeviceProfile batched_attention = apart;
  batched_attention.matvec_batch_attention_flops = 8e9;
  RooflineCostModel both(c, batched_attention, {.tp = 1, .pp = 1});
  EXPECT_NEAR(both.StageSeconds(decode(1))[0], 275456e-9 + 25600e-9, 1e-15);
  EXPECT_NEAR(both.StageSeconds(decode(3))[0],
              275456e-9 + 550912 / 4e9 + 51200 / 2e9 + 102400 / 8e9, 1e-15);
}

// The router's policies (router/routing_policy.h) in the simulator: on 4
// shared 256-token prefixes over 3 replicas, kv finds every hit one
// replica would (each prefix computed once), round-robin computes each
// prefix once per replica.
TEST(SimulateTest, KvRoutingFindsTheSharedPrefixes) {
  FixedCostModel cost(/*pp=*/1, /*per_step=*/0.01, /*per_token=*/1e-4);
  std::vector<SimRequest> trace;
  for (int i = 0; i < 48; ++i) {
    trace.push_back(
        {.arrival = 0.5 * i, .prompt_tokens = 300, .output_tokens = 4});
  }
  const auto hits = [&](Router router, int replicas) {
    SimOptions o = Options(4096);
    o.scheduler.max_batched_tokens = 512;
    o.replicas = replicas;
    o.prefix_caching = true;
    o.shared_prefix_tokens = 256;
    o.prefix_groups = 4;
    o.router = router;
    absl::StatusOr<SimReport> r = Simulate(cost, o, 1000, trace);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->finished, 48);
    EXPECT_EQ(r->leaked_blocks, 0);
    return r->prefix_hit_tokens;
  };
  const int64_t one = hits(Router::kRoundRobin, 1);
  EXPECT_EQ(one, (48 - 4) * 256);  // Every prefix after its first time.
  const int64_t kv = hits(Router::kKv, 3);
  EXPECT_EQ(kv, one);  // Requests 0.5 s apart: each prefix known in time.
  const int64_t rr = hits(Router::kRoundRobin, 3);
  // Request i goes to replica i mod 3 with prefix i mod 4: each of the 12
  // (replica, prefix) pairs computes its prefix once.
  EXPECT_EQ(rr, (48 - 12) * 256);
  EXPECT_LT(hits(Router::kLeastLoad, 3), kv);
}

TEST(SimulateTest, TheSameSeedGivesTheSameReport) {
  absl::StatusOr<ModelConfig> c = FindModelPreset("llama3-8b");
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<DeviceProfile> d = FindDeviceProfile("h100");
  ASSERT_TRUE(d.ok()) << d.status();
  RooflineCostModel cost(*c, *d, {.tp = 1, .pp = 1});
  absl::StatusOr<LengthDistribution> in =
      LengthDistribution::Parse("lognormal:300:0.8");
  absl::StatusOr<LengthDistribution> out =
      LengthDistribution::Parse("uniform:16:128");
  ASSERT_TRUE(in.ok() && out.ok());
  SimOptions o = Options(4096);
  o.block_size = 16;
  o.replicas = 2;
  o.router = Router::kLeastKv;
  const auto run = [&](uint64_t seed) {
    o.seed = seed;
    absl::StatusOr<SimReport> r =
        Simulate(cost, o, c->vocab_size, PoissonTrace(20, 10, *in, *out, seed));
    EXPECT_TRUE(r.ok()) << r.status();
    r->wall_seconds = r->planner_wall_seconds = 0;  // This machine's.
    return ReportJson(*r);
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST(SimulateTest, AtScaleEveryRequestEndsAndNoBlockLeaks) {
  absl::StatusOr<ModelConfig> c = FindModelPreset("llama3-70b");
  ASSERT_TRUE(c.ok());
  absl::StatusOr<DeviceProfile> d = FindDeviceProfile("h100");
  ASSERT_TRUE(d.ok());
  RooflineCostModel cost(*c, *d,
                         {.tp = 4,
                          .pp = 2,
                          .tp_link = *FindLinkProfile("nvlink-h100"),
                          .pp_link = *FindLinkProfile("ib-400g"),
                          .host_link = *FindLinkProfile("pcie5")});
  SimOptions o;
  o.replicas = 4;
  o.max_steps_in_flight = 2;
  o.scheduler = {
      .max_batched_tokens = 2048, .max_seqs = 128, .max_queued = 100000};
  o.block_size = 16;
  o.device_blocks = 600;  // Too few for the load: preemption.
  o.host_blocks = 300;
  o.context_length = 8192;
  o.router = Router::kLeastKv;
  const std::vector<SimRequest> trace =
      PoissonTrace(40, 60, *LengthDistribution::Parse("lognormal:400:1.0"),
                   *LengthDistribution::Parse("lognormal:150:0.7"), 3);
  absl::StatusOr<SimReport> r = Simulate(cost, o, c->vocab_size, trace);
  ASSERT_TRUE(r.ok()) << r.status();
  int64_t refused = 0;
  for (const auto& [why, n] : r->refused) refused += n;
  EXPECT_EQ(r->finished + refused, r->requests);
  EXPECT_EQ(r->refused.count("failed"), 0u);
  EXPECT_GT(r->finished, r->requests * 9 / 10);
  EXPECT_GT(r->preempted_swap + r->preempted_recompute, 0);
  EXPECT_EQ(r->leaked_blocks, 0);
  EXPECT_GT(r->host_kv_peak, 0);
  EXPECT_LE(r->device_kv_peak, 1.0);
}

TEST(SimulateTest, TracesAndDistributionsRejectBadInput) {
  EXPECT_FALSE(LengthDistribution::Parse("uniform:9:3").ok());
  EXPECT_FALSE(LengthDistribution::Parse("poisson:3").ok());
  EXPECT_FALSE(LengthDistribution::Parse("0").ok());
  EXPECT_FALSE(LengthDistribution::Parse("fixed:x").ok());
  const std::string path = ::testing::TempDir() + "/trace.csv";
  std::ofstream(path) << "arrival,prompt,output\n0.5,10,20\n0.25,10,20\n";
  absl::StatusOr<std::vector<SimRequest>> t = ReadTraceCsv(path);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()),
              ::testing::HasSubstr("trace.csv:3: arrivals go backwards"));
  std::ofstream(path) << "# a trace\n0.5,10,20\n1.5, 7, 3, 2\n";
  t = ReadTraceCsv(path);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[1].prompt_tokens, 7);
  EXPECT_EQ((*t)[1].priority, 2);
}

}  // namespace
}  // namespace shardlm
