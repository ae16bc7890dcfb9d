// The planner on synthetic states, with no model and no threads: token
// budgets, admission order, preemption order and tiers, cancellation and
// deadlines on a virtual clock, steps in flight and failed steps. Every
// expected plan below is worked out by hand from the rules in
// batch_planner.h.
#include "engine/batch_planner.h"

#include <map>
#include <optional>
#include <vector>

#include "engine/mask_worker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "step/late_masks.h"

namespace shardlm {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int64_t kVocab = 100;
constexpr int32_t kBlock = 4;  // Tokens per KV block.
const absl::Time kT0 = absl::FromUnixSeconds(1000);

std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(10 + i);
  return p;
}

class BatchPlannerTest : public ::testing::Test {
 protected:
  void Make(int32_t device_blocks, int32_t host_blocks, BatchLimits options,
            SpeculationOptions speculation = {}) {
    blocks_.emplace(device_blocks, kBlock, host_blocks);
    planner_.emplace(
        &*blocks_, &metrics_, options, kVocab,
        [this](RequestId id) { released_.push_back(id); }, speculation);
  }
  void Add(RequestId id, int prompt, int32_t priority = 0,
           int32_t max_tokens = 16,
           absl::Time deadline = absl::InfiniteFuture()) {
    planner_->Add(id,
                  {.prompt = Prompt(prompt),
                   .max_tokens = max_tokens,
                   .priority = priority,
                   .deadline = deadline},
                  {.on_done =
                       [this, id](absl::StatusOr<GenerateResult> r) {
                         done_.emplace(id, std::move(r));
                       }},
                  kT0);
  }
  void Admit(absl::Time now = kT0) {
    std::vector<PlannerEvent> events;
    planner_->Admit(now, events);
    for (auto& e : events) e();
  }
  // Applies the oldest step in flight with one token per row.
  void Apply(std::vector<int32_t> tokens, absl::Time now = kT0) {
    std::vector<PlannerEvent> events;
    planner_->Apply(StepOutput{.tokens = std::move(tokens)}, now, events);
    for (auto& e : events) e();
  }
  void Fail(absl::Status why) {
    std::vector<PlannerEvent> events;
    planner_->Apply(why, kT0, events);
    for (auto& e : events) e();
  }

  ServingMetrics metrics_;
  std::optional<BlockManager> blocks_;
  std::optional<BatchPlanner> planner_;
  std::vector<RequestId> released_;
  std::map<RequestId, absl::StatusOr<GenerateResult>> done_;
};

TEST_F(BatchPlannerTest, TheTokenBudgetGoesToDecodeFirstThenPrefillChunks) {
  Make(64, 0, {.max_batched_tokens = 16, .max_seqs = 8});
  Add(0, 10);
  Add(1, 10);
  Add(2, 3);
  Admit();
  ASSERT_EQ(planner_->running(), 3u);

  // All prefill: 0 takes 10 tokens, 1 the 6 left, 2 nothing.
  std::optional<StepPlan> p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->stepped, ElementsAre(0, 1));
  EXPECT_THAT(p->rows, ElementsAre(0));  // Only 0 finished its prompt.
  EXPECT_THAT(p->step.positions,
              ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5));
  EXPECT_THAT(p->step.token_seq,
              ElementsAre(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1));
  EXPECT_THAT(p->step.logit_rows, ElementsAre(9));
  ASSERT_EQ(p->step.block_tables.size(), 2u);
  EXPECT_EQ(p->step.block_tables[0].size(), 3u);  // 10 tokens.
  EXPECT_EQ(p->step.block_tables[1].size(), 2u);  // 6 tokens.
  EXPECT_EQ(planner_->in_flight(), 1u);
  Apply({42});

  // 0 decodes (its token first), then 1's last 4 and 2's 3 prompt tokens.
  p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->stepped, ElementsAre(0, 1, 2));
  EXPECT_THAT(p->step.tokens, ElementsAre(42, 16, 17, 18, 19, 10, 11, 12));
  EXPECT_THAT(p->step.positions, ElementsAre(10, 6, 7, 8, 9, 0, 1, 2));
  EXPECT_THAT(p->rows, ElementsAre(0, 1, 2));
  EXPECT_THAT(p->step.logit_rows, ElementsAre(0, 4, 7));
  EXPECT_THAT(p->step.sample_index, ElementsAre(1, 0, 0));
  Apply({1, 2, 3});
  EXPECT_EQ(planner_->Stats().computed_tokens, 16 + 8);
}

