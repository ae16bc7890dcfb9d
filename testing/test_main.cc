// main() of every unit test (shardlm_test in CMakeLists.txt): the tests run
// on the OpenBLAS kernels the binaries run (kernels/blas_cpu.h), so that
// they see the same numerics and speed.
//
// Exit status, which ctest reads (SKIP_RETURN_CODE 77): 0 when every case
// that ran passed and none skipped; 77 when none failed and at least one
// skipped (GTEST_SKIP: no GPU, say), so the binary shows as skipped and CI's
// skip gate (scripts/ctest_gate.py) sees it; 1 when any case failed or no
// case ran at all (a filter that matched nothing, cases compiled out).
// A failure always wins over a skip, so a skipped case never hides a
// failed one. Sanitizer reports exit on their own, non-zero, before this.
#include <cstdio>

#include "gtest/gtest.h"
#include "kernels/blas_cpu.h"

int main(int argc, char** argv) {
  shardlm::RerunWithBetterBlasCoreType(argv);
  testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (rc != 0 || GTEST_FLAG_GET(list_tests)) return rc;
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  if (unit.failed_test_count() > 0) return 1;
  if (unit.test_to_run_count() == 0) {
    std::fprintf(stderr, "test_main: no test case ran\n");
    return 1;
  }
  if (unit.skipped_test_count() > 0) {
    std::fprintf(stderr,
                 "test_main: %d case(s) skipped, none failed: exit 77 "
                 "(ctest: skipped)\n",
                 unit.skipped_test_count());
    return 77;
  }
  return 0;
}
