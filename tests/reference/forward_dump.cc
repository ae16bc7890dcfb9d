// Prints what the engine computes for one prompt, for check_forward.py:
//   forward_dump --model PATH --tokens 1,2,3 [--steps 32] [--chunk N]
//                [--tp T --pp P] [--moe-sharding auto|tp|ep]
//                [--kv-cache-dtype f32|f16|bf16]
// writes one JSON object to stdout:
//   {"logits": [last prompt position, vocab floats], "greedy": [steps ids],
//    "step_logprobs": [per step: {"sampled": lp, "top": [[id, lp] x 20]}],
//    "kv_bytes_per_token_per_rank": [bytes each rank's KV pool holds per
//    token]}
// Greedy decoding does not stop at EOS, so that every step is compared.
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "executor/local_engine.h"
#include "nlohmann/json.hpp"
#include "step/kv_cache.h"

namespace shardlm {
namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "forward_dump: %s\n", msg.c_str());
  return 2;
}

int Main(int argc, char** argv) {
  std::string model, tokens_arg;
  int steps = 32, chunk = 512, tp = 1, pp = 1;
  std::optional<DType> kv_dtype;  // The engine's default.
  MoeSharding moe = MoeSharding::kAuto;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") {
      model = value;
    } else if (flag == "--tokens") {
      tokens_arg = value;
    } else if (flag == "--steps") {
      if (!absl::SimpleAtoi(value, &steps)) return Fail("bad --steps");
    } else if (flag == "--chunk") {
      if (!absl::SimpleAtoi(value, &chunk)) return Fail("bad --chunk");
    } else if (flag == "--tp") {
      if (!absl::SimpleAtoi(value, &tp)) return Fail("bad --tp");
    } else if (flag == "--pp") {
      if (!absl::SimpleAtoi(value, &pp)) return Fail("bad --pp");
    } else if (flag == "--moe-sharding") {
      absl::StatusOr<MoeSharding> m = ParseMoeSharding(value);
      if (!m.ok()) return Fail(std::string(m.status().message()));
      moe = *m;
    } else if (flag == "--kv-cache-dtype") {
      absl::StatusOr<DType> t = ParseKvCacheDType(value);
      if (!t.ok()) return Fail(std::string(t.status().message()));
      kv_dtype = *t;
    } else {
      return Fail("unknown flag " + flag);
    }
  }
  if (model.empty() || tokens_arg.empty()) {
    return Fail(
        "usage: forward_dump --model PATH --tokens 1,2,3 "
        "[--steps 32] [--chunk N]");
  }
  std::vector<int32_t> prompt;
  for (absl::string_view t : absl::StrSplit(tokens_arg, ',')) {
    int32_t id;
    if (!absl::SimpleAtoi(t, &id)) return Fail("bad token id in --tokens");
    prompt.push_back(id);
  }
  auto source = OpenWeights(model);
  if (!source.ok()) return Fail(std::string(source.status().message()));
  auto engine =
      CreateLocalEngine(**source, {.kv = {.dtype = kv_dtype},
                                   .limits = {.max_batched_tokens = chunk},
                                   .tp = tp,
                                   .pp = pp,
                                   .moe_sharding = moe});
  if (!engine.ok()) return Fail(std::string(engine.status().message()));
  auto result = (*engine)->Generate({.prompt = prompt,
                                     .max_tokens = steps,
                                     .return_prompt_logits = true,
                                     .logprobs = kMaxLogprobs});
  if (!result.ok()) return Fail(std::string(result.status().message()));
  nlohmann::json out;
  out["logits"] = result->prompt_logits;
  out["greedy"] = result->tokens;
  // Every decode step's log-probabilities: the chosen id's and the 20 most
  // likely ids' (log_softmax of that step's logits), for the reference to
  // check step by step, not only the last prompt position.
  nlohmann::json steps_out = nlohmann::json::array();
  for (const TokenLogprobs& lp : result->logprobs) {
    nlohmann::json top = nlohmann::json::array();
    for (const TokenLogprob& t : lp.top) top.push_back({t.token, t.logprob});
    steps_out.push_back({{"sampled", lp.sampled}, {"top", top}});
  }
  out["step_logprobs"] = steps_out;
  // What each rank's KV pool stores per token slot, measured from its
  // allocation (RunnerStats), over the ranks.
  nlohmann::json kv_per_rank = nlohmann::json::array();
  for (const RunnerStats& rank : (*engine)->executor().RankStats()) {
    kv_per_rank.push_back(rank.kv_bytes_per_token);
  }
  out["kv_bytes_per_token_per_rank"] = kv_per_rank;
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) { return shardlm::Main(argc, argv); }
