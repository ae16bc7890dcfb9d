// Flags and start-up shared by the commands that run a model in this
// process (generate, serve).
#ifndef SHARDLM_LAUNCH_ENGINE_FLAGS_H_
#define SHARDLM_LAUNCH_ENGINE_FLAGS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/engine.h"
#include "launch/flags.h"
#include "model/tokenizer.h"

namespace shardlm {

struct LocalEngineFlags {
  std::string model;
  int64_t threads = 0;
  int64_t kv_cache_bytes = 0;
  int64_t cpu_offload_bytes = 0;
  bool prefix_caching = true;
  int64_t max_batched_tokens = 512;
  int64_t tp = 1;
  int64_t pp = 1;

  // Adds --model, --threads, --kv-cache-bytes, --cpu-offload-bytes,
  // --prefix-caching, --max-batched-tokens, --tp and --pp.
  void Register(FlagSet& flags);
  // Empty when the values are in range, else the problem (naming the flag).
  // Does not require --model.
  std::string Problem() const;
  EngineOptions ToOptions() const;
};

// A model loaded in this process: its engine and tokenizer.
struct LocalModel {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string name;  // From the file, else the file name.
};

// Opens flags.model, loads the weights into an engine (shards on threads
// for tp * pp > 1) and the tokenizer; the file mapping is released after.
absl::StatusOr<LocalModel> LoadLocalModel(const LocalEngineFlags& flags);

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_ENGINE_FLAGS_H_
