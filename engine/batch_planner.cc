#include "engine/batch_planner.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace shardlm {
namespace {

double Seconds(absl::Time a, absl::Time b) {
  return absl::ToDoubleSeconds(b - a);
}

}  // namespace

// A request, waiting or running.
struct BatchPlanner::Sequence {
  RequestId id = 0;
  GenerateRequest request;
  RequestCallbacks callbacks;
  std::vector<int32_t> tokens;  // Prompt, then generated tokens.
  int64_t computed = 0;         // Tokens whose KV is in the cache.
  bool attached = false;        // Its prefix was looked up once.
  bool done = false;
  bool preempted = false;  // In this step: leaves running_ for waiting_.
  // Planned steps holding it whose outputs are not back: several when
  // consecutive chunks of its prompt are in the pipeline at once.
  int in_flight = 0;
  // Cancelled or past its deadline while in flight: planned no further,
  // ended once its steps are back.
  bool ending = false;
  absl::Time submitted;
  std::optional<absl::Time> started;  // First in running_.
  absl::Time first_token, last_token;
  GenerateResult result;
  // When the request has penalties: token -> times generated (0: in the
  // prompt only, kept when repetition_penalty counts the prompt), updated
  // as tokens come, so that a step's SampleHistory costs O(distinct
  // tokens), not a pass over the sequence.
  std::map<int32_t, int32_t> penalized;
  // The request's stop tokens, distinct and ascending: masked while fewer
  // than min_tokens have been generated.
  std::vector<int32_t> min_tokens_mask;
  // Failed steps it was in (BatchPlanner::Interrupt); from the second on,
  // it is planned alone, so that a request that kills its step is told
  // from the requests batched with it.
  int interruptions = 0;
  bool isolated = false;
  int failed_alone = 0;  // Failed steps that held only it.
  // Speculative decoding: its drafter (null when it does not draft), how
  // often its drafts were kept, and the drafts its step in flight
  // verifies (computed counts them until the step is back).
  std::unique_ptr<SequenceDrafter> drafter;
  DraftAcceptance acceptance;
  std::vector<int32_t> drafts;
};

namespace {

// Admission and preemption order: higher priority first, then arrival.
template <typename S>
bool Before(const S& a, const S& b) {
  if (a.request.priority != b.request.priority) {
    return a.request.priority > b.request.priority;
  }
  return a.id < b.id;
}

RequestOutcome OutcomeOf(const absl::StatusOr<GenerateResult>& result) {
  if (!result.ok()) {
    return absl::IsDeadlineExceeded(result.status()) ? RequestOutcome::kDeadline
           : absl::IsCancelled(result.status()) ? RequestOutcome::kCancelled
                                                : RequestOutcome::kError;
  }
  switch (result->finish_reason) {
    case FinishReason::kStop:
      return RequestOutcome::kStop;
    case FinishReason::kLength:
      return RequestOutcome::kLength;
    case FinishReason::kCancelled:
      return RequestOutcome::kCancelled;
  }
  return RequestOutcome::kError;
}

bool HasPenalties(const SamplingParams& p) {
  return p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f ||
         p.repetition_penalty != 1.0f;
}

}  // namespace

BatchPlanner::BatchPlanner(BlockManager* blocks, ServingMetrics* metrics,
                           BatchLimits options, int64_t vocab_size,
                           std::function<void(RequestId)> release,
                           SpeculationOptions speculation)
    : blocks_(blocks),
      metrics_(metrics),
      options_(options),
      vocab_size_(vocab_size),
      release_(std::move(release)),
      speculation_(speculation),
      policy_(speculation) {
  if (speculation_.enabled()) {
    counters_.spec_kept_histogram.assign(speculation_.max_tokens + 1, 0);
  }
}

BatchPlanner::~BatchPlanner() = default;

void BatchPlanner::Enqueue(std::unique_ptr<Sequence> s) {
  auto at = std::find_if(waiting_.begin(), waiting_.end(),
                         [&](const auto& w) { return Before(*s, *w); });
  waiting_.insert(at, std::move(s));
}

void BatchPlanner::Add(RequestId id, GenerateRequest request,
                       RequestCallbacks callbacks, absl::Time submitted) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->tokens = request.prompt;
  s->tokens.insert(s->tokens.end(), request.resumed.begin(),
                   request.resumed.end());
  if (request.sampling.repetition_penalty != 1.0f) {
    for (int32_t t : request.prompt) s->penalized.emplace(t, 0);
  }
  if (HasPenalties(request.sampling)) {
    for (int32_t t : request.resumed) ++s->penalized[t];
  }
  if (request.min_tokens > 0) {
    s->min_tokens_mask = request.stop_token_ids;
    std::sort(s->min_tokens_mask.begin(), s->min_tokens_mask.end());
    s->min_tokens_mask.erase(
        std::unique(s->min_tokens_mask.begin(), s->min_tokens_mask.end()),
        s->min_tokens_mask.end());
  }
  // Drafts are checked against what is sampled; a grammar's masks and a
  // recurrent state (hybrid models) would need rolling back too.
  if (request.speculative && request.constraint == nullptr &&
      blocks_->state_slots() == 0) {
    s->drafter = speculation_.NewDrafter(request);
    s->acceptance = policy_.NewSequence();
  }
  s->request = std::move(request);
  s->callbacks = std::move(callbacks);
  s->submitted = submitted;
  Enqueue(std::move(s));
}

