// A step plan as a worker receives it from the control plane (serialized
// v1::StepPlan bytes) -> block-table deltas applied to the worker's mirror
// -> StepInput -> ModelRunner::Forward (which validates it first), on a
// tiny random model with a small KV pool. Whatever the coordinator (or a
// stranger) sends, a worker answers with an error, never a memory error.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "model/in_memory_weights.h"
#include "model/shard_plan.h"
#include "shardlm/v1/control.pb.h"
#include "step/step_codec.h"
#include "worker/kv_pool.h"
#include "worker/llama_weights.h"
#include "worker/model_runner.h"

namespace {

using namespace shardlm;

[[noreturn]] void Die(const absl::Status& s) {
  std::fprintf(stderr, "fuzz_step_plan setup: %s\n", s.ToString().c_str());
  std::abort();
}

ModelRunner& Runner() {
  static ModelRunner* runner = [] {
    ModelConfig c;
    c.n_layers = 2;
    c.hidden = 32;
    c.ffn_hidden = 64;
    c.n_heads = 2;
    c.n_kv_heads = 1;
    c.head_dim = 16;
    c.vocab_size = 67;
    c.context_length = 64;
    c.rope_theta = 10000.0f;
    c.rope_style = RopeStyle::kRotateHalf;
    static auto weights = RandomLlamaWeights(c, 2);
    auto plan = PlanShards(*weights, 1, 1);
    if (!plan.ok()) Die(plan.status());
    const ShardSpec& spec = plan->at(0, 0);
    auto w = LoadLlamaWeights(*weights, spec);
    if (!w.ok()) Die(w.status());
    auto kv = PoolConfigForShard(w->config, spec, 4, DType::kF32,
                                 /*budget_bytes=*/0, /*host_bytes=*/4096);
    if (!kv.ok()) Die(kv.status());
    auto pool = KvPool::Create(*kv);
    if (!pool.ok()) Die(pool.status());
    return new ModelRunner(*std::move(w), *std::move(pool));
  }();
  return *runner;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ModelRunner& runner = Runner();
  v1::StepPlan plan;
  if (!plan.ParseFromArray(data, static_cast<int>(size))) return 0;
  BlockTableMirror tables;
  const StepInput step = DecodeStepPlan(plan, tables);
  (void)runner.Forward(step);  // Validates the step before touching memory.
  return 0;
}
