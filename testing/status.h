// For tests: a rejection asserted by its code and a phrase of its message,
// so that a test cannot pass on the wrong error (any !ok() would).
//   EXPECT_TRUE(IsError(s, absl::StatusCode::kInvalidArgument, "n_layers"));
#ifndef SHARDLM_TESTING_STATUS_H_
#define SHARDLM_TESTING_STATUS_H_

#include <utility>

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

// Asserts that a Status is OK (printing it when not).
#define ASSERT_OK(expr)                                   \
  do {                                                    \
    const ::absl::Status shardlm_status_ = (expr);        \
    ASSERT_TRUE(shardlm_status_.ok()) << shardlm_status_; \
  } while (false)

// `ASSERT_OK_AND_ASSIGN(auto x, MakeX());`: asserts that the StatusOr is OK
// and declares (or assigns) `x` from its value.
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  SHARDLM_ASSERT_OK_AND_ASSIGN_IMPL_(   \
      SHARDLM_TEST_CONCAT_(shardlm_statusor_, __LINE__), lhs, expr)
#define SHARDLM_TEST_CONCAT_INNER_(a, b) a##b
#define SHARDLM_TEST_CONCAT_(a, b) SHARDLM_TEST_CONCAT_INNER_(a, b)
#define SHARDLM_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                       \
  ASSERT_TRUE(tmp.ok()) << tmp.status();                   \
  lhs = std::move(*tmp)

#endif  // SHARDLM_TESTING_STATUS_H_