void BatchPlanner::Cancel(RequestId id) { cancelled_.insert(id); }

void BatchPlanner::Drop(Sequence& s) {
  blocks_->Free(s.id);
  if (release_) release_(s.id);
  s.computed = 0;
}

void BatchPlanner::Finish(Sequence& s, absl::StatusOr<GenerateResult> result,
                          absl::Time now, std::vector<PlannerEvent>& events) {
  // Tokens generated here (not those of a resumed stream; `result` may
  // have been moved from s.result).
  const int64_t generated = static_cast<int64_t>(
      s.tokens.size() - s.request.prompt.size() - s.request.resumed.size());
  RequestRecord record{
      .api = s.request.api,
      .outcome = OutcomeOf(result),
      .prompt_tokens = static_cast<int64_t>(s.request.prompt.size()),
      .generated_tokens = generated,
      .done = Seconds(s.submitted, now)};
  if (s.started) record.started = Seconds(s.submitted, *s.started);
  if (generated > 0) {
    record.first_token = Seconds(s.submitted, s.first_token);
    record.last_token = Seconds(s.submitted, s.last_token);
  }
  metrics_->RequestFinished(record);
  s.done = true;
  blocks_->Free(s.id);
  if (release_) release_(s.id);
  events.push_back(
      [cb = std::move(s.callbacks.on_done), r = std::move(result)]() mutable {
        if (cb) cb(std::move(r));
      });
}

bool BatchPlanner::TryStart(Sequence& s, int64_t& promised) {
  // A hybrid model's sequence needs a device state slot (a new one, or one
  // for its state swapped out), beside those the running sequences that
  // have not taken theirs yet will take.
  const int32_t slot = blocks_->StateSlot(s.id);
  const bool needs_slot =
      blocks_->state_slots() > 0 && (slot < 0 || blocks_->IsHostSlot(slot));
  if (needs_slot) {
    const auto waiting_for_slot = std::count_if(
        running_.begin(), running_.end(),
        [&](const auto& r) { return blocks_->StateSlot(r->id) < 0; });
    if (blocks_->FreeStateSlots() <= waiting_for_slot) return false;
  }
  // A fresh (or dropped) sequence starts from its cached prefix; at least
  // its last token is computed, for the logits.
  // One that still scores its prompt (prompt logprobs) computes all of it.
  const bool scoring =
      s.request.prompt_logprobs > 0 &&
      s.result.prompt_logprobs.size() + 1 < s.request.prompt.size();
  if (s.computed == 0 && blocks_->Table(s.id).empty() && !scoring) {
    s.computed = blocks_->AttachPrefix(
        s.id, s.tokens, static_cast<int64_t>(s.tokens.size()) - 1);
    if (!s.attached) {
      s.attached = true;
      s.result.cached_prompt_tokens = std::min<int64_t>(
          s.computed, static_cast<int64_t>(s.request.prompt.size()));
    }
  }
  const int64_t table = static_cast<int64_t>(blocks_->Table(s.id).size());
  const int64_t chunk =
      std::min<int64_t>(options_.max_batched_tokens,
                        static_cast<int64_t>(s.tokens.size()) - s.computed);
  const int32_t host = blocks_->HostBlocksOf(s.id);
  const int64_t grow =
      std::max<int64_t>(0, blocks_->BlocksFor(s.computed + chunk) - table);
  // Alone, a sequence always starts: it grows by moving its own blocks to
  // the host (each request fits device + host). Otherwise the device must
  // hold its blocks and first chunk beside those promised to sequences
  // started in this round (they take their blocks in the next step).
  if (!running_.empty() &&
      host + grow + promised > blocks_->DeviceAvailable()) {
    // A hybrid sequence that attached a cached prefix took a device slot
    // with it; no waiting sequence holds one (it attaches again later).
    if (needs_slot && slot < 0 && blocks_->StateSlot(s.id) >= 0) Drop(s);
    return false;
  }
  if (needs_slot && slot >= 0) {
    SHARDLM_CHECK(blocks_->SwapInState(s.id), "state swap-in");
  }
  blocks_->SwapIn(s.id, host);
  promised += grow;
  return true;
}

