// Which vector code the CPU kernels run: one choice per process for the
// quantized GEMV (kernels/linear/quant_kernels_*.cc) and the paged
// attention (kernels/attention/paged_attention_*.cc). Each ISA's code is
// compiled for that ISA alone (per-function target attributes), whatever
// -march the build has, so that one binary runs the best code of the CPU
// it lands on: an x86-64-v3 build runs AVX-512 code on an AVX-512 CPU, and
// a -march=native build on one still runs (and tests) the AVX2 and
// portable code.
#ifndef SHARDLM_KERNELS_CPU_ISA_H_
#define SHARDLM_KERNELS_CPU_ISA_H_

namespace shardlm {

// kAvx512: AVX-512 F, BW and VL (with AVX2, FMA, F16C). kAvx2: AVX2, FMA
// and F16C. kPortable: plain C++ (the reference), compiled for the build's
// -march. kAuto: the CPU's best, or the one SHARDLM_CPU_ISA names
// (avx512, avx2, portable; a name this CPU cannot run, or an unknown one,
// is said once on stderr and the best one is used).
//
// SHARDLM_CPU_ISA is a cap, not only a choice: the process believes the
// CPU supports nothing above it (CpuIsaSupported says no, and tests that
// run every ISA leave those out), so that an AVX-512 machine runs a whole
// test suite as an AVX2-only one would (SHARDLM_CPU_ISA=avx2). Code the
// compiler generated for the build's -march (-march=native) is not
// capped: the x86-64-v3 build is the one that holds no AVX-512 at all.
enum class CpuIsa { kAuto, kPortable, kAvx2, kAvx512 };

// Every ISA, the portable reference first.
inline constexpr CpuIsa kAllCpuIsas[] = {CpuIsa::kPortable, CpuIsa::kAvx2,
                                         CpuIsa::kAvx512};

// Makes the kernels run `isa` (kAuto: back to the environment's choice),
// for tests and benchmarks that compare ISAs. Asking for one the CPU
// cannot run (CpuIsaSupported) is the caller's error. Not thread-safe:
// call it while no kernel runs.
void SetCpuIsa(CpuIsa isa);
// Whether this process can run `isa`: the CPU has it and SHARDLM_CPU_ISA
// does not cap below it (kAuto and kPortable: always).
bool CpuIsaSupported(CpuIsa isa);
// Why CpuIsaSupported(isa) is false, in words ("" when it is true).
const char* CpuIsaUnsupportedReason(CpuIsa isa);
// The ISA the kernels run now (never kAuto).
CpuIsa ActiveCpuIsa();
// "avx512", "avx2", "portable" (or "auto").
const char* CpuIsaName(CpuIsa isa);

}  // namespace shardlm

#endif  // SHARDLM_KERNELS_CPU_ISA_H_
