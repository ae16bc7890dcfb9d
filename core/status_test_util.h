// For tests: a rejection asserted by its code and a phrase of its message,
// so that a test cannot pass on the wrong error (any !ok() would).
//   EXPECT_TRUE(IsError(s, absl::StatusCode::kInvalidArgument, "n_layers"));
#ifndef SHARDLM_CORE_STATUS_TEST_UTIL_H_
#define SHARDLM_CORE_STATUS_TEST_UTIL_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace shardlm::testing_util {

inline ::testing::AssertionResult IsError(const absl::Status& s,
                                          absl::StatusCode code,
                                          absl::string_view phrase) {
  if (s.code() == code && s.message().find(phrase) != absl::string_view::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "got " << s << "; want " << absl::StatusCodeToString(code)
         << " with \"" << phrase << "\"";
}

template <typename T>
::testing::AssertionResult IsError(const absl::StatusOr<T>& s,
                                   absl::StatusCode code,
                                   absl::string_view phrase) {
  return IsError(s.status(), code, phrase);
}

}  // namespace shardlm::testing_util

#endif  // SHARDLM_CORE_STATUS_TEST_UTIL_H_