void BatchPlanner::EndCancelledAndLate(absl::Time now,
                                       std::vector<PlannerEvent>& events) {
  const auto cancelled_result = [](Sequence& s) {
    s.result.finish_reason = FinishReason::kCancelled;
    return std::move(s.result);
  };
  const auto late = [](const Sequence& s) {
    return absl::DeadlineExceededError(
        absl::StrCat("the deadline passed after ", s.result.tokens.size(),
                     " of ", s.request.max_tokens, " tokens"));
  };
  // A past deadline wins over a cancel: a front end cancels a request
  // whose client's deadline passed (gRPC reports both), and the request
  // ended because of the deadline.
  const auto ended = [&](Sequence& s) -> absl::StatusOr<GenerateResult> {
    if (s.request.deadline <= now) return late(s);
    return cancelled_result(s);
  };
  for (auto& s : running_) {
    // One in a step in flight ends once its steps are back (its blocks are
    // being written): until then it is only planned no further.
    if (s->in_flight > 0) {
      s->ending |= cancelled_.contains(s->id) || s->request.deadline <= now;
      continue;
    }
    if (cancelled_.contains(s->id) || s->request.deadline <= now) {
      Finish(*s, ended(*s), now, events);
      cancelled_.erase(s->id);
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Sequence& s = **it;
    if (cancelled_.contains(s.id) || s.request.deadline <= now) {
      Finish(s, ended(s), now, events);  // A preempted one holds blocks.
      cancelled_.erase(s.id);
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  // Ids left name requests in flight, or ones already finished.
  absl::erase_if(cancelled_, [&](RequestId id) {
    return std::none_of(running_.begin(), running_.end(),
                        [&](const auto& r) { return r->id == id; });
  });
  std::erase_if(running_, [](const auto& s) { return s->done; });
}

void BatchPlanner::Admit(absl::Time now, std::vector<PlannerEvent>& events) {
  EndCancelledAndLate(now, events);
  // Strictly in order: a large request at the head is not starved by
  // smaller ones behind it. The head may preempt running sequences of a
  // lower priority (latest first) to make room.
  int64_t promised = 0;  // Blocks the sequences started here will take.
  while (!waiting_.empty() &&
         static_cast<int32_t>(running_.size()) < options_.max_seqs) {
    std::unique_ptr<Sequence> s = std::move(waiting_.front());
    waiting_.pop_front();
    bool start = TryStart(*s, promised);
    // Victims: the latest lower-priority sequence not in a step in flight.
    const auto victim_at = [&] {
      for (size_t v = running_.size(); v-- > 0;) {
        if (running_[v]->request.priority >= s->request.priority) break;
        if (running_[v]->in_flight == 0) return v;
      }
      return running_.size();
    };
    for (size_t v = start ? running_.size() : victim_at();
         !start && v < running_.size(); v = victim_at()) {
      std::unique_ptr<Sequence> victim = std::move(running_[v]);
      running_.erase(running_.begin() + v);
      Preempt(*victim);
      victim->preempted = false;
      Enqueue(std::move(victim));  // Behind s: a lower priority.
      start = TryStart(*s, promised);
    }
    if (!start) {
      waiting_.push_front(std::move(s));
      break;
    }
    if (!s->started) s->started = now;
    auto at = std::find_if(running_.begin(), running_.end(),
                           [&](const auto& r) { return Before(*s, *r); });
    running_.insert(at, std::move(s));
  }
}

void BatchPlanner::Preempt(Sequence& s) {
  const int32_t device = blocks_->DeviceBlocksOf(s.id);
  s.preempted = true;
  if (device == 0) return;  // Admitted but not started: nothing to move.
  // All of its device blocks or none (under CP each needs a host block of
  // its own rank): a preempted sequence holds no device block. A hybrid
  // model's state goes with its blocks, to a host slot, or it is
  // recomputed (its slot given back with its blocks): no waiting sequence
  // holds a device slot.
  if (blocks_->CanSwapOut(s.id) &&
      (blocks_->state_slots() == 0 || blocks_->SwapOutState(s.id))) {
    blocks_->SwapOut(s.id, device);
    ++counters_.preempted_swap;
  } else {
    Drop(s);
    ++counters_.preempted_recompute;
  }
}

void BatchPlanner::RecomputeSwapped(int32_t blocks) {
  for (auto it = waiting_.rbegin(); it != waiting_.rend() && blocks > 0; ++it) {
    Sequence& s = **it;
    const int32_t host = blocks_->HostBlocksOf(s.id);
    if (host == 0) continue;
    Drop(s);
    blocks -= host;
    ++counters_.preempted_recompute;
  }
}

int64_t BatchPlanner::Grow(size_t index, int64_t want,
                           const std::vector<bool>& in_step) {
  Sequence& s = *running_[index];
  const auto table = [&] {
    return static_cast<int64_t>(blocks_->Table(s.id).size());
  };
  const auto short_by = [&](int64_t tokens) {
    return blocks_->BlocksFor(tokens) - table() - blocks_->DeviceAvailable();
  };
  int64_t target = s.computed + want;
  // Later (lower priority, newer) sequences not in this step give way.
  for (size_t v = running_.size(); v-- > index + 1 && short_by(target) > 0;) {
    Sequence& victim = *running_[v];
    if (!in_step[v] && !victim.preempted && !victim.done &&
        victim.in_flight == 0) {
      Preempt(victim);
    }
  }
  // Whether it is alone is asked only when it is short (O(running) each).
  const auto alone = [&] {
    return std::all_of(running_.begin(), running_.end(), [&](const auto& r) {
      return r.get() == &s || r->preempted || r->done;
    });
  };
  if (short_by(target) > 0 && alone()) {
    // Alone: move this sequence's own full blocks (not the one being
    // written) to the host, making room on the host if it must.
    const std::vector<int32_t>& t = blocks_->Table(s.id);
    const int64_t full = s.computed / blocks_->block_size();
    const int32_t movable = static_cast<int32_t>(
        std::count_if(t.begin(), t.begin() + std::min<int64_t>(full, t.size()),
                      [&](int32_t b) { return !blocks_->IsHost(b); }));
    const int32_t keep_last = static_cast<int32_t>(table() - full);
    const int32_t need =
        std::min(movable, static_cast<int32_t>(short_by(target)));
    int32_t moved = blocks_->SwapOut(s.id, need, keep_last);
    if (moved < need) RecomputeSwapped(need - moved);
    moved += blocks_->SwapOut(s.id, need - moved, keep_last);
    counters_.offloaded += moved;
  }
  if (short_by(target) > 0) {
    // Compute what fits now; the rest in later steps (or once the
    // sequences ahead of this one, already in the step, have finished).
    target = std::min<int64_t>(target,
                               (table() + blocks_->DeviceAvailable()) *
                                   static_cast<int64_t>(blocks_->block_size()));
    if (target <= s.computed) return 0;
  }
  const absl::Status reserved = blocks_->Reserve(s.id, target);
  SHARDLM_CHECK(reserved.ok(), reserved.ToString());
  return target - s.computed;
}

int64_t BatchPlanner::SnapshotAt(const Sequence& s) const {
  // The prompt's last full block before its last token (the most a
  // repeat of the prompt, or a conversation extending it, attaches).
  if (blocks_->state_snapshots() == 0) return 0;
  const int64_t bs = blocks_->block_size();
  return (static_cast<int64_t>(s.request.prompt.size()) - 1) / bs * bs;
}

SampleHistory BatchPlanner::History(const Sequence& s, int64_t generated,
                                    absl::Span<const int32_t> drafts) {
  // A constrained row's mask is not computed here: the plan names the row
  // (StepPlan::masks) and the scheduler computes it while the step runs.
  SampleHistory h;
  if (HasPenalties(s.request.sampling)) {
    std::map<int32_t, int32_t> drafted;
    for (int32_t t : drafts) ++drafted[t];
    const std::map<int32_t, int32_t>* counts = &s.penalized;
    std::map<int32_t, int32_t> merged;
    if (!drafted.empty()) {
      merged = s.penalized;
      for (const auto& [token, count] : drafted) merged[token] += count;
      counts = &merged;
    }
    h.tokens.reserve(counts->size());
    h.counts.reserve(counts->size());
    for (const auto& [token, count] : *counts) {
      h.tokens.push_back(token);
      h.counts.push_back(count);
    }
  }
  // Where the grammar allows only stop tokens, ResolvedHistory drops this.
  if (generated < s.request.min_tokens) h.masked = s.min_tokens_mask;
  return h;
}

std::vector<int> BatchPlanner::PlanDrafts(const std::vector<bool>& eligible,
                                          int64_t spare_rows) {
  std::vector<int> drafts(running_.size(), 0);
  std::vector<size_t> who;
  std::vector<double> acceptance;
  std::vector<int> available;
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    s.drafts.clear();
    if (!eligible[i]) continue;
    s.drafts = s.drafter->Draft(s.tokens, speculation_.max_tokens);
    if (s.drafts.empty()) continue;
    who.push_back(i);
    acceptance.push_back(s.acceptance.rate());
    available.push_back(static_cast<int>(s.drafts.size()));
  }
  if (who.empty() || spare_rows <= 0) {
    for (size_t i : who) running_[i]->drafts.clear();
    return drafts;
  }
  const std::vector<int> k = policy_.Plan(acceptance, available, spare_rows);
  for (size_t j = 0; j < who.size(); ++j) {
    drafts[who[j]] = k[j];
    running_[who[j]]->drafts.resize(k[j]);
  }
  return drafts;
}

int BatchPlanner::KeepConfirmed(Sequence& s, const std::vector<int32_t>& drafts,
                                const int32_t* sampled) {
  // Row j samples what follows draft j - 1: draft j counts while every
  // row before it sampled the draft after it.
  int kept = 0;
  while (kept < static_cast<int>(drafts.size()) &&
         sampled[kept] == drafts[kept]) {
    ++kept;
  }
  // The KV of the last token and the kept drafts is the sequence's; that
  // of the rejected ones is dropped with the blocks only they filled.
  s.computed -= static_cast<int64_t>(drafts.size()) - kept;
  blocks_->Truncate(s.id, s.computed);
  s.acceptance.Observe(static_cast<int>(drafts.size()), kept);
  policy_.ObserveVerification(static_cast<int>(drafts.size()), kept);
  ++counters_.spec_verifications;
  counters_.spec_drafted += static_cast<int64_t>(drafts.size());
  counters_.spec_accepted += kept;
  ++counters_.spec_kept_histogram[kept];
  return kept;
}

std::optional<StepPlan> BatchPlanner::Plan(size_t max_seqs) {
  // Blocks are taken in priority order, so that a sequence can make room
  // by preempting only lower-priority ones, whatever it is doing. The token
  // budget goes to decoding sequences first (one token each), the rest to
  // prefill chunks.
  const auto remaining = [](const Sequence& s) {
    return static_cast<int64_t>(s.tokens.size()) - s.computed;
  };
  const auto decoding = [&](const Sequence& s) {
    return remaining(s) == 1 && s.computed > 0;
  };
  // A sequence in flight is runnable only while its prompt has chunks
  // left (its steps in flight sample nothing): the next chunk follows the
  // previous one through the pipeline, each stage running them in order,
  // so that a lone long prompt keeps every stage busy. A sequence whose
  // step in flight samples has no tokens left until that step is back.
  const auto runnable = [&](const Sequence& s) {
    return !s.preempted && !s.ending && remaining(s) > 0;
  };
  int64_t decode_budget = options_.max_batched_tokens;
  int64_t prefill_budget = options_.max_batched_tokens;
  for (const auto& s : running_) {
    prefill_budget -= runnable(*s) && decoding(*s) ? 1 : 0;
  }
  // A sequence that was in several failed steps runs alone (Interrupt).
  size_t solo = running_.size();
  for (size_t i = 0; i < running_.size() && solo == running_.size(); ++i) {
    if (running_[i]->isolated && runnable(*running_[i])) solo = i;
  }
  // Rows that score prompt tokens (prompt logprobs) share the step's logit
  // rows with the sampled ones, at most max_seqs in all (the rows a GPU
  // runner's buffers hold): a scoring sequence's chunk is cut to what is
  // left after one sampled row per sequence that may run.
  const auto scoring = [](const Sequence& s) {
    return s.request.prompt_logprobs > 0 &&
           s.computed + 1 < static_cast<int64_t>(s.request.prompt.size());
  };
  int64_t score_budget =
      static_cast<int64_t>(options_.max_seqs) -
      static_cast<int64_t>(std::min(running_.size(), max_seqs));
  // Speculative decoding: drafts for the decoding sequences that draft,
  // within the token budget's rows and the logit rows left after one
  // token and one sampled row per sequence.
  std::vector<int> drafts(running_.size(), 0);
  if (speculation_.enabled()) {
    std::vector<bool> eligible(running_.size(), false);
    int64_t decoders = 0;
    size_t considered = 0;
    bool prefills = false;
    for (size_t i = 0; i < running_.size() && considered < max_seqs; ++i) {
      const Sequence& s = *running_[i];
      if (!runnable(s) || (solo < running_.size() && i != solo)) continue;
      ++considered;
      if (!decoding(s)) {
        prefills = true;
        continue;
      }
      ++decoders;
      const bool first = s.tokens.size() == s.request.prompt.size();
      eligible[i] =
          s.drafter != nullptr && !(first && s.request.return_prompt_logits);
    }
    // A step that prefills is compute-bound: a draft's row there costs as
    // much as a prompt token's, and its time measures nothing. Only steps
    // that only decode speculate.
    if (prefills) eligible.assign(running_.size(), false);
    drafts = PlanDrafts(
        eligible,
        std::min(options_.max_batched_tokens - decoders, score_budget));
    for (int d : drafts) {
      prefill_budget -= d;
      score_budget -= d;
    }
  }
  size_t seqs = 0;
  std::vector<int64_t> chunk(running_.size(), 0);
  std::vector<bool> scheduled(running_.size(), false);
  std::vector<bool> decode(running_.size(), false);
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    if (!runnable(s) || seqs >= max_seqs) continue;
    if (solo < running_.size() && i != solo) continue;
    decode[i] = decoding(s);
    int64_t& budget = decode[i] ? decode_budget : prefill_budget;
    if (budget <= 0) continue;
    if (drafts[i] > 0) {
      // Drafts take only blocks that are free (or cached): they never
      // preempt a sequence or move this one's blocks to the host.
      const int64_t room = (static_cast<int64_t>(blocks_->Table(s.id).size()) +
                            blocks_->DeviceAvailable()) *
                               blocks_->block_size() -
                           s.computed - 1;
      drafts[i] = static_cast<int>(std::clamp<int64_t>(room, 0, drafts[i]));
      s.drafts.resize(drafts[i]);
    }
    int64_t want = std::min(remaining(s) + drafts[i], budget);
    // A hybrid model's prefill stops at its snapshot point (SnapshotAt).
    if (const int64_t at = SnapshotAt(s); at > s.computed) {
      want = std::min(want, at - s.computed);
    }
    if (scoring(s)) {
      if (score_budget <= 0) continue;
      want = std::min(want, score_budget);
    }
    chunk[i] = Grow(i, want, scheduled);
    if (drafts[i] > 0 && chunk[i] < 1 + drafts[i]) {
      // Short of blocks (or budget): fewer drafts.
      drafts[i] = static_cast<int>(std::max<int64_t>(0, chunk[i] - 1));
      s.drafts.resize(drafts[i]);
    }
    if (scoring(s)) score_budget -= chunk[i];
    scheduled[i] = chunk[i] > 0;
    budget -= chunk[i];
    seqs += scheduled[i] ? 1 : 0;
  }
  // The step: decode tokens first, then prefill chunks.
  std::vector<Sequence*> snapshots;  // Reaching their snapshot point.
  StepPlan plan;
  InFlight f;
  StepInput& step = plan.step;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running_.size(); ++i) {
      Sequence& s = *running_[i];
      if (chunk[i] == 0 || s.preempted || decode[i] != (pass == 0)) continue;
      const int32_t seq_index = static_cast<int32_t>(f.stepped.size());
      step.seq_ids.push_back(s.id);
      plan.stepped.push_back(s.id);
      f.stepped.push_back(&s);
      const GenerateRequest& request = s.request;
      const int64_t prompt_size = static_cast<int64_t>(request.prompt.size());
      const int64_t known = static_cast<int64_t>(s.tokens.size());
      for (int64_t j = 0; j < chunk[i]; ++j) {
        const int64_t pos = s.computed + j;
        step.tokens.push_back(pos < known ? s.tokens[pos]
                                          : s.drafts[pos - known]);
        step.positions.push_back(static_cast<int32_t>(pos));
        step.token_seq.push_back(seq_index);
        // Prompt logprobs: this position's logits score the next prompt
        // token (positions scored before a recompute are not again).
        if (request.prompt_logprobs > 0 && pos + 1 < prompt_size &&
            pos >= static_cast<int64_t>(s.result.prompt_logprobs.size())) {
          step.logit_rows.push_back(static_cast<int32_t>(step.tokens.size()) -
                                    1);
          step.sampling.push_back(SamplingParams{});
          step.sample_index.push_back(0);
          step.logprobs.push_back(request.prompt_logprobs);
          step.history.emplace_back();
          step.score_tokens.resize(step.logit_rows.size() - 1, -1);
          step.score_tokens.push_back(request.prompt[pos + 1]);
          f.scored.resize(f.rows.size(), false);
          f.scored.push_back(true);
          plan.rows.push_back(s.id);
          f.rows.push_back(&s);
          f.want_logprobs = true;
        }
      }
      s.computed += chunk[i];
      f.computed.push_back(s.computed);
      if (s.computed == SnapshotAt(s)) snapshots.push_back(&s);
      f.first_row.push_back(step.logit_rows.size());
      f.drafts.push_back(s.drafts);
      // Logits only where a token is sampled: the end of the known tokens,
      // and after each draft (verification rows).
      const int64_t drafted = static_cast<int64_t>(s.drafts.size());
      if (s.computed == known + drafted) {
        const GenerateRequest& req = s.request;
        const uint64_t generated = s.tokens.size() - req.prompt.size();
        for (int64_t j = 0; j <= drafted; ++j) {
          step.logit_rows.push_back(
              static_cast<int32_t>(step.tokens.size() - 1 - drafted + j));
          step.sampling.push_back(req.sampling);
          step.sample_index.push_back(generated + j);
          step.logprobs.push_back(req.logprobs);
          step.history.push_back(
              History(s, static_cast<int64_t>(generated + j),
                      absl::MakeConstSpan(s.drafts).subspan(0, j)));
          if (req.constraint != nullptr) {
            plan.masks.push_back(
                {.row = static_cast<int32_t>(step.logit_rows.size()) - 1,
                 .constraint = req.constraint.get()});
            ++counters_.constrained_rows;
          }
          step.return_logits |= generated == 0 && req.return_prompt_logits;
          plan.rows.push_back(s.id);
          f.rows.push_back(&s);
          f.want_logprobs |= req.logprobs > 0;
          if (!step.score_tokens.empty()) {
            step.score_tokens.push_back(-1);
            f.scored.push_back(false);
          }
        }
      }
    }
  }
  // Tables last: growing one sequence may have swapped out another's.
  for (Sequence* s : f.stepped) {
    step.block_tables.push_back(blocks_->Table(s->id));
    if (blocks_->state_slots() > 0) {
      step.state_slots.push_back(blocks_->StateSlot(s->id));
    }
  }
  step.copies = blocks_->TakeCopies();
  step.state_copies = blocks_->TakeStateCopies();
  // After this step's compute: with the next step's copies.
  for (Sequence* s : snapshots) {
    blocks_->SnapshotState(s->id, s->tokens, s->computed);
  }
  for (auto& s : running_) {
    if (!s->preempted) continue;
    s->preempted = false;
    Enqueue(std::move(s));
  }
  std::erase_if(running_, [](const auto& s) { return s == nullptr; });
  // Most steps have no row with penalties or min_tokens: no histories.
  if (std::all_of(step.history.begin(), step.history.end(),
                  [](const SampleHistory& h) { return h.empty(); })) {
    step.history.clear();
  }
  // Rows sampled after the last scored one.
  if (!step.score_tokens.empty()) {
    step.score_tokens.resize(step.logit_rows.size(), -1);
    f.scored.resize(f.rows.size(), false);
  }
  if (step.tokens.empty() && step.copies.empty() && step.state_copies.empty()) {
    return std::nullopt;
  }
  for (Sequence* s : f.stepped) ++s->in_flight;
  f.tokens = static_cast<int64_t>(step.tokens.size());
  plan.decode_only = !step.tokens.empty() &&
                     std::all_of(f.stepped.begin(), f.stepped.end(),
                                 [](const Sequence* s) {
                                   return s->computed >= static_cast<int64_t>(
                                                             s->tokens.size());
                                 }) &&
                     static_cast<int64_t>(f.rows.size()) == f.tokens;
  in_flight_.push_back(std::move(f));
  ++counters_.steps;
  counters_.max_steps_in_flight =
      std::max<int64_t>(counters_.max_steps_in_flight, in_flight_.size());
  return plan;
}

