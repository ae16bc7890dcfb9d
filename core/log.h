// Log lines from the libraries: one line on stderr, "[shardlm] " and the
// printf-style message, written with one call so that lines from several
// threads (ranks on threads, the scheduler, gRPC handlers) never
// interleave. Executables that print their own output (a command's result,
// a test's report) keep writing it themselves.
#ifndef SHARDLM_CORE_LOG_H_
#define SHARDLM_CORE_LOG_H_

#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace shardlm {

// Writes "[shardlm] <message>\n" to stderr in one write.
void LogLine(absl::string_view message);

template <typename... Args>
void Log(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(absl::StrFormat(format, args...));
}

}  // namespace shardlm

#endif  // SHARDLM_CORE_LOG_H_
