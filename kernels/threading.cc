#include "kernels/threading.h"

#include <cblas.h>
#include <omp.h>

#include <thread>

namespace shardlm {

void SetCpuThreads(int n) {
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  omp_set_num_threads(n);
  // Kernels split work across the OpenMP team and call BLAS from inside it;
  // BLAS threads of its own would compete with the team for the cores.
  openblas_set_num_threads(1);
}

void EnsureCpuThreads(int n) {
  thread_local int set = 0;
  if (n > 0 && n != set) {
    SetCpuThreads(n);
    set = n;
  }
}

int CpuThreads() { return omp_get_max_threads(); }

}  // namespace shardlm