TEST_F(BatchPlannerTest, MaxSeqsBoundsOneStepAndStepsInFlightAreDisjoint) {
  Make(64, 0, {.max_batched_tokens = 64, .max_seqs = 8});
  Add(0, 5);
  Add(1, 5);
  Add(2, 5);
  Admit();
  std::optional<StepPlan> a = planner_->Plan(1);
  std::optional<StepPlan> b = planner_->Plan(2);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_THAT(a->stepped, ElementsAre(0));
  EXPECT_THAT(b->stepped, ElementsAre(1, 2));
  EXPECT_FALSE(planner_->Plan(8).has_value());  // Everyone is in flight.
  EXPECT_EQ(planner_->Stats().max_steps_in_flight, 2);
  Apply({7});  // The oldest: a's one row.
  std::optional<StepPlan> c = planner_->Plan(8);
  ASSERT_TRUE(c.has_value());
  EXPECT_THAT(c->stepped, ElementsAre(0));
  EXPECT_THAT(c->step.tokens, ElementsAre(7));
}

// A constraint that allows token 20 + k for the k-th token, then only the
// stop tokens (99), and records what it was given.
class CountingConstraint : public TokenConstraint {
 public:
  void Allowed(int64_t vocab, std::vector<uint64_t>& mask) override {
    mask.assign((vocab + 63) / 64, 0);
    const int32_t t = accepted.size() < 2 ? 20 + int32_t(accepted.size()) : 99;
    mask[t >> 6] |= uint64_t{1} << (t & 63);
  }
  absl::Status Accept(int32_t token) override {
    if (token != 99 && token != 20 + int32_t(accepted.size())) {
      return absl::FailedPreconditionError("not allowed");
    }
    accepted.push_back(token);
    return absl::OkStatus();
  }
  double mask_seconds() const override { return 0; }
  std::vector<int32_t> accepted;
};

// A constrained row carries its constraint's mask (min_tokens yields when
// the mask allows only stop tokens); each token sampled is given to the
// constraint; a token it refuses ends the request with an error.
TEST_F(BatchPlannerTest, ConstrainedRowsCarryTheirMaskAndFeedTheConstraint) {
  Make(64, 0, {.max_batched_tokens = 64, .max_seqs = 8});
  auto c0 = std::make_shared<CountingConstraint>();
  auto c1 = std::make_shared<CountingConstraint>();
  planner_->Add(0,
                {.prompt = {5, 6},
                 .max_tokens = 8,
                 .stop_token_ids = {99},
                 .min_tokens = 5,
                 .constraint = c0},
                {.on_done =
                     [this](absl::StatusOr<GenerateResult> r) {
                       done_.emplace(0, std::move(r));
                     }},
                kT0);
  planner_->Add(1, {.prompt = {7}, .max_tokens = 8, .constraint = c1},
                {.on_done =
                     [this](absl::StatusOr<GenerateResult> r) {
                       done_.emplace(1, std::move(r));
                     }},
                kT0);
  Add(2, 3);
  Admit();
  const auto allowed = [](const SampleHistory& h) {
    std::vector<int32_t> ids;
    for (int32_t t = 0; t < int32_t(h.allowed.size()) * 64; ++t) {
      if ((h.allowed[t >> 6] >> (t & 63)) & 1) ids.push_back(t);
    }
    return ids;
  };
  // The plan names its constrained rows; their masks are computed apart
  // (by the scheduler's mask thread) and read through ResolvedHistory, as
  // the sampler reads them.
  const auto resolved = [](StepPlan& p) {
    double seconds = 0;
    auto masks = std::make_shared<LateMasks>();
    masks->Set(ComputeMasks(p.masks, 100, &seconds), seconds);
    p.step.late_masks = masks;
    return ResolvedHistory(p.step);
  };
  std::optional<StepPlan> p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  ASSERT_EQ(p->masks.size(), 2u);
  EXPECT_EQ(p->masks[0].row, 0);
  EXPECT_EQ(p->masks[1].row, 1);
  ASSERT_EQ(p->step.history.size(), 3u);
  EXPECT_TRUE(p->step.history[0].allowed.empty());  // Not computed yet.
  std::vector<SampleHistory> h = resolved(*p);
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].allowed.size(), 2u);  // 100 tokens.
  EXPECT_THAT(allowed(h[0]), ElementsAre(20));
  EXPECT_THAT(h[0].masked, ElementsAre(99));  // min_tokens.
  EXPECT_THAT(allowed(h[1]), ElementsAre(20));
  EXPECT_TRUE(h[2].empty());
  Apply({20, 33, 50});  // 1's 33 is outside its mask.
  ASSERT_TRUE(done_.contains(1));
  EXPECT_EQ(done_.at(1).status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(c0->accepted, ElementsAre(20));
  p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(allowed(resolved(*p)[0]), ElementsAre(21));
  Apply({21, 51});
  p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  // Complete: only the stop token, and min_tokens (5) no longer masks it.
  h = resolved(*p);
  EXPECT_THAT(allowed(h[0]), ElementsAre(99));
  EXPECT_THAT(h[0].masked, IsEmpty());
  Apply({99, 52});
  ASSERT_TRUE(done_.contains(0));
  ASSERT_TRUE(done_.at(0).ok());
  EXPECT_THAT(done_.at(0)->tokens, ElementsAre(20, 21, 99));
  EXPECT_EQ(done_.at(0)->finish_reason, FinishReason::kStop);
  EXPECT_EQ(planner_->Stats().constrained_rows, 4);
}

