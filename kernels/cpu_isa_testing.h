// Test-only: running a kernel test once per dispatch target (issue #41),
// so that the AVX2 and portable code is tested on an AVX-512 machine too.
// Header-only, for the kernel tests' binary.
#ifndef SHARDLM_KERNELS_CPU_ISA_TESTING_H_
#define SHARDLM_KERNELS_CPU_ISA_TESTING_H_

#include "gtest/gtest.h"
#include "kernels/cpu_isa.h"

namespace shardlm {

// Every ISA's kernels (kernels/cpu_isa.h); a test skips, saying so, those
// this CPU cannot run.
inline constexpr CpuIsa kTestIsas[] = {CpuIsa::kPortable, CpuIsa::kAvx2,
                                       CpuIsa::kAvx512};

// A fixture mix-in: Use(isa) runs the test body on that ISA's kernels (or
// skips it), and the destructor goes back to the CPU's choice.
class OnCpuIsa {
 protected:
  void Use(CpuIsa isa) {
    if (!CpuIsaSupported(isa)) {
      GTEST_SKIP() << "this CPU cannot run " << CpuIsaName(isa);
    }
    SetCpuIsa(isa);
  }
  ~OnCpuIsa() { SetCpuIsa(CpuIsa::kAuto); }
};

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_CPU_ISA_TESTING_H_
