// Test-only: running a kernel test once per dispatch target (issue #41),
// so that the AVX2 and portable code is tested on an AVX-512 machine too.
// Header-only, for the kernel tests' binary.
#ifndef SHARDLM_KERNELS_CPU_ISA_TESTING_H_
#define SHARDLM_KERNELS_CPU_ISA_TESTING_H_

#include <cstdio>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_isa.h"

namespace shardlm {

// The ISAs this process runs (kernels/cpu_isa.h), the portable reference
// first: tests are instantiated for these only, so that a CPU without
// AVX-512 (or SHARDLM_CPU_ISA=avx2) runs every case it can and skips none.
// The first call says once, on one line that scripts/ctest_gate.py shows
// after the phase, which ISAs were left out and why.
inline const std::vector<CpuIsa>& TestIsas() {
  static const std::vector<CpuIsa> isas = [] {
    std::vector<CpuIsa> run;
    for (CpuIsa isa : kAllCpuIsas) {
      if (CpuIsaSupported(isa)) {
        run.push_back(isa);
      } else {
        std::printf("[gate note] CPU kernels not tested here: %s (%s)\n",
                    CpuIsaName(isa), CpuIsaUnsupportedReason(isa));
      }
    }
    std::fflush(stdout);
    return run;
  }();
  return isas;
}

// A fixture mix-in: Use(isa) runs the test body on that ISA's kernels, and
// the destructor goes back to the process's choice. `isa` comes from
// TestIsas().
class OnCpuIsa {
 protected:
  void Use(CpuIsa isa) {
    ASSERT_TRUE(CpuIsaSupported(isa)) << CpuIsaName(isa);
    SetCpuIsa(isa);
  }
  ~OnCpuIsa() { SetCpuIsa(CpuIsa::kAuto); }
};

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_CPU_ISA_TESTING_H_