// Rows carry what their penalties and min_tokens need: the generated
// tokens' counts (and the prompt's tokens with a repetition penalty), and
// the stop tokens masked while fewer than min_tokens were generated; a step
// with no such row carries no histories.
TEST_F(BatchPlannerTest, RowsCarryTheirPenaltyCountsAndMinTokensMask) {
  Make(64, 0, {.max_batched_tokens = 64, .max_seqs = 8});
  const auto add = [&](RequestId id, GenerateRequest r) {
    planner_->Add(id, std::move(r), {}, kT0);
  };
  add(0, {.prompt = {5, 3, 5},
          .max_tokens = 8,
          .sampling = {.frequency_penalty = 1, .repetition_penalty = 1.2f},
          .stop_token_ids = {9, 2, 9},
          .min_tokens = 2});
  add(1,
      {.prompt = {7}, .max_tokens = 8, .sampling = {.presence_penalty = 0.5f}});
  add(2, {.prompt = {8}, .max_tokens = 8});
  Admit();
  std::optional<StepPlan> p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  ASSERT_EQ(p->step.history.size(), 3u);
  EXPECT_THAT(p->step.history[0].tokens, ElementsAre(3, 5));  // The prompt.
  EXPECT_THAT(p->step.history[0].counts, ElementsAre(0, 0));
  EXPECT_THAT(p->step.history[0].masked, ElementsAre(2, 9));
  EXPECT_TRUE(p->step.history[1].empty());  // Nothing generated yet.
  EXPECT_TRUE(p->step.history[2].empty());
  Apply({5, 4, 6});
  p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  ASSERT_EQ(p->step.history.size(), 3u);
  EXPECT_THAT(p->step.history[0].tokens, ElementsAre(3, 5));
  EXPECT_THAT(p->step.history[0].counts, ElementsAre(0, 1));
  EXPECT_THAT(p->step.history[0].masked, ElementsAre(2, 9));  // 1 < 2.
  EXPECT_THAT(p->step.history[1].tokens, ElementsAre(4));
  EXPECT_THAT(p->step.history[1].counts, ElementsAre(1));
  EXPECT_THAT(p->step.history[1].masked, IsEmpty());
  Apply({3, 4, 6});
  p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->step.history[0].counts, ElementsAre(1, 1));
  EXPECT_THAT(p->step.history[0].masked, IsEmpty());  // 2 generated.
  EXPECT_THAT(p->step.history[1].counts, ElementsAre(2));
  Apply({1, 1, 1});
}

