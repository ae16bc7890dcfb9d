#ifndef SHARDLM_KERNELS_EMBEDDING_EMBEDDING_H_
#define SHARDLM_KERNELS_EMBEDDING_EMBEDDING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/tensor.h"

namespace shardlm {

// out[i] = table[ids[i] - vocab_begin] for ids in this shard's vocabulary
// range [vocab_begin, vocab_begin + rows), zero otherwise (so that a
// vocab-parallel embedding sums to the full one across ranks).
//   table: [rows, hidden]  out: [ids.size(), hidden]
absl::Status Embedding(const Tensor& table, absl::Span<const int32_t> ids,
                       int64_t vocab_begin, Tensor& out);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_EMBEDDING_EMBEDDING_H_
