// Flags and start-up shared by the commands that run a model in this
// process (generate, serve).
#ifndef SHARDLM_LAUNCH_ENGINE_FLAGS_H_
#define SHARDLM_LAUNCH_ENGINE_FLAGS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "backend/device.h"
#include "engine/engine.h"
#include "launch/cache_flags.h"
#include "launch/flags.h"
#include "launch/speculation_flags.h"
#include "model/tokenizer.h"

namespace shardlm {

struct LocalEngineFlags {
  std::string model;
  int64_t threads = 0;
  KvCacheFlags kv;
  BatchLimitFlags limits;
  SpeculationFlags speculation;
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t cp = 1;  // Context parallel (CPU only).
  std::string moe_sharding = "auto";
  std::string pp_balance = "decode";
  std::string precision = "exact";  // --precision (kernels/precision.h).
  std::string device = "auto";
  bool allow_shared_gpu = false;
  std::string cuda_weights = "bf16";

  // Adds --model, --threads, the KV cache's flags (KvCacheFlags), the step
  // limits' (BatchLimitFlags), speculation's (SpeculationFlags), --tp,
  // --pp, --cp, --moe-sharding,
  // --pp-balance, --device, --allow-shared-gpu
  // and --cuda-weights.
  void Register(FlagSet& flags);
  // Empty when the values are in range, else the problem (naming the flag).
  // Does not require --model.
  std::string Problem() const;
  // The engine options on `device` (from ChooseDevice).
  EngineOptions ToOptions(const DeviceChoice& device) const;
  // Resolves --device against this machine: "auto" takes GPUs when there
  // is one per rank (or --allow-shared-gpu) and no KV dtype GPUs lack is
  // asked for, else the CPU; the reason is for the log.
  absl::StatusOr<DeviceChoice> ResolveDevice(
      const CudaAvailability& cuda) const;
};

// A model loaded in this process: its engine and tokenizer.
struct LocalModel {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string name;  // From the file, else the file name.
};

// Opens flags.model, loads the weights into an engine (on the device that
// --device resolves to, logged to stderr; shards on threads for tp * pp > 1)
// and the tokenizer; the file mapping is released after.
absl::StatusOr<LocalModel> LoadLocalModel(const LocalEngineFlags& flags);

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_ENGINE_FLAGS_H_
