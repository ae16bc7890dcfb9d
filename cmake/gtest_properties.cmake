# How ctest reads a GoogleTest binary built on testing/test_main.cc, whose
# main exits 0 (all ran and passed), 77 (some case skipped, none failed)
# or non-zero otherwise (a failed case, a sanitizer report, a crash): 77 is
# ctest's "skipped" and every other non-zero exit "failed", so a skipped
# case never hides a failed one. (A SKIP_REGULAR_EXPRESSION on gtest's
# "[  SKIPPED ]" would: ctest applies it before the exit code.)
# Used by shardlm_test() and by tests/harness/check_skip_semantics.py, which
# proves on a probe binary that a failed-and-skipped run fails ctest.
function(shardlm_gtest_properties NAME LABELS)
  set_tests_properties(${NAME} PROPERTIES LABELS "${LABELS}"
    SKIP_RETURN_CODE 77)
endfunction()
