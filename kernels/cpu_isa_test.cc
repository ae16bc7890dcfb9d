#include "kernels/cpu_isa.h"

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

}  // namespace
}  // namespace shardlm
