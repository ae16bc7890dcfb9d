#include "launch/cache_flags.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardlm {

void KvCacheFlags::Register(FlagSet& flags, const std::string& per) {
  flags.Add("block-size", &block_size, "tokens per KV block");
  flags.Add("kv-cache-bytes", &kv_cache_bytes,
            absl::StrCat("KV cache budget ", per,
                         "; 0 = one full context on CPUs, what "
                         "--gpu-memory-utilization leaves on GPUs"));
  flags.Add("cpu-offload-bytes", &cpu_offload_bytes,
            absl::StrCat("host KV tier ", per,
                         ": preempted and overlong sequences swap there, "
                         "evicted prefix blocks stay cached there"));
  flags.Add("kv-cache-dtype", &kv_cache_dtype,
            "KV cache element type: auto (f16 on CPUs, bf16 on GPUs), f32, "
            "f16, bf16 or int8 (f16 and bf16 hold twice the tokens of f32, "
            "int8 3.8 times; GPUs take bf16 only)");
  flags.Add("gpu-memory-utilization", &gpu_memory_utilization,
            "on GPUs, the fraction of each GPU's memory for weights, step "
            "buffers and the KV cache (the KV cache gets what the rest "
            "leaves; --kv-cache-bytes overrides)");
  flags.Add("prefix-caching", &prefix_caching,
            "reuse the KV of full blocks shared with earlier requests");
  flags.Add("kv-checksum", &checksum,
            "keep a CRC-32C of every KV block copied to the host tier and "
            "check it when the block comes back; a mismatch recomputes the "
            "sequence instead of producing tokens (CPU workers)");
}

// The ranges are KvCacheOptions::Validate's (one check per boundary); here
// only what the flags hold beyond it: "auto", and values that would wrap in
// the options' int32 fields.
std::string KvCacheFlags::Problem() const {
  if (block_size < 1 || block_size > std::numeric_limits<int32_t>::max()) {
    return absl::StrCat("--block-size ", block_size, " is outside [1, 4096]");
  }
  if (kv_cache_dtype != "auto") {
    if (absl::StatusOr<DType> t = ParseKvCacheDType(kv_cache_dtype); !t.ok()) {
      return absl::StrCat("--kv-cache-dtype: ", t.status().message(),
                          " or auto");
    }
  }
  const absl::Status s = ToOptions().Validate();
  return s.ok() ? "" : std::string(s.message());
}

KvCacheOptions KvCacheFlags::ToOptions() const {
  KvCacheOptions kv{.block_size = static_cast<int32_t>(block_size),
                    .kv_cache_bytes = kv_cache_bytes,
                    .cpu_offload_bytes = cpu_offload_bytes,
                    .gpu_memory_utilization = gpu_memory_utilization,
                    .prefix_caching = prefix_caching,
                    .checksum = checksum};
  if (kv_cache_dtype != "auto") {
    kv.dtype = ParseKvCacheDType(kv_cache_dtype).value_or(kDefaultCpuKvDType);
  }
  return kv;
}

void BatchLimitFlags::Register(FlagSet& flags) {
  flags.Add("max-batched-tokens", &max_batched_tokens,
            "tokens per step; longer prompts prefill in chunks");
  flags.Add("max-seqs", &max_seqs, "sequences running at once");
  flags.Add("max-queued", &max_queued,
            "requests waiting for admission; beyond it new ones are "
            "refused (RESOURCE_EXHAUSTED)");
}

// The ranges are BatchLimits::Validate's; here only values that would
// wrap in its int32 fields.
std::string BatchLimitFlags::Problem() const {
  for (const auto& [flag, value] :
       {std::pair{"--max-batched-tokens", max_batched_tokens},
        {"--max-seqs", max_seqs},
        {"--max-queued", max_queued}}) {
    if (value < std::numeric_limits<int32_t>::min() ||
        value > std::numeric_limits<int32_t>::max()) {
      return absl::StrCat(flag, " ", value, " is out of range");
    }
  }
  const absl::Status s = ToLimits().Validate();
  return s.ok() ? "" : std::string(s.message());
}

BatchLimits BatchLimitFlags::ToLimits() const {
  return {.max_batched_tokens = static_cast<int32_t>(max_batched_tokens),
          .max_seqs = static_cast<int32_t>(max_seqs),
          .max_queued = static_cast<int32_t>(max_queued)};
}

}  // namespace shardlm
