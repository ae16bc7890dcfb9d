// The reduction shared by the host communicators: every rank's input,
// gathered in rank order, reduced from rank 0 upwards, so that every rank
// and every backend rounds the same way.
#ifndef SHARDLM_COLLECTIVES_REDUCE_H_
#define SHARDLM_COLLECTIVES_REDUCE_H_

#include <cstdint>

#include "collectives/communicator.h"
#include "core/dtype.h"

namespace shardlm {

// `gathered` holds `size` inputs of `numel` elements of `dtype` (F32 or
// I32), one after another; the result goes to `out` (numel elements, which
// may alias the first input).
void ReduceInRankOrder(const void* gathered, int size, DType dtype,
                       int64_t numel, ReduceOp op, void* out);

}  // namespace shardlm

#endif  // SHARDLM_COLLECTIVES_REDUCE_H_
