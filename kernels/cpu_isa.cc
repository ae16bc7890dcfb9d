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

// What the hardware has, whatever SHARDLM_CPU_ISA says. __builtin_cpu_init
// first: tests may ask in static initializers (their parameter lists),
// before libgcc's constructor has read the features.
bool HardwareHasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           HasF16c();
  }();
  return has;
}

bool HardwareHasAvx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return HardwareHasAvx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return has;
}

// The ISAs nest: each runs the code of those ranked below it.
int Rank(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return 2;
    case CpuIsa::kAvx2:
      return 1;
    default:
      return 0;
  }
}

bool HardwareHas(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return HardwareHasAvx512();
    case CpuIsa::kAvx2:
      return HardwareHasAvx2();
    default:
      return true;
  }
}

CpuIsa HardwareBest() {
  return HardwareHasAvx512() ? CpuIsa::kAvx512
         : HardwareHasAvx2() ? CpuIsa::kAvx2
                             : CpuIsa::kPortable;
}

// The highest ISA the process may use: the hardware's best, or the lower
// one SHARDLM_CPU_ISA names (see cpu_isa.h). Read, and any mistake in it
// said, once.
CpuIsa Cap() {
  static const CpuIsa cap = [] {
    const CpuIsa best = HardwareBest();
    const char* env = std::getenv("SHARDLM_CPU_ISA");
    if (env == nullptr || *env == '\0') return best;
    const std::string_view name(env);
    CpuIsa asked;
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
    if (!HardwareHas(asked)) {
      Log("SHARDLM_CPU_ISA=%s: this CPU cannot run it; "
          "using the CPU's best",
          env);
      return best;
    }
    return asked;
  }();
  return cap;
}

}  // namespace

void SetCpuIsa(CpuIsa isa) { g_isa = isa; }

bool CpuIsaSupported(CpuIsa isa) {
  return HardwareHas(isa) && Rank(isa) <= Rank(Cap());
}

const char* CpuIsaUnsupportedReason(CpuIsa isa) {
  if (!HardwareHas(isa)) return "this CPU lacks it";
  if (Rank(isa) > Rank(Cap()))
    return "SHARDLM_CPU_ISA caps the process below it";
  return "";
}

CpuIsa ActiveCpuIsa() {
  if (g_isa != CpuIsa::kAuto) return g_isa;
  return Cap();
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