std::optional<StepPlan> BatchPlanner::PlanForPipeline(int depth) {
  depth = std::max(1, depth);
  if (static_cast<int>(in_flight_.size()) >= depth) return std::nullopt;
  const size_t share = std::max<size_t>(1, (busy() + depth - 1) / depth);
  return Plan(depth == 1 ? running_.size() : share);
}

void BatchPlanner::Apply(absl::StatusOr<StepOutput> out, absl::Time now,
                         std::vector<PlannerEvent>& events) {
  SHARDLM_CHECK(!in_flight_.empty(), "Apply with no step in flight");
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  for (Sequence* s : f.stepped) --s->in_flight;
  const std::vector<Sequence*>& rows = f.rows;
  if (out.ok() && out->tokens.size() != rows.size()) {
    out =
        absl::InternalError(absl::StrCat("step returned ", out->tokens.size(),
                                         " tokens for ", rows.size(), " rows"));
  }
  if (out.ok() && f.want_logprobs && out->logprobs.size() != rows.size()) {
    out = absl::InternalError(
        absl::StrCat("step returned ", out->logprobs.size(),
                     " log-probability rows for ", rows.size(), " rows"));
  }
  if (out.ok() &&
      std::any_of(out->tokens.begin(), out->tokens.end(),
                  [&](int32_t t) { return t < 0 || t >= vocab_size_; })) {
    out =
        absl::InternalError("step returned a token id outside the vocabulary");
  }
  if (!out.ok()) {
    // The KV cache of every running sequence is now suspect, and so are
    // the blocks this step was to copy: all holders fail (the sequences of
    // the steps still in flight are among them).
    AbandonInFlight();
    if (absl::IsDataLoss(out.status())) {
      // Corrupt KV produced no token: recompute, and serve on.
      ++counters_.kv_checksum_failures;
      Interrupt(out.status(), {}, now, events);
    } else if (resume_interrupted_) {
      std::vector<RequestId> suspects;
      for (const Sequence* s : f.stepped) suspects.push_back(s->id);
      Interrupt(out.status(), suspects, now, events);
    } else {
      FailKvHolders(out.status(), now, events);
    }
    return;
  }
  counters_.computed_tokens += f.tokens;
  // Verifications: the drafts the sampled tokens confirm stay; rows after
  // the first rejected draft sampled from a context that is not the
  // sequence's, and are dropped.
  std::vector<bool> dropped(rows.size(), false);
  for (size_t i = 0; i < f.stepped.size(); ++i) {
    if (f.drafts[i].empty()) continue;
    Sequence& s = *f.stepped[i];
    const size_t first = f.first_row[i];
    const int kept =
        s.done ? 0 : KeepConfirmed(s, f.drafts[i], out->tokens.data() + first);
    for (size_t j = first + kept + 1; j <= first + f.drafts[i].size(); ++j) {
      dropped[j] = true;
    }
    f.computed[i] = s.computed;
  }
  // The blocks this step filled (a later chunk in flight fills more).
  for (size_t i = 0; i < f.stepped.size(); ++i) {
    blocks_->CacheFullBlocks(f.stepped[i]->id, f.stepped[i]->tokens,
                             f.computed[i]);
  }
  for (size_t row = 0; row < rows.size(); ++row) {
    Sequence& s = *rows[row];
    const GenerateRequest& req = s.request;
    if (dropped[row] || s.done) continue;
    if (!f.scored.empty() && f.scored[row]) {
      if (!s.done)
        s.result.prompt_logprobs.push_back(std::move(out->logprobs[row]));
      continue;
    }
    const int64_t generated =
        static_cast<int64_t>(s.tokens.size() - req.prompt.size());
    if (generated == 0 && req.return_prompt_logits) {
      const float* l = out->logits.f32().data() + row * vocab_size_;
      s.result.prompt_logits.assign(l, l + vocab_size_);
    }
    const int32_t token = out->tokens[row];
    if (req.constraint != nullptr) {
      // The sampler drew from the mask, so this fails only on a bug; the
      // request ends rather than emit text outside its grammar.
      if (absl::Status st = req.constraint->Accept(token); !st.ok()) {
        Finish(s, absl::InternalError(st.message()), now, events);
        continue;
      }
    }
    const bool first = s.result.tokens.empty();  // Its first token here.
    if (first && req.prompt_logprobs > 0 && s.callbacks.on_prompt_logprobs) {
      s.callbacks.on_prompt_logprobs(s.result.prompt_logprobs);
    }
    s.tokens.push_back(token);
    s.result.tokens.push_back(token);
    if (HasPenalties(req.sampling)) ++s.penalized[token];
    const TokenLogprobs* logprobs = nullptr;
    if (req.logprobs > 0) {
      s.result.logprobs.push_back(std::move(out->logprobs[row]));
      logprobs = &s.result.logprobs.back();
    }
    if (first) {
      s.first_token = now;
      s.result.prefill_seconds = Seconds(s.submitted, now);
    } else {
      metrics_->InterTokenGap(Seconds(s.last_token, now));
    }
    s.last_token = now;
    s.result.decode_seconds = Seconds(s.first_token, now);
    const TokenAction action = s.callbacks.on_token
                                   ? s.callbacks.on_token(token, logprobs)
                                   : TokenAction::kContinue;
    if (action == TokenAction::kCancel) {
      s.result.finish_reason = FinishReason::kCancelled;
    } else if (action == TokenAction::kStop) {
      s.result.finish_reason = FinishReason::kStop;
    } else if (std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(),
                         token) != req.stop_token_ids.end()) {
      s.result.finish_reason = FinishReason::kStop;
    } else if (generated + 1 >= req.max_tokens) {
      s.result.finish_reason = FinishReason::kLength;
    } else {
      continue;
    }
    Finish(s, std::move(s.result), now, events);
  }
  std::erase_if(running_, [](const auto& s) { return s->done; });
}

