// main() of every unit test (shardlm_test in CMakeLists.txt): the tests run
// on the OpenBLAS kernels the binaries run (kernels/blas_cpu.h), so that
// they see the same numerics and speed.
#include "gtest/gtest.h"
#include "kernels/blas_cpu.h"

int main(int argc, char** argv) {
  shardlm::RerunWithBetterBlasCoreType(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
