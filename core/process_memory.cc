#include "core/process_memory.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shardlm {

int64_t ResidentMemoryBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  if (!(in >> pages >> resident)) return 0;
  return resident * sysconf(_SC_PAGESIZE);
}

std::optional<int64_t> CgroupMemoryLimitBytes() {
  // /proc/self/cgroup names this process's group: "0::/path" under cgroup
  // v2, "N:memory:/path" for v1's memory controller (inside a container
  // usually "/", the container's own group).
  std::string v2, v1;
  bool has_v2 = false, has_v1 = false;
  {
    std::ifstream in("/proc/self/cgroup");
    std::string line;
    while (std::getline(in, line)) {
      if (absl::StartsWith(line, "0::")) {
        v2 = line.substr(3);
        has_v2 = true;
      } else if (const size_t at = line.find(":memory:");
                 at != std::string::npos) {
        v1 = line.substr(at + 8);
        has_v1 = true;
      }
    }
  }
  const auto under = [](const std::string& root, const std::string& path) {
    return path.empty() || path == "/" ? root : absl::StrCat(root, path);
  };
  std::vector<std::string> files;
  if (has_v1) {
    files.push_back(under("/sys/fs/cgroup/memory", v1) +
                    "/memory.limit_in_bytes");
  }
  if (has_v2) files.push_back(under("/sys/fs/cgroup", v2) + "/memory.max");
  for (const std::string& file : files) {
    std::ifstream in(file);
    std::string text;
    if (!(in >> text)) continue;
    int64_t limit = 0;
    // "max" (v2) or a number near 2^63 (v1) means no limit.
    if (text == "max" || !absl::SimpleAtoi(text, &limit) ||
        limit >= (int64_t{1} << 60)) {
      return std::nullopt;
    }
    return limit;
  }
  return std::nullopt;
}

}  // namespace shardlm
