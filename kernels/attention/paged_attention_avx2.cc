// The CPU paged attention on AVX2 + FMA + F16C: 8-float vectors, f16 and
// int8 blocks widened by AVX2 and F16C conversions. Compiled with
// -mno-avx512f (kernels/CMakeLists.txt), so that in a -march=native build
// on an AVX-512 machine it is still the code an AVX2 CPU runs.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/half.h"
#include "kernels/attention/paged_attention_kernels.h"

#define SHARDLM_ATTN_TARGET __attribute__((target("avx2,fma,f16c")))
#define SHARDLM_ATTN_LANES 8
#define SHARDLM_ATTN_AVX2

namespace shardlm::attention_kernels {
namespace {

#include "kernels/attention/paged_attention_kernels.inc"

}  // namespace

Kernels Avx2() { return MakeKernels(); }

}  // namespace shardlm::attention_kernels
