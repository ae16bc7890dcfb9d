// OpenBLAS's kernels for this CPU.
#ifndef SHARDLM_KERNELS_BLAS_CPU_H_
#define SHARDLM_KERNELS_BLAS_CPU_H_

#include <string>

namespace shardlm {

// The kernels OpenBLAS chose for this process ("SkylakeX", "Prescott"...).
const char* BlasCoreName();

// The OPENBLAS_CORETYPE this process should run with, or "" when OpenBLAS
// chose well: a value only when OpenBLAS fell back to its generic
// "Prescott" (SSE3) kernels, which it does for CPUs it does not know
// (Debian 12's 0.3.21 on Intel's family 6 model 207, an Emerald Rapids,
// and newer), on a CPU that has AVX-512 ("SkylakeX") or AVX2 + FMA
// ("Haswell"). There the prefill GEMMs run three times slower.
std::string BetterBlasCoreType();

// When BetterBlasCoreType() names one and OPENBLAS_CORETYPE is unset,
// runs this program again (/proc/self/exe, the same argv and otherwise
// the same environment) with OPENBLAS_CORETYPE set to it, saying so on
// stderr: OpenBLAS reads it only when it loads. Call it first in main(),
// before any thread starts. Returns when there is nothing to do, or the
// exec failed (said on stderr; the run goes on with OpenBLAS's choice).
void RerunWithBetterBlasCoreType(char** argv);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_BLAS_CPU_H_