TEST_F(BatchPlannerTest, PromptLogprobsScoreEveryPromptPositionInChunks) {
  Make(64, 0, {.max_batched_tokens = 16, .max_seqs = 4});
  std::vector<TokenLogprobs> reported;
  int first_tokens = 0;
  planner_->Add(0,
                {.prompt = Prompt(10), .max_tokens = 2, .prompt_logprobs = 2},
                {.on_token =
                     [&](int32_t, const TokenLogprobs*) {
                       ++first_tokens;
                       return TokenAction::kContinue;
                     },
                 .on_prompt_logprobs =
                     [&](const std::vector<TokenLogprobs>& lp) {
                       EXPECT_EQ(first_tokens, 0);  // Before the first.
                       reported = lp;
                     },
                 .on_done =
                     [this](absl::StatusOr<GenerateResult> r) {
                       done_.emplace(0, std::move(r));
                     }},
                kT0);
  Add(1, 3, 0, 2);
  Admit();
  // Apply a step: scored rows report their score token with a logprob
  // naming its position; sampled rows give token 50.
  const auto apply = [&](const StepPlan& p) {
    StepOutput out;
    for (size_t r = 0; r < p.step.logit_rows.size(); ++r) {
      const int32_t score =
          p.step.score_tokens.empty() ? -1 : p.step.score_tokens[r];
      out.tokens.push_back(score >= 0 ? score : 50);
      out.logprobs.push_back({.sampled = -static_cast<float>(
                                  p.step.positions[p.step.logit_rows[r]])});
    }
    std::vector<PlannerEvent> events;
    planner_->Apply(std::move(out), kT0, events);
    for (auto& e : events) e();
  };
  // Logit rows are at most max_seqs (4): two sequences may sample, so 0's
  // chunk is cut to 2 scored positions; 1 prefills whole.
  std::optional<StepPlan> p = planner_->Plan(4);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->step.positions, ElementsAre(0, 1, 0, 1, 2));
  EXPECT_THAT(p->step.logit_rows, ElementsAre(0, 1, 4));
  EXPECT_THAT(p->step.score_tokens, ElementsAre(11, 12, -1));
  EXPECT_THAT(p->step.logprobs, ElementsAre(2, 2, 0));
  EXPECT_THAT(p->rows, ElementsAre(0, 0, 1));
  apply(*p);
  for (int steps = 0; steps < 8 && !done_.contains(0); ++steps) {
    p = planner_->Plan(4);
    ASSERT_TRUE(p.has_value());
    EXPECT_LE(p->step.logit_rows.size(), 4u);
    apply(*p);
  }
  ASSERT_TRUE(done_.contains(0));
  ASSERT_TRUE(done_.at(0).ok()) << done_.at(0).status();
  const GenerateResult& r = *done_.at(0);
  EXPECT_EQ(r.cached_prompt_tokens, 0);
  ASSERT_EQ(r.prompt_logprobs.size(), 9u);  // Tokens 1 to 9.
  ASSERT_EQ(reported.size(), 9u);
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(r.prompt_logprobs[i].sampled, -static_cast<float>(i)) << i;
  }
  EXPECT_EQ(first_tokens, 2);
}

TEST_F(BatchPlannerTest, ALogitBiasAloneNeedsNoHistory) {
  Make(64, 0, {.max_batched_tokens = 64, .max_seqs = 8});
  planner_->Add(3,
                {.prompt = {1, 2},
                 .max_tokens = 4,
                 .sampling = {.logit_bias = {{.token = 3, .bias = 1}}}},
                {}, kT0);
  Admit();
  std::optional<StepPlan> p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->step.history, IsEmpty());  // The bias is in the params.
  EXPECT_EQ(p->step.sampling[0].logit_bias.size(), 1u);
}

