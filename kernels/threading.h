// Thread count for CPU kernels (OpenMP loops and OpenBLAS).
#ifndef SHARDLM_KERNELS_THREADING_H_
#define SHARDLM_KERNELS_THREADING_H_

namespace shardlm {

// Sets the threads used by CPU kernels; n <= 0 means all cores.
void SetCpuThreads(int n);
// SetCpuThreads(n) unless this thread already did (cheap on every step).
void EnsureCpuThreads(int n);
int CpuThreads();

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_THREADING_H_
