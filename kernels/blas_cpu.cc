#include "kernels/blas_cpu.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" char* openblas_get_corename(void);

namespace shardlm {

const char* BlasCoreName() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "unknown";
}

std::string BetterBlasCoreType() {
  if (std::strcmp(BlasCoreName(), "Prescott") != 0) return "";
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return "Haswell";
  }
  return "";
}

void RerunWithBetterBlasCoreType(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const std::string core = BetterBlasCoreType();
  if (core.empty()) return;
  std::fprintf(stderr,
               "%s: OpenBLAS does not know this CPU and chose its generic "
               "Prescott kernels; running again with OPENBLAS_CORETYPE=%s "
               "(set OPENBLAS_CORETYPE to choose)\n",
               argv[0], core.c_str());
  if (setenv("OPENBLAS_CORETYPE", core.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "%s: could not run again (%s); going on with Prescott\n",
               argv[0], std::strerror(errno));
  unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace shardlm
