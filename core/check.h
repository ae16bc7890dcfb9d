// CHECK for programmer errors only (broken invariants, misuse of an API).
// Recoverable conditions (bad input, I/O, peers) return absl::Status.
#ifndef SHARDLM_CORE_CHECK_H_
#define SHARDLM_CORE_CHECK_H_

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

// SHARDLM_CHECK(n > 0, "n=", n) aborts with file, line and message.
#define SHARDLM_CHECK(cond, ...)                                               \
  do {                                                                         \
    if (!(cond)) [[unlikely]] {                                                \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s %s\n", __FILE__, __LINE__, \
                   #cond, absl::StrCat(__VA_ARGS__).c_str());                  \
      std::abort();                                                            \
    }                                                                          \
  } while (0)

#endif  // SHARDLM_CORE_CHECK_H_
