// Batch invariance: whether a row's result depends on the other rows of
// its step. One setting per process, read by the CPU kernels whose
// arithmetic would otherwise change with the step's shape:
//   - Linear: steps of at most kDecodeMaxRows rows (linear.h) always run
//     each row through the same row dot products, whatever their number;
//     larger steps go through a BLAS GEMM, whose sums for a row depend on
//     how many rows share it (OpenBLAS's Haswell kernels) and differ from
//     the row dot products. Batch-invariant, they run the row dot
//     products too, in tiles (prefill then costs more: see
//     docs/speculative-decoding.md).
//   - PagedAttention: a context is split into parts merged afterwards
//     where the step has too few rows to keep the threads busy, so a
//     row's sums depend on its step. Batch-invariant, the parts are fixed
//     runs of blocks (kInvariantSplitBlocks), whatever the step.
// Speculative decoding needs it: a drafted token's row must get the
// logits it would get decoded alone.
#ifndef SHARDLM_KERNELS_BATCH_INVARIANCE_H_
#define SHARDLM_KERNELS_BATCH_INVARIANCE_H_

#include <cstdint>

namespace shardlm {

// Off by default. Not thread-safe against running kernels: set it before
// the first step (the engine does, from EngineOptions).
void SetBatchInvariant(bool on);
bool BatchInvariant();

// Blocks of keys per part of a context, batch-invariant.
inline constexpr int64_t kInvariantSplitBlocks = 16;

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_BATCH_INVARIANCE_H_
