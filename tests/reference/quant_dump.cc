// What shardlm computes from raw GGUF blocks, for check_quant_formats.py:
//   quant_dump --type Q4_K --rows R --cols C --blocks FILE --x FILE
//              [--n N] [--cols-slice c0,c1]
// FILE of --blocks holds R rows of C values of the type, as a GGUF tensor
// stores them; --x holds N x (slice width) f32 activations. Writes one JSON
// object to stdout:
//   {"dequant": [R * C floats (the reference decoder)],
//    "linear": {"portable": [N * R], "avx2": [...], "avx512": [...]}}
// "linear" is Linear(x, w) with w the blocks of the column slice
// [c0, c1) (the whole row without --cols-slice) kept in their format, for
// every decode kernel this CPU runs; N > 16 takes the tiled prefill path.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/dtype.h"
#include "kernels/cpu_isa.h"
#include "kernels/linear/linear.h"
#include "model/dequantize.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "quant_dump: %s\n", msg.c_str());
  return 2;
}

bool ReadFile(const std::string& path, std::vector<uint8_t>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), {});
  return true;
}

int Main(int argc, char** argv) {
  std::string type, blocks_path, x_path;
  int64_t rows = 0, cols = 0, n = 1, c0 = 0, c1 = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    bool ok = true;
    if (flag == "--type") {
      type = value;
    } else if (flag == "--rows") {
      ok = absl::SimpleAtoi(value, &rows);
    } else if (flag == "--cols") {
      ok = absl::SimpleAtoi(value, &cols);
    } else if (flag == "--n") {
      ok = absl::SimpleAtoi(value, &n);
    } else if (flag == "--blocks") {
      blocks_path = value;
    } else if (flag == "--x") {
      x_path = value;
    } else if (flag == "--cols-slice") {
      const std::vector<std::string> parts = absl::StrSplit(value, ',');
      ok = parts.size() == 2 && absl::SimpleAtoi(parts[0], &c0) &&
           absl::SimpleAtoi(parts[1], &c1);
    } else {
      return Fail("unknown flag " + flag);
    }
    if (!ok) return Fail("bad " + flag);
  }
  if (c1 < 0) c1 = cols;
  DType dtype = DType::kF32;
  bool found = false;
  for (int t = 0; t <= static_cast<int>(DType::kMXFP4); ++t) {
    if (type == DTypeName(static_cast<DType>(t))) {
      dtype = static_cast<DType>(t);
      found = true;
    }
  }
  if (!found || rows <= 0 || cols <= 0 || n <= 0) {
    return Fail(
        "usage: quant_dump --type T --rows R --cols C --blocks F --x F");
  }
  std::vector<uint8_t> blocks, xbytes;
  if (!ReadFile(blocks_path, &blocks) || !ReadFile(x_path, &xbytes)) {
    return Fail("cannot read --blocks or --x");
  }
  const TensorInfo info{.name = "w",
                        .dtype = dtype,
                        .shape = {rows, cols},
                        .bytes = blocks.size()};
  auto dequant = DequantizeRows(info, blocks, 0, rows);
  if (!dequant.ok()) return Fail(std::string(dequant.status().message()));
  auto w = CopySlice(info, blocks, 0, rows, c0, c1);
  if (!w.ok()) return Fail(std::string(w.status().message()));
  const int64_t width = c1 - c0;
  if (xbytes.size() != static_cast<size_t>(n * width) * sizeof(float)) {
    return Fail("--x must hold n x slice-width f32 values");
  }
  auto x = Tensor::Host(DType::kF32, {n, width});
  if (!x.ok()) return Fail(std::string(x.status().message()));
  std::memcpy(x->raw(), xbytes.data(), xbytes.size());

  nlohmann::json out;
  out["dequant"] =
      std::vector<float>(dequant->f32().begin(), dequant->f32().end());
  // Every kernel this process runs (check_quant_formats.py requires the
  // ones this CPU has, so a kernel left out here fails there).
  for (CpuIsa kernel : kAllCpuIsas) {
    if (!CpuIsaSupported(kernel)) continue;
    const char* name = CpuIsaName(kernel);
    SetCpuIsa(kernel);
    auto y = Tensor::Host(DType::kF32, {n, rows});
    if (!y.ok()) return Fail(std::string(y.status().message()));
    if (absl::Status s = Linear(*x, *w, *y); !s.ok()) {
      return Fail(std::string(s.message()));
    }
    out["linear"][name] = std::vector<float>(y->f32().begin(), y->f32().end());
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) { return shardlm::Main(argc, argv); }