void BatchPlanner::AbandonInFlight() {
  for (const InFlight& f : in_flight_) {
    for (Sequence* s : f.stepped) s->in_flight = 0;
  }
  in_flight_.clear();
}

void BatchPlanner::FailKvHolders(const absl::Status& why, absl::Time now,
                                 std::vector<PlannerEvent>& events) {
  for (auto& s : running_) Finish(*s, why, now, events);
  running_.clear();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (blocks_->Table((*it)->id).empty()) {
      ++it;
      continue;
    }
    Finish(**it, why, now, events);
    it = waiting_.erase(it);
  }
  blocks_->DropCache();
}

void BatchPlanner::Interrupt(const absl::Status& why,
                             const std::vector<RequestId>& suspects,
                             absl::Time now,
                             std::vector<PlannerEvent>& events) {
  SHARDLM_CHECK(in_flight_.empty(), "Interrupt with steps in flight");
  ++counters_.interruptions;
  const auto suspect = [&](const Sequence& s) {
    return std::find(suspects.begin(), suspects.end(), s.id) != suspects.end();
  };
  // Whatever was lost goes back to the queue; its tokens stay.
  const auto requeue = [&](Sequence& s) {
    counters_.recomputed_tokens += s.computed;
    ++counters_.resumed;
    Drop(s);
    s.preempted = false;
    s.ending = false;  // Still in cancelled_, or late: Admit ends it.
  };
  for (auto& s : running_) {
    if (suspect(*s) && s->isolated && suspects.size() == 1 &&
        ++s->failed_alone >= kFailAfterFailuresAlone) {
      // It failed steps it had to itself: it is the cause, not a victim.
      Finish(*s,
             absl::Status(why.code(),
                          absl::StrCat(why.message(), " (", s->failed_alone,
                                       " steps of this request alone failed)")),
             now, events);
      continue;
    }
    if (suspect(*s) && ++s->interruptions >= kIsolateAfterInterruptions) {
      s->isolated = true;
    }
    requeue(*s);
    Enqueue(std::move(s));
  }
  running_.clear();
  for (auto& s : waiting_) {
    if (!blocks_->Table(s->id).empty()) requeue(*s);
  }
  // Copies planned for the lost pools are moot.
  (void)blocks_->TakeCopies();
  (void)blocks_->TakeStateCopies();
  blocks_->DropCache();
}

