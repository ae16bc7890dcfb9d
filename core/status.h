// Status helpers used at every module boundary. Codes map 1:1 to gRPC codes.
#ifndef SHARDLM_CORE_STATUS_H_
#define SHARDLM_CORE_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardlm {
// Debian's Abseil is built with its own absl::string_view, which StrCat
// takes but std::string_view does not convert to; this bridges the two.
inline absl::string_view Sv(std::string_view s) { return {s.data(), s.size()}; }
}  // namespace shardlm

#define SHARDLM_STATUS_CONCAT_INNER_(a, b) a##b
#define SHARDLM_STATUS_CONCAT_(a, b) SHARDLM_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` is not OK.
#define RETURN_IF_ERROR(expr)                                         \
  do {                                                                \
    if (absl::Status _shardlm_status = (expr); !_shardlm_status.ok()) \
        [[unlikely]] {                                                \
      return _shardlm_status;                                         \
    }                                                                 \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` declares (or assigns) `x` from a
// StatusOr, returning its status from the enclosing function on error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  SHARDLM_ASSIGN_OR_RETURN_IMPL_(   \
      SHARDLM_STATUS_CONCAT_(_shardlm_statusor_, __LINE__), lhs, expr)
#define SHARDLM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) [[unlikely]]                          \
    return std::move(tmp).status();                    \
  lhs = std::move(tmp).value()

#endif  // SHARDLM_CORE_STATUS_H_
