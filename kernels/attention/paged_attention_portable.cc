// The CPU paged attention in plain C++ (the reference of the other ISAs):
// 8-float vectors of the GCC/Clang vector extensions, compiled for the
// build's -march like the rest of the library.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/half.h"
#include "kernels/attention/paged_attention_kernels.h"

#define SHARDLM_ATTN_TARGET
#define SHARDLM_ATTN_LANES 8

namespace shardlm::attention_kernels {
namespace {

#include "kernels/attention/paged_attention_kernels.inc"

}  // namespace

Kernels Portable() { return MakeKernels(); }

}  // namespace shardlm::attention_kernels
