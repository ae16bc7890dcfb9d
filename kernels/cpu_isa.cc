#include "kernels/cpu_isa.h"

#include <cpuid.h>

#include <cstdlib>
#include <string_view>

#include "core/log.h"

namespace shardlm {
namespace {

CpuIsa g_isa = CpuIsa::kAuto;

// F16C from CPUID leaf 1 (ECX bit 29): clang 14 knows no "f16c" for
// __builtin_cpu_supports.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

// __builtin_cpu_init first: tests may ask in static initializers (their
// parameter lists), before libgcc's constructor has read the features.
bool HasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           HasF16c();
  }();
  return has;
}

bool HasAvx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return HasAvx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return has;
}

// The CPU's best ISA, or the one SHARDLM_CPU_ISA names (see cpu_isa.h).
CpuIsa FromEnvironment() {
  const CpuIsa best = HasAvx512() ? CpuIsa::kAvx512
                      : HasAvx2() ? CpuIsa::kAvx2
                                  : CpuIsa::kPortable;
  const char* env = std::getenv("SHARDLM_CPU_ISA");
  if (env == nullptr || *env == '\0') return best;
  const std::string_view name(env);
  CpuIsa asked = best;
  if (name == "avx512") {
    asked = CpuIsa::kAvx512;
  } else if (name == "avx2") {
    asked = CpuIsa::kAvx2;
  } else if (name == "portable") {
    asked = CpuIsa::kPortable;
  } else {
    Log("SHARDLM_CPU_ISA=%s is not avx512, avx2 or "
        "portable; using the CPU's best",
        env);
    return best;
  }
  if (!CpuIsaSupported(asked)) {
    Log("SHARDLM_CPU_ISA=%s: this CPU cannot run it; "
        "using the CPU's best",
        env);
    return best;
  }
  return asked;
}

}  // namespace

void SetCpuIsa(CpuIsa isa) { g_isa = isa; }

bool CpuIsaSupported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return HasAvx512();
    case CpuIsa::kAvx2:
      return HasAvx2();
    default:
      return true;
  }
}

CpuIsa ActiveCpuIsa() {
  if (g_isa != CpuIsa::kAuto) return g_isa;
  static const CpuIsa chosen = FromEnvironment();
  return chosen;
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kPortable:
      return "portable";
    default:
      return "auto";
  }
}

}  // namespace shardlm
