// OPENBLAS_CORETYPE reaches OpenBLAS: a child process given a core type
// (BetterBlasCoreType()'s where OpenBLAS fell back to Prescott, else
// Haswell, which any CPU with AVX2 + FMA runs) runs those kernels.
#include "kernels/blas_cpu.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace shardlm {
namespace {

TEST(BlasCpuTest, PrintsTheChosenCore) {
  std::printf("blas core: %s\n", BlasCoreName());
}

// The tests' main() (test_main.cc) ran this process again where OpenBLAS
// had fallen back to Prescott, as the binaries' do.
TEST(BlasCpuTest, ThisProcessRunsKernelsForItsCpu) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr &&
      !BetterBlasCoreType().empty()) {
    // Only a user's own OPENBLAS_CORETYPE=Prescott gets here.
    std::printf("OPENBLAS_CORETYPE=%s was asked for\n",
                std::getenv("OPENBLAS_CORETYPE"));
    return;
  }
  EXPECT_EQ(BetterBlasCoreType(), "") << "OpenBLAS runs " << BlasCoreName();
}

TEST(BlasCpuTest, AChildGivenACoreTypeRunsIt) {
  std::string core = BetterBlasCoreType();
  if (core.empty()) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
      std::printf("no AVX2: no core type to ask for but OpenBLAS's own\n");
      return;
    }
    core = "Haswell";
  }
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  const std::string command =
      "OPENBLAS_CORETYPE=" + core + " '" + self +
      "' --gtest_filter=BlasCpuTest.PrintsTheChosenCore";
  FILE* child = popen(command.c_str(), "r");
  ASSERT_NE(child, nullptr);
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof(buf), child) != nullptr) out += buf;
  ASSERT_EQ(pclose(child), 0) << out;
  EXPECT_NE(out.find("blas core: " + core + "\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace shardlm
