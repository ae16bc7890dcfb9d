// The KV cache's and the step limits' flags, registered once for every
// command that runs an engine or a cluster (generate, serve, launch,
// coordinator), with one help text and one validation each.
#ifndef SHARDLM_LAUNCH_CACHE_FLAGS_H_
#define SHARDLM_LAUNCH_CACHE_FLAGS_H_

#include <cstdint>
#include <string>

#include "launch/flags.h"
#include "step/batch_limits.h"
#include "step/kv_cache.h"

namespace shardlm {

struct KvCacheFlags {
  int64_t block_size = kDefaultBlockSize;
  int64_t kv_cache_bytes = 0;
  int64_t cpu_offload_bytes = 0;
  std::string kv_cache_dtype = "auto";
  double gpu_memory_utilization = kDefaultGpuMemoryUtilization;
  bool prefix_caching = true;
  bool checksum = false;

  // Adds --block-size, --kv-cache-bytes, --cpu-offload-bytes,
  // --kv-cache-dtype, --gpu-memory-utilization and --prefix-caching; `per`
  // says whose budget the sizes are ("per rank", "per worker").
  void Register(FlagSet& flags, const std::string& per);
  // Empty when the values are in range, else the problem (naming the flag).
  std::string Problem() const;
  // The options; the dtype unset for "auto" (each device has its default).
  KvCacheOptions ToOptions() const;
};

struct BatchLimitFlags {
  int64_t max_batched_tokens = BatchLimits{}.max_batched_tokens;
  int64_t max_seqs = BatchLimits{}.max_seqs;
  int64_t max_queued = BatchLimits{}.max_queued;

  // Adds --max-batched-tokens, --max-seqs and --max-queued.
  void Register(FlagSet& flags);
  std::string Problem() const;
  BatchLimits ToLimits() const;
};

}  // namespace shardlm

#endif  // SHARDLM_LAUNCH_CACHE_FLAGS_H_
