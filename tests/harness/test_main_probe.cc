// A probe for tests/harness/check_skip_semantics.py, never registered as a
// test of its own: one case that passes, one that fails, one that skips,
// picked by --gtest_filter, on the shared test main (testing/test_main.cc).
#include "gtest/gtest.h"

namespace {

TEST(Probe, Passes) { EXPECT_EQ(1 + 1, 2); }

TEST(Probe, Fails) { ADD_FAILURE() << "the probe's deliberate failure"; }

TEST(Probe, Skips) { GTEST_SKIP() << "the probe's deliberate skip"; }

}  // namespace
