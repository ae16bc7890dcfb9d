// CRC-32C (Castagnoli), as iSCSI, ext4 and gRPC use it: a checksum of KV
// blocks copied between tiers (worker/kv_pool.h). SSE 4.2's crc32
// instruction where the CPU has it (several GB/s per core), else a table.
#ifndef SHARDLM_CORE_CRC32C_H_
#define SHARDLM_CORE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace shardlm {

// The CRC-32C of `n` bytes, continuing `crc` (the value returned for the
// bytes before them; 0 to start): Crc32c(b, n2, Crc32c(a, n1)) is the CRC
// of a followed by b.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);
// The same without the crc32 instruction (what CPUs without SSE 4.2 run;
// for tests).
uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc = 0);

}  // namespace shardlm

#endif  // SHARDLM_CORE_CRC32C_H_