// A lone long prompt keeps a pipeline busy: its next chunk is planned while
// the previous ones are in flight (each stage runs them in order), and only
// the last chunk samples; its first decode waits for that chunk.
TEST_F(BatchPlannerTest, ALongPromptsChunksFollowEachOtherThroughThePipeline) {
  Make(64, 0, {.max_batched_tokens = 4, .max_seqs = 8});
  Add(0, 10);
  Admit();
  std::optional<StepPlan> a = planner_->PlanForPipeline(2);
  std::optional<StepPlan> b = planner_->PlanForPipeline(2);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_THAT(a->step.positions, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(b->step.positions, ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(a->rows, IsEmpty());
  EXPECT_THAT(b->rows, IsEmpty());
  EXPECT_FALSE(planner_->PlanForPipeline(2).has_value());  // Depth 2.
  EXPECT_EQ(planner_->busy(), 1u);
  Apply({});
  std::optional<StepPlan> c = planner_->PlanForPipeline(2);
  ASSERT_TRUE(c.has_value());
  EXPECT_THAT(c->step.positions, ElementsAre(8, 9));
  EXPECT_THAT(c->rows, ElementsAre(0));
  EXPECT_THAT(c->step.logit_rows, ElementsAre(1));
  Apply({});
  // Its last chunk samples: nothing more until that is back.
  EXPECT_FALSE(planner_->PlanForPipeline(2).has_value());
  Apply({42});
  std::optional<StepPlan> d = planner_->PlanForPipeline(2);
  ASSERT_TRUE(d.has_value());
  EXPECT_THAT(d->step.tokens, ElementsAre(42));
  EXPECT_THAT(d->step.positions, ElementsAre(10));
  Apply({43});
  EXPECT_EQ(planner_->Stats().computed_tokens, 11);
}

// Cancelled with chunks in flight: planned no further, ended once they are
// back, its blocks freed. A failed chunk fails it, and frees them too.
TEST_F(BatchPlannerTest, ChunksInFlightEndWithTheirSequence) {
  Make(64, 0, {.max_batched_tokens = 4, .max_seqs = 8});
  Add(0, 16);
  Admit();
  ASSERT_TRUE(planner_->PlanForPipeline(3).has_value());
  ASSERT_TRUE(planner_->PlanForPipeline(3).has_value());
  planner_->Cancel(0);
  Admit();
  EXPECT_EQ(done_.count(0), 0u);  // Its chunks are being written.
  EXPECT_FALSE(planner_->PlanForPipeline(3).has_value());
  Apply({});
  Admit();
  EXPECT_EQ(done_.count(0), 0u);
  EXPECT_FALSE(planner_->PlanForPipeline(3).has_value());
  Apply({});
  Admit();
  ASSERT_EQ(done_.count(0), 1u);
  ASSERT_TRUE(done_.at(0).ok());
  EXPECT_EQ(done_.at(0)->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(blocks_->used_blocks(), 0);

  Add(1, 16);
  Admit();
  ASSERT_TRUE(planner_->PlanForPipeline(3).has_value());
  ASSERT_TRUE(planner_->PlanForPipeline(3).has_value());
  ASSERT_TRUE(planner_->PlanForPipeline(3).has_value());
  Fail(absl::UnavailableError("rank 2 died"));
  ASSERT_EQ(done_.count(1), 1u);
  EXPECT_TRUE(absl::IsUnavailable(done_.at(1).status()));
  EXPECT_EQ(planner_->in_flight(), 0u);
  EXPECT_EQ(blocks_->used_blocks(), 0);
}

TEST_F(BatchPlannerTest, AdmissionIsByPriorityThenArrivalAndStrictlyInOrder) {
  // 4 device blocks of 4 tokens, no host.
  Make(4, 0, {.max_batched_tokens = 64, .max_seqs = 8});
  Add(0, 8);                  // 2 blocks.
  Add(1, 8);                  // 2 blocks.
  Add(2, 4, /*priority=*/5);  // 1 block; first in line.
  Add(3, 1);                  // Would fit, but 1 is ahead of it.
  Admit();
  // 2 then 0 start (1 + 2 blocks promised); 1 needs 2 more: it waits, and
  // so does 3 behind it.
  EXPECT_EQ(planner_->running(), 2u);
  EXPECT_EQ(planner_->waiting(), 2u);
  std::optional<StepPlan> p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->stepped, ElementsAre(2, 0));
  Apply({1, 1});
  Admit();  // Still no room for 1 (1 block free).
  EXPECT_EQ(planner_->waiting(), 2u);
}

TEST_F(BatchPlannerTest, AHigherPrioritySwapsOutTheLatestLowerOneToTheHost) {
  Make(4, 8, {.max_batched_tokens = 64, .max_seqs = 8});
  Add(0, 8);
  Add(1, 8);
  Admit();
  std::optional<StepPlan> p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  Apply({5, 6});
  EXPECT_EQ(blocks_->DeviceAvailable(), 0);

  Add(2, 4, /*priority=*/9);
  Admit();
  // 1, the latest of the lower priority, made room.
  SchedulerStats s = planner_->Stats();
  EXPECT_EQ(s.preempted_swap, 1);
  EXPECT_EQ(s.preempted_recompute, 0);
  EXPECT_EQ(blocks_->HostBlocksOf(1), 2);
  EXPECT_THAT(released_, IsEmpty());  // Its KV lives on in the host tier.
  EXPECT_EQ(planner_->running(), 2u);
  EXPECT_EQ(planner_->waiting(), 1u);

  p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  // The swap's two copies run before the step; then 0 decodes (its third
  // block) and 2 prefills.
  ASSERT_EQ(p->step.copies.size(), 2u);
  for (const BlockCopy& c : p->step.copies) {
    EXPECT_LT(c.src, 4);
    EXPECT_GE(c.dst, 4);
  }
  EXPECT_THAT(p->stepped, ElementsAre(0, 2));
  EXPECT_THAT(p->step.positions, ElementsAre(8, 0, 1, 2, 3));
  EXPECT_THAT(p->rows, ElementsAre(0, 2));
}

TEST_F(BatchPlannerTest, WithoutHostRoomAPreemptedSequenceIsRecomputed) {
  // Each request fits the 4 blocks alone (12 tokens at most).
  Make(4, 0, {.max_batched_tokens = 64, .max_seqs = 8});
  Add(0, 8, 0, /*max_tokens=*/4);
  Add(1, 8, 0, /*max_tokens=*/4);
  Admit();
  ASSERT_TRUE(planner_->Plan(8).has_value());
  Apply({5, 6});
  Add(2, 4, /*priority=*/9, /*max_tokens=*/4);
  Admit();
  EXPECT_EQ(planner_->Stats().preempted_recompute, 1);
  EXPECT_THAT(released_, ElementsAre(1));
  EXPECT_TRUE(blocks_->Table(1).empty());
  // Once 0 and 2 finish, 1 recomputes its prompt and its generated token.
  for (int i = 0; i < 200 && planner_->running() + planner_->waiting() > 1;
       ++i) {
    std::optional<StepPlan> p = planner_->Plan(8);
    if (p.has_value()) Apply(std::vector<int32_t>(p->rows.size(), 3));
    Admit();
  }
  ASSERT_EQ(planner_->running(), 1u);
  std::optional<StepPlan> p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->stepped, ElementsAre(1));
  EXPECT_THAT(p->step.tokens, ElementsAre(10, 11, 12, 13, 14, 15, 16, 17, 6));
  EXPECT_THAT(p->step.sample_index, ElementsAre(1));  // Its second token.
}

TEST_F(BatchPlannerTest, CancelsAndDeadlinesEndAtAdmitOnTheGivenClock) {
  Make(64, 0, {.max_batched_tokens = 64, .max_seqs = 8});
  Add(0, 4, 0, 16, kT0 + absl::Seconds(5));
  Add(1, 4);
  Add(2, 4);
  Admit();
  std::optional<StepPlan> p = planner_->Plan(1);  // 0 is in flight.
  ASSERT_TRUE(p.has_value());
  planner_->Cancel(0);
  planner_->Cancel(1);
  Admit(kT0 + absl::Seconds(1));
  // 1 ends now; 0 only once its step is back.
  ASSERT_EQ(done_.count(1), 1u);
  ASSERT_TRUE(done_.at(1).ok());
  EXPECT_EQ(done_.at(1)->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(done_.count(0), 0u);
  Apply({9});
  Admit(kT0 + absl::Seconds(2));
  ASSERT_EQ(done_.count(0), 1u);
  ASSERT_TRUE(done_.at(0).ok());
  EXPECT_EQ(done_.at(0)->finish_reason, FinishReason::kCancelled);
  EXPECT_THAT(done_.at(0)->tokens, ElementsAre(9));
  EXPECT_EQ(done_.count(2), 0u);

  // A deadline on the planner's clock, not the wall clock.
  Add(3, 4, 0, 16, kT0 + absl::Seconds(10));
  Admit(kT0 + absl::Seconds(9));
  EXPECT_EQ(done_.count(3), 0u);
  Admit(kT0 + absl::Seconds(10));
  ASSERT_EQ(done_.count(3), 1u);
  EXPECT_TRUE(absl::IsDeadlineExceeded(done_.at(3).status()));
  EXPECT_THAT(released_, ElementsAre(1, 0, 3));
}

TEST_F(BatchPlannerTest, LatenciesComeFromTheGivenClock) {
  Make(64, 0, {.max_batched_tokens = 64, .max_seqs = 8});
  Add(0, 4, 0, /*max_tokens=*/3);
  Admit();
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(planner_->Plan(8).has_value());
    Apply({i}, kT0 + absl::Seconds(i));
  }
  ASSERT_EQ(done_.count(0), 1u);
  ASSERT_TRUE(done_.at(0).ok());
  EXPECT_EQ(done_.at(0)->finish_reason, FinishReason::kLength);
  EXPECT_THAT(done_.at(0)->tokens, ElementsAre(1, 2, 3));
  EXPECT_DOUBLE_EQ(done_.at(0)->prefill_seconds, 1.0);
  EXPECT_DOUBLE_EQ(done_.at(0)->decode_seconds, 2.0);
  EXPECT_EQ(blocks_->used_blocks(), 0);
}

TEST_F(BatchPlannerTest, AFailedStepFailsKvHoldersAndKeepsTheQueue) {
  Make(4, 0, {.max_batched_tokens = 64, .max_seqs = 8});
  Add(0, 8);
  Add(1, 4);
  Add(2, 8);  // No room: waits with no blocks.
  Admit();
  ASSERT_TRUE(planner_->Plan(1).has_value());
  ASSERT_TRUE(planner_->Plan(1).has_value());
  Fail(absl::UnavailableError("rank 2 is gone"));
  ASSERT_EQ(done_.size(), 2u);
  EXPECT_TRUE(absl::IsUnavailable(done_.at(0).status()));
  EXPECT_TRUE(absl::IsUnavailable(done_.at(1).status()));
  EXPECT_EQ(planner_->in_flight(), 0u);
  EXPECT_EQ(blocks_->used_blocks(), 0);
  Admit();
  EXPECT_EQ(planner_->running(), 1u);  // 2 starts.
}

TEST_F(BatchPlannerTest, ATokenOutsideTheVocabularyFailsTheStep) {
  Make(64, 0, {.max_batched_tokens = 64, .max_seqs = 8});
  Add(0, 4);
  Admit();
  ASSERT_TRUE(planner_->Plan(8).has_value());
  Apply({static_cast<int32_t>(kVocab)});
  ASSERT_EQ(done_.count(0), 1u);
  EXPECT_TRUE(absl::IsInternal(done_.at(0).status()));
  EXPECT_EQ(blocks_->used_blocks(), 0);
}

TEST_F(BatchPlannerTest, EndAllEndsEveryRequestAndFreesEveryBlock) {
  Make(4, 0, {.max_batched_tokens = 64, .max_seqs = 8});
  Add(0, 8);
  Add(1, 8);
  Add(2, 8);
  Admit();
  ASSERT_TRUE(planner_->Plan(8).has_value());
  std::vector<PlannerEvent> events;
  planner_->EndAll(absl::UnavailableError("shutting down"), kT0, events);
  for (auto& e : events) e();
  EXPECT_EQ(done_.size(), 3u);
  for (const auto& [id, r] : done_)
    EXPECT_TRUE(absl::IsUnavailable(r.status()));
  EXPECT_TRUE(planner_->idle());
  EXPECT_EQ(blocks_->used_blocks(), 0);
}

// Drafts the four tokens after the last one (t + 1 .. t + 4).
class CountingDrafter : public SequenceDrafter {
 public:
  std::vector<int32_t> Draft(absl::Span<const int32_t> tokens,
                             int max_tokens) override {
    std::vector<int32_t> d;
    for (int i = 1; i <= std::min(max_tokens, 4); ++i) {
      d.push_back(tokens.back() + i);
    }
    return d;
  }
};

// Planner options that draft with CountingDrafter, as far as it goes.
SpeculationOptions CountingDrafts() {
  return {.method = SpeculationOptions::Method::kCustom,
          .make_drafter =
              [](const GenerateRequest&) {
                return std::make_unique<CountingDrafter>();
              },
          .adaptive = false};
}

// A verification: the sequence's last token and its drafts as one chunk,
// a logit row after each (draw indices going on); the rows after the first
// rejected draft are dropped, its KV rolled back with the blocks only the
// rejected drafts filled, and every block back at the end.
TEST_F(BatchPlannerTest, VerificationKeepsConfirmedDraftsAndRollsBackTheRest) {
  Make(64, 0, {.max_batched_tokens = 32, .max_seqs = 8}, CountingDrafts());
  Add(0, 7, 0, /*max_tokens=*/7);
  Admit();
  std::optional<StepPlan> p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->step.logit_rows, ElementsAre(6));  // The prompt: no drafts.
  Apply({50});

  p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->step.tokens, ElementsAre(50, 51, 52, 53, 54));
  EXPECT_THAT(p->step.positions, ElementsAre(7, 8, 9, 10, 11));
  EXPECT_THAT(p->step.logit_rows, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(p->step.sample_index, ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(p->rows, ElementsAre(0, 0, 0, 0, 0));
  EXPECT_TRUE(p->decode_only);  // Every token is a sampled row.
  EXPECT_EQ(p->step.block_tables[0].size(), 3u);  // 12 tokens.
  // The first row samples 60, not the draft 51: nothing kept, 60 emitted,
  // 8 tokens computed: 2 blocks held, the third freed.
  Apply({60, 52, 53, 54, 55});
  EXPECT_EQ(blocks_->Table(0).size(), 2u);
  EXPECT_EQ(blocks_->device_usage().used, 2);

  p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->step.tokens, ElementsAre(60, 61, 62, 63, 64));
  EXPECT_THAT(p->step.positions, ElementsAre(8, 9, 10, 11, 12));
  EXPECT_THAT(p->step.sample_index, ElementsAre(2, 3, 4, 5, 6));
  // All four kept, and the row after the last one's token: 5 tokens, the
  // last of which (65) reaches max_tokens.
  Apply({61, 62, 63, 64, 65});
  ASSERT_TRUE(done_.contains(0));
  ASSERT_TRUE(done_[0].ok());
  EXPECT_THAT(done_[0]->tokens, ElementsAre(50, 60, 61, 62, 63, 64, 65));
  EXPECT_EQ(done_[0]->finish_reason, FinishReason::kLength);
  const SchedulerStats s = planner_->Stats();
  EXPECT_EQ(s.spec_verifications, 2);
  EXPECT_EQ(s.spec_drafted, 8);
  EXPECT_EQ(s.spec_accepted, 4);
  EXPECT_THAT(s.spec_kept_histogram, ElementsAre(1, 0, 0, 0, 1));
  EXPECT_EQ(blocks_->device_usage().used, 0);
  EXPECT_TRUE(planner_->idle());
}

