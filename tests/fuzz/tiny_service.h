// The serving stack the API fuzzers drive: SmolLM2's tokenizer (the GGUF at
// $SHARDLM_MODEL, else the repository's models/ copy) over a one-layer
// random model whose 48-token context bounds any request's work, an
// engine and an InferenceService. Made once per process; aborts naming
// `who` when the tokenizer cannot be read.
#ifndef SHARDLM_TESTS_FUZZ_TINY_SERVICE_H_
#define SHARDLM_TESTS_FUZZ_TINY_SERVICE_H_

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "api/inference_service.h"
#include "engine/engine.h"
#include "executor/local_engine.h"
#include "model/in_memory_weights.h"
#include "model/tokenizer.h"

namespace shardlm::fuzzing {

struct TinyService {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<InMemoryWeights> weights;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<InferenceService> service;
};

inline TinyService* NewTinyService(const char* who) {
  auto* s = new TinyService;
  const char* env = std::getenv("SHARDLM_MODEL");
  auto t = LoadTokenizer(
      env != nullptr ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!t.ok()) {
    std::fprintf(stderr, "%s: %s (set SHARDLM_MODEL)\n", who,
                 t.status().ToString().c_str());
    std::abort();
  }
  s->tokenizer = *std::move(t);
  ModelConfig c;
  c.n_layers = 1;
  c.hidden = 32;
  c.ffn_hidden = 64;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 16;
  c.vocab_size = s->tokenizer->vocab_size();
  c.context_length = 48;  // Bounds any request's work.
  c.rope_theta = 10000.0f;
  c.rope_style = RopeStyle::kRotateHalf;
  s->weights = RandomLlamaWeights(c, 1);
  auto e = CreateLocalEngine(*s->weights, {.threads = 1});
  if (!e.ok()) {
    std::fprintf(stderr, "%s setup: %s\n", who, e.status().ToString().c_str());
    std::abort();
  }
  s->engine = *std::move(e);
  s->service = std::make_unique<InferenceService>(
      s->engine.get(), s->tokenizer.get(), "tiny", ServiceOptions{});
  return s;
}

}  // namespace shardlm::fuzzing

#endif  // SHARDLM_TESTS_FUZZ_TINY_SERVICE_H_
