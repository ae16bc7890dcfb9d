// GEMV micro-benchmark (issue #11 part 5): Linear with a few rows of x (a
// decode step of one or more sequences) over weights in each GGUF block
// format, per decode kernel (ISA path) and thread count.
//
//   gemv_bench [--shapes 576x1536,1536x576,576x49152,4096x4096]
//              [--rows 1] [--threads 1,2] [--formats Q4_0,Q4_1,Q8_0]
//              [--seconds 0.3] [--json FILE]
//
// A shape is IN x OUT (columns x rows of w); --rows lists the rows of x
// (tokens of the step). For each, it reports the weight bytes read per
// call over the best call time (GB/s), the same as a fraction of the read
// bandwidth measured in the same run with the same threads, and the
// multiply-adds per second (all rows). Every kernel's output is checked
// against the portable kernel's (the reference of the kernel tests); a
// mismatch beyond f32 summation-order rounding exits 1.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/dtype.h"
#include "core/half.h"
#include "core/tensor.h"
#include "kernels/blas_cpu.h"
#include "kernels/cpu_isa.h"
#include "kernels/linear/linear.h"
#include "kernels/threading.h"
#include "launch/flags.h"
#include "nlohmann/json.hpp"
#include "testing/random_tensors.h"

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

// The best time of `run` over at least 3 calls and `seconds` in all.
template <typename Run>
double BestSeconds(double seconds, Run run) {
  double best = 1e30, spent = 0;
  for (int calls = 0; spent < seconds || calls < 3; ++calls) {
    const auto t0 = Clock::now();
    run();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, s);
    spent += s;
  }
  return best;
}

// y = x w^T with f32 w through OpenBLAS, as Linear did before f32 weights
// took the row dot products: output columns split over the OpenMP team in
// tiles of 16, GEMV for one row of x, GEMM for more.
void BlasLinear(const Tensor& x, const Tensor& w, Tensor& y) {
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t tiles = (out + 15) / 16;
    const int64_t begin = std::min(out, tiles * t / nt * 16);
    const int64_t end = std::min(out, tiles * (t + 1) / nt * 16);
    if (end > begin && n == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, end - begin, in, 1.0f,
                  wp + begin * in, in, xp, 1, 0.0f, yp + begin, 1);
    } else if (end > begin) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, end - begin, in,
                  1.0f, xp, in, wp + begin * in, in, 0.0f, yp + begin, out);
    }
  }
}

// Best-of-5 read bandwidth (bytes/s) over a 256 MiB buffer.
double ReadBandwidth() {
  const int64_t n = int64_t{64} << 20;
  std::vector<float> storage(n);
  float* buf = storage.data();
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(i & 7);
  double best = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    float total = 0;
#pragma omp parallel for simd reduction(+ : total)
    for (int64_t i = 0; i < n; ++i) total += buf[i];
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    sink = sink + total;
    best = std::max(best, n * 4.0 / s);
  }
  return best;
}

struct Shape {
  int64_t in, out;
};

// Every shape with every row count, shape by shape.
std::vector<std::pair<Shape, int64_t>> ShapesByRows(
    const std::vector<Shape>& shapes, const std::vector<int>& rows) {
  std::vector<std::pair<Shape, int64_t>> out;
  for (const Shape& sh : shapes) {
    for (int r : rows) out.emplace_back(sh, r);
  }
  return out;
}