void BatchPlanner::EndAll(const absl::Status& why, absl::Time now,
                          std::vector<PlannerEvent>& events) {
  AbandonInFlight();
  for (auto& s : running_) Finish(*s, why, now, events);
  running_.clear();
  for (auto& s : waiting_) Finish(*s, why, now, events);
  waiting_.clear();
}

size_t BatchPlanner::busy() const {
  size_t n = 0;
  for (const auto& q : running_) {
    n += !q->preempted && !q->done &&
         (q->in_flight > 0 ||
          static_cast<int64_t>(q->tokens.size()) > q->computed);
  }
  return n;
}

SchedulerStats BatchPlanner::Stats() const {
  SchedulerStats s = counters_;
  s.running = static_cast<int64_t>(running_.size());
  s.waiting = static_cast<int64_t>(waiting_.size());
  s.steps_in_flight = static_cast<int64_t>(in_flight_.size());
  const auto slots = [&](const Sequence& q) {
    const int64_t allocated =
        static_cast<int64_t>(blocks_->Table(q.id).size()) *
        blocks_->block_size();
    s.kv_slots_allocated += allocated;
    s.kv_slots_filled += std::min(q.computed, allocated);
  };
  for (const auto& q : running_) slots(*q);
  for (const auto& q : waiting_) slots(*q);
  s.device = blocks_->device_usage();
  s.host = blocks_->host_usage();
  if (blocks_->interleave() > 1) {  // O(free + cached blocks).
    s.device_by_cp_rank = blocks_->DeviceUsageByRank();
    s.host_by_cp_rank = blocks_->HostUsageByRank();
  }
  s.blocks = blocks_->counters();
  return s;
}

}  // namespace shardlm
