#include "core/log.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace shardlm {

void LogLine(absl::string_view message) {
  std::string line = absl::StrCat("[shardlm] ", message);
  if (line.empty() || line.back() != '\n') line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace shardlm