int Main(int argc, char** argv) {
  std::string shapes_arg = "576x1536,1536x576,576x49152,4096x4096";
  std::string rows_arg = "1";
  std::string threads_arg = "1,2", formats_arg = "Q4_0,Q4_1,Q8_0", json_path;
  double seconds = 0.3;
  FlagSet flags("usage: gemv_bench [flags]");
  flags.Add("shapes", &shapes_arg, "comma-separated INxOUT weight shapes");
  flags.Add("rows", &rows_arg, "comma-separated rows of x (tokens a step)");
  flags.Add("threads", &threads_arg, "comma-separated thread counts");
  flags.Add("formats", &formats_arg, "comma-separated block formats");
  flags.Add("seconds", &seconds, "time spent per measurement");
  flags.Add("json", &json_path, "also write results here");
  if (absl::Status s = flags.Parse(argc, argv, 1); !s.ok() || seconds <= 0) {
    std::fprintf(stderr, "%s\n%s", std::string(s.message()).c_str(),
                 flags.Usage().c_str());
    return 2;
  }
  std::vector<Shape> shapes;
  for (absl::string_view s : absl::StrSplit(shapes_arg, ',')) {
    std::vector<std::string> p = absl::StrSplit(s, 'x');
    Shape sh{};
    if (p.size() != 2 || !absl::SimpleAtoi(p[0], &sh.in) ||
        !absl::SimpleAtoi(p[1], &sh.out) || sh.in < 32 || sh.in % 32 != 0 ||
        sh.out < 1) {
      std::fprintf(stderr,
                   "--shapes: '%s' is not INxOUT with IN a positive multiple "
                   "of 32\n",
                   std::string(s).c_str());
      return 2;
    }
    shapes.push_back(sh);
  }
  std::vector<int> threads, row_counts;
  for (auto [arg, name, out] : {std::tuple{&threads_arg, "--threads", &threads},
                                std::tuple{&rows_arg, "--rows", &row_counts}}) {
    for (absl::string_view s : absl::StrSplit(*arg, ',')) {
      int v = 0;
      if (!absl::SimpleAtoi(s, &v) || v < 1 || v > 4096) {
        std::fprintf(stderr, "%s: '%s' is not a count from 1 to 4096\n", name,
                     std::string(s).c_str());
        return 2;
      }
      out->push_back(v);
    }
  }
  std::vector<DType> formats;
  for (absl::string_view s : absl::StrSplit(formats_arg, ',')) {
    bool found = false;
    for (int t = 0; t <= static_cast<int>(DType::kMXFP4); ++t) {
      if ((IsQuantized(DType(t)) || DType(t) == DType::kF32) &&
          s == DTypeName(DType(t))) {
        formats.push_back(DType(t));
        found = true;
      }
    }
    if (!found) {
      std::fprintf(stderr,
                   "--formats: '%s' is neither F32 nor a GGUF block format\n",
                   std::string(s).c_str());
      return 2;
    }
  }
  for (const Shape& sh : shapes) {
    for (DType f : formats) {
      if (sh.in % BlockElems(f) != 0) {
        std::fprintf(stderr, "--shapes: IN %lld is not whole %s blocks\n",
                     static_cast<long long>(sh.in), DTypeName(f));
        return 2;
      }
    }
  }
  // The kernels this process can run, the reference first; the others
  // are named, not dropped without a word.
  std::vector<CpuIsa> kernels;
  for (CpuIsa k : kAllCpuIsas) {
    if (CpuIsaSupported(k)) {
      kernels.push_back(k);
    } else {
      std::printf("kernel %s not measured: %s\n", CpuIsaName(k),
                  CpuIsaUnsupportedReason(k));
    }
  }

  std::mt19937 rng(7);
  nlohmann::json results = nlohmann::json::array();
  bool wrong = false;
  std::printf("%-6s %-12s %5s %-9s %7s %10s %10s %9s %10s\n", "format", "shape",
              "rows", "kernel", "threads", "us/call", "GB/s", "of read",
              "GMAC/s");
  for (int t : threads) {
    SetCpuThreads(t);  // OpenMP team of t; BLAS single-threaded inside it.
    const double bandwidth = ReadBandwidth();
    std::printf("read bandwidth at %d threads: %.1f GB/s\n", t,
                bandwidth / 1e9);
    for (DType format : formats) {
      for (const auto& [sh, rows] : ShapesByRows(shapes, row_counts)) {
        Tensor w =
            format == DType::kF32
                ? testing_util::RandomTensor({sh.out, sh.in}, rng())
                : testing_util::RandomQuantized(format, sh.out, sh.in, rng());
        Tensor x = *Tensor::Host(DType::kF32, {rows, sh.in});
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (float& v : x.f32()) v = normal(rng);
        Tensor y = *Tensor::Host(DType::kF32, {rows, sh.out});
        std::vector<float> want;
        const double weight_bytes = static_cast<double>(w.bytes());
        // The largest |weight|, for the comparison's bound.
        double wmax = 0;
        {
          std::vector<float> wf(w.numel());
          if (format == DType::kF32) {
            std::copy(w.f32().begin(), w.f32().end(), wf.begin());
          } else {
            Traits(format).to_f32(static_cast<const uint8_t*>(w.raw()),
                                  w.numel() / BlockElems(format), wf.data());
          }
          for (float v : wf) wmax = std::max(wmax, double{std::abs(v)});
        }
        for (CpuIsa k : kernels) {
          SetCpuIsa(k);
          if (absl::Status s = Linear(x, w, y); !s.ok()) {
            std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
            return 1;
          }
          if (k == CpuIsa::kPortable) {
            want.assign(y.f32().begin(), y.f32().end());
          } else {
            // Summation order differs between kernels: within f32 rounding
            // of the sum of |terms| (bounded by |x|_1 * max |w|).
            for (int64_t r = 0; r < rows && !wrong; ++r) {
              double x1 = 0;
              for (int64_t i = 0; i < sh.in; ++i) {
                x1 += std::abs(x.f32()[r * sh.in + i]);
              }
              const double bound = 1e-5 * x1 * wmax + 1e-6;
              for (int64_t o = r * sh.out; o < (r + 1) * sh.out; ++o) {
                if (!(std::abs(double{y.f32()[o]} - want[o]) <= bound)) {
                  std::fprintf(stderr,
                               "%s %s %lldx%lld x row %lld, w row %lld: %g, "
                               "portable %g\n",
                               DTypeName(format), CpuIsaName(ActiveCpuIsa()),
                               static_cast<long long>(sh.in),
                               static_cast<long long>(sh.out),
                               static_cast<long long>(r),
                               static_cast<long long>(o - r * sh.out),
                               y.f32()[o], want[o]);
                  wrong = true;
                  break;
                }
              }
            }
          }
          const double best =
              BestSeconds(seconds, [&] { (void)Linear(x, w, y); });
          const double gbps = weight_bytes / best / 1e9;
          const double gmacs =
              static_cast<double>(rows) * sh.in * sh.out / best / 1e9;
          char shape[32];
          std::snprintf(shape, sizeof(shape), "%lldx%lld",
                        static_cast<long long>(sh.in),
                        static_cast<long long>(sh.out));
          std::printf(
              "%-6s %-12s %5lld %-9s %7d %10.1f %10.2f %8.0f%% %10.2f\n",
              DTypeName(format), shape, static_cast<long long>(rows),
              CpuIsaName(ActiveCpuIsa()), t, best * 1e6, gbps,
              100 * gbps * 1e9 / bandwidth, gmacs);
          results.push_back({{"format", DTypeName(format)},
                             {"in", sh.in},
                             {"out", sh.out},
                             {"rows", rows},
                             {"kernel", CpuIsaName(ActiveCpuIsa())},
                             {"threads", t},
                             {"us_per_call", best * 1e6},
                             {"weight_gbps", gbps},
                             {"read_gbps", bandwidth / 1e9},
                             {"gmac_per_s", gmacs}});
        }
        // F32: also OpenBLAS as Linear ran it before its row dot products
        // (columns split over the team, GEMV for one row, else GEMM).
        if (format == DType::kF32) {
          const double best =
              BestSeconds(seconds, [&] { BlasLinear(x, w, y); });
          const double gbps = weight_bytes / best / 1e9;
          std::printf(
              "%-6s %5lldx%-6lld %5lld %-9s %7d %10.1f %10.2f %8.0f%% "
              "%10.2f\n",
              "F32", static_cast<long long>(sh.in),
              static_cast<long long>(sh.out), static_cast<long long>(rows),
              "openblas", t, best * 1e6, gbps, 100 * gbps * 1e9 / bandwidth,
              static_cast<double>(rows) * sh.in * sh.out / best / 1e9);
        }
      }
    }
  }
  SetCpuIsa(CpuIsa::kAuto);
  std::printf(
      "(GB/s: quantized weight bytes per call / best call time; of read: "
      "that over the read bandwidth measured with the same threads)\n");
  if (!json_path.empty()) std::ofstream(json_path) << results.dump(2) << "\n";
  if (wrong) {
    std::fprintf(stderr, "FAILED: a kernel disagrees with the portable one\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) {
  shardlm::RerunWithBetterBlasCoreType(argv);
  return shardlm::Main(argc, argv);
}