// Drafts take only free blocks: with none free, a sequence verifies
// nothing rather than preempt another or move its own blocks.
TEST_F(BatchPlannerTest, DraftsNeverPreempt) {
  Make(3, 8, {.max_batched_tokens = 32, .max_seqs = 8}, CountingDrafts());
  Add(0, 7);  // 2 blocks.
  Add(1, 3);  // 1 block: the device is full.
  Admit();
  ASSERT_TRUE(planner_->Plan(8).has_value());
  Apply({50, 60});
  std::optional<StepPlan> p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  // 0's next token fits its second block; its drafts would need a third.
  EXPECT_THAT(p->step.tokens, ElementsAre(50, 60));
  EXPECT_THAT(p->rows, ElementsAre(0, 1));
  Apply({51, 61});
  const SchedulerStats s = planner_->Stats();
  EXPECT_EQ(s.preempted_swap + s.preempted_recompute, 0);
  EXPECT_EQ(s.offloaded, 0);
  EXPECT_EQ(s.spec_drafted, 0);
}

// A stop token among the verified rows ends the sequence there: the rows
// after it are not emitted, though their drafts were right.
TEST_F(BatchPlannerTest, AStopTokenInAVerificationEndsTheSequenceThere) {
  Make(64, 0, {.max_batched_tokens = 32, .max_seqs = 8}, CountingDrafts());
  planner_->Add(0,
                {.prompt = Prompt(3), .max_tokens = 20, .stop_token_ids = {42}},
                {.on_done =
                     [this](absl::StatusOr<GenerateResult> r) {
                       done_.emplace(0, std::move(r));
                     }},
                kT0);
  Admit();
  ASSERT_TRUE(planner_->Plan(8).has_value());
  Apply({40});
  std::optional<StepPlan> p = planner_->Plan(8);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->step.tokens, ElementsAre(40, 41, 42, 43, 44));
  Apply({41, 42, 43, 44, 45});
  ASSERT_TRUE(done_.contains(0));
  EXPECT_THAT(done_[0]->tokens, ElementsAre(40, 41, 42));
  EXPECT_EQ(done_[0]->finish_reason, FinishReason::kStop);
  EXPECT_EQ(blocks_->device_usage().used, 0);
}

}  // namespace
}  // namespace shardlm
