// The CPU's model name (/proc/cpuinfo), which every benchmark's figures
// name.
#ifndef SHARDLM_BENCH_CPU_NAME_H_
#define SHARDLM_BENCH_CPU_NAME_H_

#include <fstream>
#include <string>

namespace shardlm {

inline std::string CpuName() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      return line.substr(line.find(':') + 2);
    }
  }
  return "unknown CPU";
}

}  // namespace shardlm

#endif  // SHARDLM_BENCH_CPU_NAME_H_
