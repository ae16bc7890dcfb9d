#include "kernels/cpu_isa.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace shardlm {
namespace {

// SetCpuIsa overrides the environment's choice until kAuto restores it;
// what the CPU supports nests (AVX-512 CPUs run the AVX2 code).
TEST(CpuIsaTest, SetOverridesUntilAuto) {
  const CpuIsa chosen = ActiveCpuIsa();
  EXPECT_NE(chosen, CpuIsa::kAuto);
  EXPECT_TRUE(CpuIsaSupported(chosen));
  EXPECT_TRUE(CpuIsaSupported(CpuIsa::kPortable));
  if (CpuIsaSupported(CpuIsa::kAvx512)) {
    EXPECT_TRUE(CpuIsaSupported(CpuIsa::kAvx2));
  }
  for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (!CpuIsaSupported(isa)) continue;
    SetCpuIsa(isa);
    EXPECT_EQ(ActiveCpuIsa(), isa);
  }
  SetCpuIsa(CpuIsa::kAuto);
  EXPECT_EQ(ActiveCpuIsa(), chosen);
  EXPECT_EQ(std::string(CpuIsaName(CpuIsa::kAvx512)), "avx512");
  EXPECT_EQ(std::string(CpuIsaName(CpuIsa::kAvx2)), "avx2");
  EXPECT_EQ(std::string(CpuIsaName(CpuIsa::kPortable)), "portable");
}

// SHARDLM_CPU_ISA caps what the process believes the CPU supports, not only
// the kernels it picks (ctest's kernels_test_as_avx2_cpu runs this binary
// with SHARDLM_CPU_ISA=avx2), so that the tests that run every supported
// ISA leave out those above the cap.
TEST(CpuIsaTest, TheEnvironmentCapsWhatIsSupported) {
  const char* env = std::getenv("SHARDLM_CPU_ISA");
  const std::string cap = env != nullptr ? env : "";
  if (cap == "avx2" || cap == "portable") {
    EXPECT_FALSE(CpuIsaSupported(CpuIsa::kAvx512));
    EXPECT_NE(std::string(CpuIsaUnsupportedReason(CpuIsa::kAvx512)), "");
  }
  if (cap == "portable") {
    EXPECT_FALSE(CpuIsaSupported(CpuIsa::kAvx2));
  }
  for (CpuIsa isa : kAllCpuIsas) {
    EXPECT_EQ(CpuIsaSupported(isa),
              std::string(CpuIsaUnsupportedReason(isa)).empty())
        << CpuIsaName(isa);
  }
  // The process's choice is the best it may run.
  CpuIsa best = CpuIsa::kPortable;
  for (CpuIsa isa : kAllCpuIsas) {
    if (CpuIsaSupported(isa)) best = isa;
  }
  EXPECT_EQ(ActiveCpuIsa(), best);
  std::printf("SHARDLM_CPU_ISA=%s: the kernels run %s\n", cap.c_str(),
              CpuIsaName(best));
}

}  // namespace
}  // namespace shardlm
