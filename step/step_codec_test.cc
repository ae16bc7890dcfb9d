// The step contract survives the wire: over a scripted run of steps
// (tables growing, a sequence released, a table that is not an extension
// of what was sent, copies, sampling, logprobs), every decoded StepInput
// equals the one encoded, and only new blocks travel.
#include "step/step_codec.h"

#include <memory>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "step/late_masks.h"

namespace shardlm {
namespace {

StepInput Step(std::vector<int64_t> seq_ids,
               std::vector<std::vector<int32_t>> tables) {
  StepInput s;
  s.seq_ids = std::move(seq_ids);
  s.block_tables = std::move(tables);
  for (size_t i = 0; i < s.seq_ids.size(); ++i) {
    s.tokens.push_back(static_cast<int32_t>(100 + i));
    s.positions.push_back(static_cast<int32_t>(7 * i));
    s.token_seq.push_back(static_cast<int32_t>(i));
    s.logit_rows.push_back(static_cast<int32_t>(i));
    s.sampling.push_back({.temperature = 0.5f * i,
                          .top_k = static_cast<int32_t>(i),
                          .top_p = 1.0f - 0.1f * i,
                          .seed = 42 + i});
    s.sample_index.push_back(3 + i);
  }
  return s;
}

TEST(StepCodecTest, DecodeOfEncodeIsTheStep) {
  std::vector<StepInput> steps;
  steps.push_back(Step({1, 2}, {{4, 5}, {6}}));
  steps.push_back(Step({1, 2}, {{4, 5, 9}, {6}}));  // 1 grew.
  steps.back().copies = {{.src = 3, .dst = 70}, {.src = 71, .dst = 2}};
  steps.back().logprobs = {0, 5};
  steps.back().score_tokens = {-1, 12};  // Row 1 scores a prompt token.
  // Logit processors and the rows' histories travel too; the bias map
  // comes back in id order whatever its order on the wire.
  steps.back().sampling[1].presence_penalty = 0.5f;
  steps.back().sampling[1].frequency_penalty = -1.25f;
  steps.back().sampling[1].repetition_penalty = 1.5f;
  steps.back().sampling[1].logit_bias = {{.token = 3, .bias = -100},
                                         {.token = 17, .bias = 2.5f},
                                         {.token = 40000, .bias = 0.25f}};
  steps.back().history = {
      {.allowed = {0x8000000000000001ull, 0, 0x10}},
      {.tokens = {1, 5, 9}, .counts = {0, 2, 1}, .masked = {2, 7}}};
  steps.back().return_logits = true;
  steps.back().state_slots = {3, 0};  // A hybrid model's state slots.
  steps.back().state_copies = {{.src = 1, .dst = 9}, {.src = 8, .dst = 1}};
  steps.push_back(Step({2, 3}, {{6, 10}, {11, 12}}));  // 1 gone, 3 new.
  steps.push_back(Step({3}, {{13}}));  // Not an extension: resent whole.
  steps.push_back(Step({}, {}));       // Copies only.
  steps.back().copies = {{.src = 1, .dst = 2}};

  BlockTableDeltas sent;
  BlockTableMirror mirror;
  const std::vector<int64_t> want_blocks = {3, 1, 3, 1, 0};
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    if (i == 2) sent.Release(1);
    v1::StepPlan plan;
    int64_t blocks = -1;
    ASSERT_TRUE(EncodeStepPlan(steps[i], 10 + i, sent, &plan, &blocks).ok());
    EXPECT_EQ(plan.step_id(), static_cast<int64_t>(10 + i));
    EXPECT_EQ(blocks, want_blocks[i]);  // Only what the workers lack.
    // Through bytes, as on the wire.
    v1::StepPlan received;
    ASSERT_TRUE(received.ParseFromString(plan.SerializeAsString()));
    EXPECT_EQ(DecodeStepPlan(received, mirror), steps[i]);
  }
  EXPECT_FALSE(mirror.contains(1));  // The released sequence is dropped.
}

// A step whose constrained rows' masks are still being computed (late
// masks) goes on the wire once they are there, with them in its
// histories: a remote rank samples exactly as an in-process one.
TEST(StepCodecTest, LateMasksTravelInTheHistories) {
  StepInput step = Step({1, 2}, {{4}, {6}});
  step.history = {{}, {.masked = {2}}};
  auto masks = std::make_shared<LateMasks>();
  step.late_masks = masks;
  StepInput want = step;
  want.late_masks = nullptr;
  want.history[0].allowed = {0x5};
  want.history[1].allowed = {0x6};
  v1::StepPlan plan;
  absl::Status encoded;
  BlockTableDeltas sent;
  std::thread encoder(
      [&] { encoded = EncodeStepPlan(step, 1, sent, &plan, nullptr); });
  masks->Set({{.row = 0, .allowed = {0x5}}, {.row = 1, .allowed = {0x6}}}, 0);
  encoder.join();
  ASSERT_TRUE(encoded.ok()) << encoded;
  BlockTableMirror mirror;
  EXPECT_EQ(DecodeStepPlan(plan, mirror), want);
}

TEST(StepCodecTest, MismatchedTablesAreRefused) {
  StepInput s = Step({1, 2}, {{4}});
  BlockTableDeltas sent;
  v1::StepPlan plan;
  EXPECT_EQ(EncodeStepPlan(s, 0, sent, &plan).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StepCodecTest, KvCacheOptionsAndBatchLimitsRoundTrip) {
  const KvCacheOptions kv{.block_size = 32,
                          .kv_cache_bytes = 1 << 20,
                          .cpu_offload_bytes = 3 << 20,
                          .dtype = DType::kI8,
                          .gpu_memory_utilization = 0.5,
                          .prefix_caching = false};
  v1::KvCacheOptions wire;
  EncodeKvCacheOptions(kv, &wire);
  v1::KvCacheOptions received;
  ASSERT_TRUE(received.ParseFromString(wire.SerializeAsString()));
  auto back = DecodeKvCacheOptions(received);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->block_size, 32);
  EXPECT_EQ(back->kv_cache_bytes, 1 << 20);
  EXPECT_EQ(back->cpu_offload_bytes, 3 << 20);
  EXPECT_EQ(back->dtype, DType::kI8);
  EXPECT_EQ(back->gpu_memory_utilization, 0.5);
  EXPECT_FALSE(back->prefix_caching);

  const BatchLimits limits{
      .max_batched_tokens = 7, .max_seqs = 3, .max_queued = 9};
  v1::BatchLimits lw;
  EncodeBatchLimits(limits, &lw);
  auto lb = DecodeBatchLimits(lw);
  ASSERT_TRUE(lb.ok()) << lb.status();
  EXPECT_EQ(lb->max_batched_tokens, 7);
  EXPECT_EQ(lb->max_seqs, 3);
  EXPECT_EQ(lb->max_queued, 9);
}

// A worker trusts nothing an assignment says: every field is checked.
TEST(StepCodecTest, OutOfRangeOptionsAreRefusedNamingTheField) {
  const auto refused = [](v1::KvCacheOptions w, const std::string& phrase) {
    auto kv = DecodeKvCacheOptions(w);
    ASSERT_FALSE(kv.ok());
    EXPECT_EQ(kv.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(kv.status().message().find(phrase), std::string::npos)
        << kv.status();
  };
  v1::KvCacheOptions good;
  EncodeKvCacheOptions({.dtype = DType::kF16}, &good);
  ASSERT_TRUE(DecodeKvCacheOptions(good).ok());
  v1::KvCacheOptions w = good;
  w.set_block_size(0);
  refused(w, "--block-size 0");
  w = good;
  w.set_kv_cache_bytes(-1);
  refused(w, "--kv-cache-bytes");
  w = good;
  w.set_dtype("f64");
  refused(w, "'f64'");
  w = good;
  w.set_gpu_memory_utilization(1.5);
  refused(w, "--gpu-memory-utilization 1.5");
  v1::BatchLimits l;
  EncodeBatchLimits({}, &l);
  l.set_max_batched_tokens(0);
  EXPECT_EQ(DecodeBatchLimits(l).status().code(),
            absl::StatusCode::kInvalidArgument);
  l.set_max_batched_tokens(16);
  l.set_max_seqs(-2);
  EXPECT_NE(DecodeBatchLimits(l).status().message().find("--max-seqs"),
            std::string::npos);
}

}  // namespace
}  // namespace shardlm
