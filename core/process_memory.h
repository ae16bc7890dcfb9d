// This process's memory as the kernel accounts it, for metrics: resident
// bytes, and the limit of its cgroup (what the OOM killer enforces in a
// container).
#ifndef SHARDLM_CORE_PROCESS_MEMORY_H_
#define SHARDLM_CORE_PROCESS_MEMORY_H_

#include <cstdint>
#include <optional>

namespace shardlm {

// Resident set size (/proc/self/statm); 0 where it cannot be read.
int64_t ResidentMemoryBytes();

// cgroup v2 memory.max of this process's group (v1 memory.limit_in_bytes
// as a fallback); nullopt when unlimited or not visible.
std::optional<int64_t> CgroupMemoryLimitBytes();

}  // namespace shardlm

#endif  // SHARDLM_CORE_PROCESS_MEMORY_H_
