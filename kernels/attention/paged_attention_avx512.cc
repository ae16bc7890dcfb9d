// The CPU paged attention on AVX-512 (F, BW, VL; with AVX2, FMA and F16C):
// 16-float vectors, f16 and int8 blocks widened by AVX-512 conversions.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/half.h"
#include "kernels/attention/paged_attention_kernels.h"

#define SHARDLM_ATTN_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define SHARDLM_ATTN_LANES 16
#define SHARDLM_ATTN_AVX512

namespace shardlm::attention_kernels {
namespace {

#include "kernels/attention/paged_attention_kernels.inc"

}  // namespace

Kernels Avx512() { return MakeKernels(); }

}  // namespace shardlm::attention_kernels
