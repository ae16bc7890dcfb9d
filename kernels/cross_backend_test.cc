// Every op on every backend against the CPU reference kernels
// (kernels/<op>/<op>_cpu.cc), on awkward shapes: hidden 769, 9 query over
// 3 KV heads, 1 and 4097 tokens. Each op has its own error bound, stated
// where it is checked and why. Inputs that the GPU stores in bf16 (weights,
// GEMM inputs, the KV cache) are first rounded to bf16 on the host, so
// that both backends see identical values and the bound only covers
// accumulation order and the op's own output rounding.
//
// A GPU-only binary (label gpu, tests/gpu/session.sh): every case skips, with
// CUDA's reason, where no GPU is present. The launchers' argument checks,
// which need no GPU, are cuda_ops_validation_test.cc.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "core/half.h"
#include "gtest/gtest.h"
#include "kernels/add/add.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/cuda_ops.h"
#include "kernels/embedding/embedding.h"
#include "kernels/linear/linear.h"
#include "kernels/linear/quant_device_pack.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/sampling/sampling.h"
#include "kernels/ssm/gated_delta_net.h"
#include "kernels/swiglu/swiglu.h"
#include "model/dequantize.h"
#include "testing/random_tensors.h"

namespace shardlm {
namespace {

using testing_util::RandomTensor;

constexpr int64_t kHidden = 769;  // Odd on purpose.
constexpr int64_t kHeads = 9, kKvHeads = 3, kHeadDim = 64;
constexpr int64_t kTokens[] = {1, 4097};

void RoundToBf16(Tensor& t) {
  for (float& v : t.f32()) v = Bf16ToFloat(FloatToBf16(v));
}

Tensor RandomBf16(Shape shape, uint32_t seed, float scale = 1.0f) {
  Tensor t = RandomTensor(std::move(shape), seed, scale);
  RoundToBf16(t);
  return t;
}

// Every element within atol + rtol * |want|; reports the worst one.
void ExpectClose(const Tensor& got, const Tensor& want, double rtol,
                 double atol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  double worst = 0;
  int64_t at = -1;
  const auto g = got.f32(), w = want.f32();
  for (size_t i = 0; i < w.size(); ++i) {
    const double diff = std::abs(double{g[i]} - w[i]);
    // Exact equality passes even with zero bounds; NaN never does.
    const double ratio = diff == 0 ? 0 : diff / (atol + rtol * std::abs(w[i]));
    if (std::isnan(ratio) || ratio > worst) {
      worst = std::isnan(ratio) ? INFINITY : ratio;
      at = static_cast<int64_t>(i);
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << at << " got " << g[at]
                        << " want " << w[at] << " (rtol " << rtol << ", atol "
                        << atol << ")";
}

struct AttentionShape;

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto n = CudaDeviceCount();
    if (!n.ok()) GTEST_SKIP() << n.status().message();
    auto backend = NewCudaBackend(0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    auto stream = backend_->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = std::move(*stream);
    auto cublas = CublasHandle::Create(stream_->native());
    ASSERT_TRUE(cublas.ok()) << cublas.status();
    cublas_ = std::move(*cublas);
    exec_ = {.stream = stream_->native(), .cublas = cublas_.get()};
  }

  Tensor Empty(DType dtype, const Shape& shape) {
    auto t = backend_->Allocate(dtype, shape, MemoryType::kDevice);
    EXPECT_TRUE(t.ok()) << t.status();
    return *t;
  }
  // A device copy of a host f32 (or i32) tensor, converted to `dtype`.
  Tensor Dev(const Tensor& host, DType dtype) {
    Tensor staged = Empty(host.dtype(), host.shape());
    EXPECT_TRUE(backend_->Copy(host, staged).ok());
    if (dtype == host.dtype()) return staged;
    Tensor out = Empty(dtype, host.shape());
    EXPECT_TRUE(CastCuda(staged, out, exec_).ok());
    Sync();
    return out;
  }
  Tensor Dev(const Tensor& host) { return Dev(host, host.dtype()); }
  Tensor DevI32(const std::vector<int32_t>& v) {
    Tensor h = *Tensor::Host(DType::kI32, {static_cast<int64_t>(v.size())});
    std::memcpy(h.raw(), v.data(), v.size() * sizeof(int32_t));
    return Dev(h);
  }
  // A host copy of a device tensor, bf16 widened to f32.
  Tensor ToHost(const Tensor& dev) {
    Sync();
    Tensor src = dev;
    if (dev.dtype() == DType::kBF16) {
      src = Empty(DType::kF32, dev.shape());
      EXPECT_TRUE(CastCuda(dev, src, exec_).ok());
      Sync();
    }
    Tensor out = *Tensor::Host(src.dtype(), src.shape());
    EXPECT_TRUE(backend_->Copy(src, out).ok());
    return out;
  }
  void Sync() { ASSERT_TRUE(stream_->Synchronize().ok()); }
  void CheckAttention(const AttentionShape& c);

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Stream> stream_;
  CublasHandle cublas_;
  CudaExec exec_;
};

TEST_F(CudaOpsTest, Embedding) {
  // Vocab shard [100, 1100); ids outside it embed to zero. Exact: a copy.
  for (int64_t n : kTokens) {
    Tensor table = RandomBf16({1000, kHidden}, 1);
    std::vector<int32_t> ids(n);
    std::mt19937 rng(2);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % 1200);
    Tensor want = *Tensor::Host(DType::kF32, {n, kHidden});
    ASSERT_TRUE(Embedding(table, ids, 100, want).ok());
    for (DType dt : {DType::kF32, DType::kBF16}) {
      Tensor out = Empty(DType::kF32, {n, kHidden});
      ASSERT_TRUE(
          EmbeddingCuda(Dev(table, dt), DevI32(ids), 100, out, exec_).ok());
      ExpectClose(ToHost(out), want, 0, 0, "embedding n=" + std::to_string(n));
    }
  }
}

TEST_F(CudaOpsTest, RmsNorm) {
  for (int64_t n : kTokens) {
    Tensor x = RandomTensor({n, kHidden}, 3, 3.0f);
    Tensor w = RandomTensor({kHidden}, 4);
    Tensor want = *Tensor::Host(DType::kF32, {n, kHidden});
    ASSERT_TRUE(RmsNorm(x, w, 1e-5f, want).ok());
    // f32 out: the sum of squares in f32 vs double, ~1e-6 relative.
    Tensor out = Empty(DType::kF32, {n, kHidden});
    ASSERT_TRUE(RmsNormCuda(Dev(x), Dev(w), 1e-5f, out, exec_).ok());
    ExpectClose(ToHost(out), want, 1e-5, 1e-6, "rmsnorm f32");
    // bf16 out (feeds a GEMM): one bf16 rounding, 2^-9 relative.
    Tensor out16 = Empty(DType::kBF16, {n, kHidden});
    ASSERT_TRUE(RmsNormCuda(Dev(x), Dev(w), 1e-5f, out16, exec_).ok());
    ExpectClose(ToHost(out16), want, 4e-3, 1e-6, "rmsnorm bf16");
  }
}

TEST_F(CudaOpsTest, RopeBothStyles) {
  for (int64_t n : kTokens) {
    for (RopeStyle style :
         {RopeStyle::kAdjacentPairs, RopeStyle::kRotateHalf}) {
      Tensor x = RandomTensor({n, kHeads, kHeadDim}, 5);
      std::vector<int32_t> pos(n);
      std::mt19937 rng(6);
      // Contiguous positions, and large ones where float angles would fail.
      for (int64_t i = 0; i < n; ++i) {
        pos[i] = i % 2 == 0 ? static_cast<int32_t>(i)
                            : static_cast<int32_t>(rng() % 200000);
      }
      Tensor dx = Dev(x);
      // Rope is in place: rotate a host copy.
      Tensor want = *Tensor::Host(DType::kF32, x.shape());
      std::memcpy(want.raw(), x.raw(), x.bytes());
      ASSERT_TRUE(Rope(want, pos, 100000.0f, style).ok());
      ASSERT_TRUE(RopeCuda(dx, DevI32(pos), 100000.0f, style, exec_).ok());
      // Angles in double on both; cos/sin and the rotation in float.
      ExpectClose(ToHost(dx), want, 1e-5, 1e-5,
                  style == RopeStyle::kAdjacentPairs ? "rope adjacent"
                                                     : "rope rotate-half");
    }
  }
}

// RoPE scaling as the CPU applies it: the table's frequencies (linear,
// Llama 3.1, YaRN with its magnitude, GGUF frequency divisors) uploaded
// once and read by the kernel.
TEST_F(CudaOpsTest, RopeScaledTables) {
  std::vector<float> divisors(kHeadDim / 2);
  for (size_t k = 0; k < divisors.size(); ++k) divisors[k] = 1.0f + 0.25f * k;
  struct Case {
    const char* name;
    float theta;
    RopeScaling scaling;
  };
  const Case cases[] = {
      {"linear x4", 10000.0f, {.type = RopeScalingType::kLinear, .factor = 4}},
      {"llama3",
       500000.0f,
       {.type = RopeScalingType::kLlama3,
        .factor = 8,
        .original_context = 8192,
        .low_freq_factor = 1,
        .high_freq_factor = 4}},
      {"yarn",
       1000000.0f,
       {.type = RopeScalingType::kYarn,
        .factor = 4,
        .original_context = 32768}},
      {"frequency divisors", 500000.0f, {.freq_factors = divisors}},
  };
  const int64_t n = 257;
  std::vector<int32_t> pos(n);
  std::mt19937 rng(21);
  for (int64_t i = 0; i < n; ++i) {
    pos[i] = i % 2 == 0 ? static_cast<int32_t>(i)
                        : static_cast<int32_t>(rng() % 130000);
  }
  const Tensor dpos = DevI32(pos);
  for (const Case& c : cases) {
    ASSERT_TRUE(ValidateRopeScaling(c.scaling, kHeadDim).ok()) << c.name;
    for (RopeStyle style :
         {RopeStyle::kAdjacentPairs, RopeStyle::kRotateHalf}) {
      const RopeTable table =
          MakeRopeTable(style, c.theta, kHeadDim, c.scaling);
      ASSERT_FALSE(table.plain) << c.name;
      auto dtable = UploadRopeTable(table, 0);
      ASSERT_TRUE(dtable.ok()) << dtable.status();
      Tensor x = RandomTensor({n, kHeads, kHeadDim}, 22);
      Tensor dx = Dev(x);
      Tensor want = *Tensor::Host(DType::kF32, x.shape());
      std::memcpy(want.raw(), x.raw(), x.bytes());
      ASSERT_TRUE(Rope(want, pos, table).ok());
      ASSERT_TRUE(RopeCuda(dx, dpos, *dtable, exec_).ok());
      // The same double angles and scaled cos/sin on both.
      ExpectClose(ToHost(dx), want, 1e-5, 1e-5, c.name);
    }
  }
  // A table of another head size is refused before any launch.
  auto small = UploadRopeTable(
      MakeRopeTable(RopeStyle::kRotateHalf, 10000.0f, 32, {}), 0);
  ASSERT_TRUE(small.ok());
  Tensor dx = Dev(RandomTensor({n, kHeads, kHeadDim}, 23));
  EXPECT_EQ(RopeCuda(dx, dpos, *small, exec_).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaOpsTest, AddBias) {
  for (int64_t n : kTokens) {
    Tensor x = RandomTensor({n, kHidden}, 24, 3.0f);
    Tensor bias = RandomTensor({kHidden}, 25);
    Tensor dx = Dev(x);
    ASSERT_TRUE(AddBiasCuda(dx, Dev(bias), exec_).ok());
    ASSERT_TRUE(AddBias(x, bias).ok());
    ExpectClose(ToHost(dx), x, 0, 0, "bias add (exact)");
  }
}

TEST_F(CudaOpsTest, SwiGluAndAdd) {
  for (int64_t n : kTokens) {
    Tensor gate = RandomTensor({n, kHidden}, 7, 4.0f);
    Tensor up = RandomTensor({n, kHidden}, 8);
    Tensor want = *Tensor::Host(DType::kF32, {n, kHidden});
    ASSERT_TRUE(SwiGlu(gate, up, want).ok());
    Tensor out = Empty(DType::kF32, {n, kHidden});
    ASSERT_TRUE(SwiGluCuda(Dev(gate), Dev(up), out, exec_).ok());
    // expf vs std::exp: a few ulp.
    ExpectClose(ToHost(out), want, 1e-5, 1e-6, "swiglu f32");
    Tensor out16 = Empty(DType::kBF16, {n, kHidden});
    ASSERT_TRUE(SwiGluCuda(Dev(gate), Dev(up), out16, exec_).ok());
    ExpectClose(ToHost(out16), want, 4e-3, 1e-6, "swiglu bf16");

    Tensor x = Dev(gate);
    ASSERT_TRUE(AddInPlaceCuda(x, Dev(up), exec_).ok());
    Tensor sum = *Tensor::Host(DType::kF32, gate.shape());
    std::memcpy(sum.raw(), gate.raw(), gate.bytes());
    ASSERT_TRUE(AddInPlace(sum, up).ok());
    ExpectClose(ToHost(x), sum, 0, 0, "add (exact)");
  }
}

// The fused projections' helpers: SwiGLU of a [n, 2f] gate/up output
// against the CPU's SwiGlu of its halves, and the QKV split (exact).
TEST_F(CudaOpsTest, FusedGateUpAndQkvSplit) {
  for (int64_t n : kTokens) {
    const int64_t f = kHidden;
    Tensor gate = RandomTensor({n, f}, 30, 4.0f);
    Tensor up = RandomTensor({n, f}, 31);
    Tensor gate_up = *Tensor::Host(DType::kF32, {n, 2 * f});
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(gate_up.f32().data() + i * 2 * f, gate.f32().data() + i * f,
                  f * sizeof(float));
      std::memcpy(gate_up.f32().data() + i * 2 * f + f, up.f32().data() + i * f,
                  f * sizeof(float));
    }
    Tensor want = *Tensor::Host(DType::kF32, {n, f});
    ASSERT_TRUE(SwiGlu(gate, up, want).ok());
    Tensor out = Empty(DType::kF32, {n, f});
    ASSERT_TRUE(SwiGluFusedCuda(Dev(gate_up), out, exec_).ok());
    ExpectClose(ToHost(out), want, 1e-5, 1e-6, "fused swiglu f32");
    Tensor out16 = Empty(DType::kBF16, {n, f});
    ASSERT_TRUE(SwiGluFusedCuda(Dev(gate_up), out16, exec_).ok());
    ExpectClose(ToHost(out16), want, 4e-3, 1e-6, "fused swiglu bf16");

    const int64_t qd = kHeads * kHeadDim, kd = kKvHeads * kHeadDim;
    Tensor qkv = RandomTensor({n, qd + 2 * kd}, 32);
    Tensor q = Empty(DType::kF32, {n, qd}), k = Empty(DType::kF32, {n, kd}),
           v = Empty(DType::kF32, {n, kd});
    ASSERT_TRUE(SplitQkvCuda(Dev(qkv), q, k, v, exec_).ok());
    const Tensor hq = ToHost(q), hk = ToHost(k), hv = ToHost(v);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = qkv.f32().data() + i * (qd + 2 * kd);
      ASSERT_EQ(std::memcmp(hq.f32().data() + i * qd, row, qd * 4), 0) << i;
      ASSERT_EQ(std::memcmp(hk.f32().data() + i * kd, row + qd, kd * 4), 0);
      ASSERT_EQ(std::memcmp(hv.f32().data() + i * kd, row + qd + kd, kd * 4),
                0);
    }
  }
}

TEST_F(CudaOpsTest, Linear) {
  for (int64_t n : kTokens) {
    Tensor x = RandomBf16({n, kHidden}, 9);
    Tensor w = RandomBf16({1001, kHidden}, 10);
    Tensor want = *Tensor::Host(DType::kF32, {n, 1001});
    ASSERT_TRUE(Linear(x, w, want).ok());
    Tensor dx = Dev(x, DType::kBF16), dw = Dev(w, DType::kBF16);
    // Products of bf16 values are exact in f32; only the summation order
    // differs (769 terms of |x w| ~ 1, sums ~ 28): 1e-3 absolute is ~100
    // f32 ulps of the largest partial sums.
    Tensor y = Empty(DType::kF32, {n, 1001});
    ASSERT_TRUE(LinearCuda(dx, dw, y, false, exec_).ok());
    ExpectClose(ToHost(y), want, 1e-5, 1e-3, "linear f32 out");
    // Accumulate: y += x w^T doubles it.
    ASSERT_TRUE(LinearCuda(dx, dw, y, true, exec_).ok());
    Tensor twice = *Tensor::Host(DType::kF32, want.shape());
    for (int64_t i = 0; i < want.numel(); ++i) {
      twice.f32()[i] = 2 * want.f32()[i];
    }
    ExpectClose(ToHost(y), twice, 1e-5, 2e-3, "linear accumulate");
    Tensor y16 = Empty(DType::kBF16, {n, 1001});
    ASSERT_TRUE(LinearCuda(dx, dw, y16, false, exec_).ok());
    ExpectClose(ToHost(y16), want, 4e-3, 1e-3, "linear bf16 out");
  }
}

// Decode batches over inputs a multiple of 8 take the GEMV kernel
// (kernels/linear/linear_cuda.cu): 1 row by default, up to 8 with
// SHARDLM_CUDA_GEMV_ROWS=8 (the GPU session sets it); 9 rows or an odd
// width take cuBLAS:
// each against the CPU, both outputs, with and without accumulation, for
// widths of one 16-byte piece per row, a partial round of pieces and many.
TEST_F(CudaOpsTest, LinearDecodeBatches) {
  for (const int64_t in : {8, 1032, 8200}) {
    for (const int64_t n : {1, 2, 5, 8, 9}) {
      Tensor x = RandomBf16({n, in}, 11);
      Tensor w = RandomBf16({1001, in}, 12);
      Tensor want = *Tensor::Host(DType::kF32, {n, 1001});
      ASSERT_TRUE(Linear(x, w, want).ok());
      const std::string what = absl::StrCat("in ", in, ", n ", n);
      // |x w| ~ 1 per term: sums of `in` terms in another order.
      const double atol = 1e-6 * static_cast<double>(in) + 1e-4;
      Tensor dx = Dev(x, DType::kBF16), dw = Dev(w, DType::kBF16);
      Tensor y = Empty(DType::kF32, {n, 1001});
      ASSERT_TRUE(LinearCuda(dx, dw, y, false, exec_).ok()) << what;
      ExpectClose(ToHost(y), want, 1e-5, atol, what.c_str());
      ASSERT_TRUE(LinearCuda(dx, dw, y, true, exec_).ok()) << what;
      Tensor twice = *Tensor::Host(DType::kF32, want.shape());
      for (int64_t i = 0; i < want.numel(); ++i) {
        twice.f32()[i] = 2 * want.f32()[i];
      }
      ExpectClose(ToHost(y), twice, 1e-5, 2 * atol,
                  (what + " accumulate").c_str());
      Tensor y16 = Empty(DType::kBF16, {n, 1001});
      ASSERT_TRUE(LinearCuda(dx, dw, y16, false, exec_).ok()) << what;
      ExpectClose(ToHost(y16), want, 4e-3, atol, (what + " bf16 out").c_str());
    }
  }
}

// Quantized weights on the device (issue #43 part 4): packed Q8_0 / Q4_0
// matrices (PackQuantized) against the CPU's quantized Linear
// (linear_quantized_cpu.cc) on the same blocks, x rounded to bf16 first.
// Both multiply the exact weights d * code in f32; they differ only in
// summation order (the GPU sums code * x over 16 or 32 values, scales once
// per unit, and reduces a warp as a tree), so the bound is 1e-5 of each
// output's sum of |terms| (~170 f32 roundings of it) plus 1e-5; a bf16
// output adds its own rounding (2^-8 of |y|).
class QuantizedWeightsTest : public CudaOpsTest {
 protected:
  // |x| |w|^T with the dequantized weights: what rounding is relative to.
  Tensor Magnitude(const Tensor& x, const Tensor& w) {
    Tensor ax = *Tensor::Host(DType::kF32, x.shape()), aw = Dequantized(w);
    for (int64_t i = 0; i < x.numel(); ++i) {
      ax.f32()[i] = std::abs(x.f32()[i]);
    }
    for (float& v : aw.f32()) v = std::abs(v);
    Tensor mag = *Tensor::Host(DType::kF32, {x.dim(0), w.dim(0)});
    EXPECT_TRUE(Linear(ax, aw, mag).ok());
    return mag;
  }
  static Tensor Dequantized(const Tensor& w) {
    Tensor f = *Tensor::Host(DType::kF32, w.shape());
    EXPECT_TRUE(DequantizeRow(w.dtype(), static_cast<const uint8_t*>(w.raw()),
                              w.numel(), f.data<float>())
                    .ok());
    return f;
  }
  // |got - want| <= rel_mag * mag + rel * |want| + atol, the worst named.
  static void ExpectWithin(const Tensor& got, const Tensor& want,
                           const Tensor& mag, double rel_mag, double rel,
                           const std::string& what) {
    ASSERT_EQ(got.shape(), want.shape()) << what;
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double diff = std::abs(double{got.f32()[i]} - want.f32()[i]);
      const double bound =
          rel_mag * mag.f32()[i] + rel * std::abs(double{want.f32()[i]}) + 1e-5;
      const double ratio = diff / bound;
      if (std::isnan(ratio) || ratio > worst) {
        worst = std::isnan(ratio) ? INFINITY : ratio;
        at = i;
      }
    }
    EXPECT_LE(worst, 1.0) << what << ": element " << at << " got "
                          << got.f32()[at] << " want " << want.f32()[at]
                          << " magnitude " << mag.f32()[at];
  }
  Tensor DevPacked(const Tensor& gguf) {
    absl::StatusOr<Tensor> packed = PackQuantized(gguf);
    EXPECT_TRUE(packed.ok()) << packed.status();
    return Dev(*packed);
  }
};

TEST_F(QuantizedWeightsTest, GemvMatchesTheCpuOnAwkwardShapes) {
  uint32_t seed = 100;
  for (const DType t : {DType::kQ8_0, DType::kQ4_0}) {
    for (const int64_t out : {1, 3, 4097}) {
      for (const int64_t in : {32, 96, 4096}) {
        const Tensor w = testing_util::RandomQuantized(t, out, in, ++seed);
        const Tensor dw = DevPacked(w);
        for (int64_t n = 1; n <= kQuantGemvMaxRows; ++n) {
          const std::string what =
              absl::StrCat(DTypeName(t), " out ", out, ", in ", in, ", n ", n);
          const Tensor x = RandomBf16({n, in}, ++seed);
          Tensor want = *Tensor::Host(DType::kF32, {n, out});
          ASSERT_TRUE(Linear(x, w, want).ok()) << what;
          const Tensor mag = Magnitude(x, w);
          const Tensor dx = Dev(x, DType::kBF16);
          Tensor y = Empty(DType::kF32, {n, out});
          ASSERT_TRUE(LinearQuantizedCuda(dx, dw, y, false, exec_).ok())
              << what;
          ExpectWithin(ToHost(y), want, mag, 1e-5, 0, what);
          // Accumulate: y += x w^T doubles it.
          ASSERT_TRUE(LinearQuantizedCuda(dx, dw, y, true, exec_).ok());
          Tensor twice = *Tensor::Host(DType::kF32, want.shape());
          for (int64_t i = 0; i < want.numel(); ++i) {
            twice.f32()[i] = 2 * want.f32()[i];
          }
          ExpectWithin(ToHost(y), twice, mag, 2e-5, 0, what + " accumulate");
          Tensor y16 = Empty(DType::kBF16, {n, out});
          ASSERT_TRUE(LinearQuantizedCuda(dx, dw, y16, false, exec_).ok());
          ExpectWithin(ToHost(y16), want, mag, 1e-5, 1.0 / 256,
                       what + " bf16 out");
        }
      }
    }
  }
}

// The dequantization kernel is exact: each value is the f32 d * code
// rounded to bf16 once, as the host computes it.
TEST_F(QuantizedWeightsTest, DequantizeIsExact) {
  uint32_t seed = 300;
  for (const DType t : {DType::kQ8_0, DType::kQ4_0}) {
    for (const int64_t out : {1, 3, 4097}) {
      for (const int64_t in : {32, 96, 4096}) {
        const Tensor w = testing_util::RandomQuantized(t, out, in, ++seed);
        Tensor want = Dequantized(w);
        RoundToBf16(want);
        const Tensor dw = DevPacked(w);
        Tensor all = Empty(DType::kBF16, {out, in});
        ASSERT_TRUE(DequantizePackedCuda(dw, 0, out, all, exec_).ok());
        ExpectClose(ToHost(all), want, 0, 0,
                    absl::StrCat(DTypeName(t), " ", out, " x ", in));
        if (out < 3) continue;
        // Rows [1, 3) only.
        Tensor two = Empty(DType::kBF16, {2, in});
        ASSERT_TRUE(DequantizePackedCuda(dw, 1, 3, two, exec_).ok());
        Tensor want2 = *want.Rows(1, 3);
        ExpectClose(ToHost(two), want2, 0, 0, "rows 1..3");
      }
    }
  }
}

// Steps of more than 8 rows: chunks of w dequantized into a scratch (here
// two rows, so that a 4097-row matrix takes 2049 chunks, and one large
// enough for all) and multiplied by cuBLAS. The weights are then bf16
// (as today's bf16 upload rounds them): against a bf16-weight reference the
// bound is LinearCuda's; against the CPU's quantized Linear it adds the
// weights' rounding, 2^-9 of the sum of |terms|.
TEST_F(QuantizedWeightsTest, LargerStepsDequantizeInChunks) {
  uint32_t seed = 500;
  for (const DType t : {DType::kQ8_0, DType::kQ4_0}) {
    for (const int64_t out : {3, 4097}) {
      const int64_t in = 96;
      const Tensor w = testing_util::RandomQuantized(t, out, in, ++seed);
      const Tensor dw = DevPacked(w);
      Tensor w16 = Dequantized(w);
      RoundToBf16(w16);
      for (const int64_t scratch_rows : {int64_t{2}, out}) {
        Tensor scratch = Empty(DType::kBF16, {scratch_rows * in});
        for (const int64_t n : {9, 37}) {
          const std::string what =
              absl::StrCat(DTypeName(t), " out ", out, ", n ", n,
                           ", scratch rows ", scratch_rows);
          const Tensor x = RandomBf16({n, in}, ++seed);
          Tensor want16 = *Tensor::Host(DType::kF32, {n, out});
          ASSERT_TRUE(Linear(x, w16, want16).ok());
          Tensor want = *Tensor::Host(DType::kF32, {n, out});
          ASSERT_TRUE(Linear(x, w, want).ok());
          const Tensor mag = Magnitude(x, w);
          const Tensor dx = Dev(x, DType::kBF16);
          Tensor y = Empty(DType::kF32, {n, out});
          ASSERT_TRUE(LinearPackedCuda(dx, dw, y, false, scratch, exec_).ok())
              << what;
          const Tensor got = ToHost(y);
          ExpectWithin(got, want16, mag, 1e-5, 0, what + " vs bf16 weights");
          ExpectWithin(got, want, mag, 1.0 / 512 + 1e-5, 0,
                       what + " vs the CPU's quantized Linear");
        }
      }
    }
  }
  // Without a scratch a large step is refused, saying what it needs.
  const Tensor w = testing_util::RandomQuantized(DType::kQ8_0, 3, 64, 1);
  const Tensor dw = DevPacked(w);
  const Tensor dx = Dev(RandomBf16({9, 64}, 2), DType::kBF16);
  Tensor y = Empty(DType::kF32, {9, 3});
  const absl::Status s = LinearPackedCuda(dx, dw, y, false, Tensor(), exec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("scratch"), std::string::npos) << s;
}

// The scratch held with the cuBLAS handle: reserved, found, grown only.
TEST_F(QuantizedWeightsTest, ScratchBelongsToTheCublasHandle) {
  EXPECT_TRUE(DequantScratchCuda(exec_).empty());
  ASSERT_TRUE(ReserveDequantScratchCuda(exec_, 4096).ok());
  EXPECT_EQ(DequantScratchBytesCuda(exec_), 4096);
  ASSERT_TRUE(ReserveDequantScratchCuda(exec_, 1024).ok());
  EXPECT_EQ(DequantScratchBytesCuda(exec_), 4096);
  ASSERT_TRUE(ReserveDequantScratchCuda(exec_, 8192).ok());
  EXPECT_EQ(DequantScratchCuda(exec_).numel(), 4096);
  ReleaseDequantScratchCuda(exec_.cublas);
  EXPECT_TRUE(DequantScratchCuda(exec_).empty());
}

// Sequences of the given context lengths with `new_tokens` tokens each in
// this step (the last ones), K/V already cached for the earlier positions;
// shuffled physical blocks.
struct AttnCase {
  static constexpr int64_t kBs = 16;
  std::vector<int32_t> positions, token_seq;
  std::vector<std::vector<int32_t> > tables;
  int64_t blocks = 0;

  AttnCase(const std::vector<int64_t>& lens,
           const std::vector<int64_t>& new_tokens) {
    for (int64_t len : lens) blocks += (len + kBs - 1) / kBs;
    std::vector<int32_t> free(blocks + 3);
    std::iota(free.begin(), free.end(), 0);
    std::shuffle(free.begin(), free.end(), std::mt19937(11));
    blocks += 3;  // Some never used.
    for (size_t s = 0; s < lens.size(); ++s) {
      std::vector<int32_t> table;
      for (int64_t b = 0; b < (lens[s] + kBs - 1) / kBs; ++b) {
        table.push_back(free.back());
        free.pop_back();
      }
      tables.push_back(table);
      for (int64_t p = lens[s] - new_tokens[s]; p < lens[s]; ++p) {
        positions.push_back(static_cast<int32_t>(p));
        token_seq.push_back(static_cast<int32_t>(s));
      }
    }
  }
  AttentionBatch batch() const {
    AttentionBatch b{.positions = positions, .token_seq = token_seq};
    for (const auto& t : tables) b.block_tables.push_back(t);
    return b;
  }
};

// One attention case: sequences of context lengths `lens`, the last
// `new_tokens` of each in the step; `heads` over `kv_heads` of `head_dim`;
// a sliding window when `window` > 0.
struct AttentionShape {
  const char* name;
  std::vector<int64_t> lens, new_tokens;
  int64_t heads = kHeads, kv_heads = kKvHeads, head_dim = kHeadDim;
  int64_t window = 0;
  // > 0: the last host_blocks block ids are a host tier in pinned memory
  // (the kernels read and write it in place), the others the device pool.
  int64_t host_blocks = 0;
};

// Both backends' attention on the same bf16-exact K/V, every kernel variant
// against the CPU's.
void CudaOpsTest::CheckAttention(const AttentionShape& c) {
  SCOPED_TRACE(c.name);
  const int64_t heads = c.heads, kv_heads = c.kv_heads, d = c.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  AttnCase ac(c.lens, c.new_tokens);
  // Fill every cached position first (the tokens of earlier steps),
  // through both backends' WriteKv, from the same bf16-exact values.
  std::vector<int32_t> all_pos, all_seq;
  for (size_t s = 0; s < c.lens.size(); ++s) {
    for (int64_t p = 0; p < c.lens[s]; ++p) {
      all_pos.push_back(static_cast<int32_t>(p));
      all_seq.push_back(static_cast<int32_t>(s));
    }
  }
  AttentionBatch fill{.positions = all_pos, .token_seq = all_seq};
  for (const auto& tb : ac.tables) fill.block_tables.push_back(tb);
  const int64_t total = static_cast<int64_t>(all_pos.size());
  Tensor k = RandomBf16({total, kv_heads, d}, 12);
  Tensor v = RandomBf16({total, kv_heads, d}, 13);
  // The CPU caches in their own layout, f32.
  Tensor kc = *Tensor::Host(
      DType::kF32, KeyCacheShape(ac.blocks, AttnCase::kBs, kv_heads, d));
  Tensor vc = *Tensor::Host(
      DType::kF32, ValueCacheShape(ac.blocks, AttnCase::kBs, kv_heads, d));
  ASSERT_TRUE(WriteKv(k, v, fill, kc, vc).ok());
  const int64_t device_blocks = ac.blocks - c.host_blocks;
  ASSERT_GT(device_blocks, 0);
  Tensor dkc = Empty(DType::kBF16, {device_blocks, AttnCase::kBs, kv_heads, d});
  Tensor dvc = Empty(DType::kBF16, {device_blocks, AttnCase::kBs, kv_heads, d});
  const Shape host_shape = {std::max<int64_t>(c.host_blocks, 1), AttnCase::kBs,
                            kv_heads, d};
  Tensor hkc =
      *backend_->Allocate(DType::kBF16, host_shape, MemoryType::kHostPinned);
  Tensor hvc =
      *backend_->Allocate(DType::kBF16, host_shape, MemoryType::kHostPinned);
  Tensor* hk = c.host_blocks > 0 ? &hkc : nullptr;
  Tensor* hv = c.host_blocks > 0 ? &hvc : nullptr;
  CudaAttentionBatch dfill;
  ASSERT_TRUE(
      dfill.Upload(fill, AttnCase::kBs, ac.blocks, 0, exec_, device_blocks)
          .ok());
  ASSERT_TRUE(WriteKvCuda(Dev(k), Dev(v), dfill, dkc, dvc, exec_, hk, hv).ok());
  Sync();

  AttentionBatch batch = ac.batch();
  batch.window = c.window;
  const int64_t n = static_cast<int64_t>(ac.positions.size());
  Tensor q = RandomTensor({n, heads, d}, 14, 2.0f);
  Tensor want = *Tensor::Host(DType::kF32, {n, heads, d});
  ASSERT_TRUE(PagedAttention(q, kc, vc, batch, scale, want).ok());
  CudaAttentionBatch dbatch;
  ASSERT_TRUE(
      dbatch.Upload(batch, AttnCase::kBs, ac.blocks, 0, exec_, device_blocks)
          .ok());
  Tensor dq = Dev(q);
  struct Variant {
    const char* name;
    AttentionKernel kernel;
    int splits;
  };
  for (const Variant& var :
       {Variant{"auto", AttentionKernel::kAuto, 0},
        Variant{"decode 1 split", AttentionKernel::kDecode, 1},
        Variant{"decode 7 splits", AttentionKernel::kDecode, 7},
        Variant{"prefill", AttentionKernel::kPrefill, 0}}) {
    SCOPED_TRACE(var.name);
    // Same cache values; f32 softmax and sums in another order (the CPU
    // accumulates up to 32K terms in f32 too): outputs are convex
    // combinations of |v| <~ 4, so 1e-4 absolute; a wrong mask, window,
    // position or head mapping is off by 1e-2 or more.
    Tensor out = Empty(DType::kF32, {n, heads, d});
    ASSERT_TRUE(PagedAttentionCuda(dq, dkc, dvc, dbatch, scale, out, exec_,
                                   var.kernel, var.splits, hk, hv)
                    .ok());
    ExpectClose(ToHost(out), want, 1e-4, 1e-4, "attention f32 out");
  }
  Tensor out16 = Empty(DType::kBF16, {n, heads, d});
  ASSERT_TRUE(PagedAttentionCuda(dq, dkc, dvc, dbatch, scale, out16, exec_,
                                 AttentionKernel::kAuto, 0, hk, hv)
                  .ok());
  ExpectClose(ToHost(out16), want, 4e-3, 1e-4, "attention bf16 out");
  if (c.host_blocks > 0) {
    // Without the host tier the batch's host blocks have nowhere to be.
    Tensor out = Empty(DType::kF32, {n, heads, d});
    EXPECT_EQ(
        PagedAttentionCuda(dq, dkc, dvc, dbatch, scale, out, exec_).code(),
        absl::StatusCode::kInvalidArgument);
  }
}

// A host KV tier in pinned memory: the shuffled block tables put some of
// every sequence's blocks past the device pool, where the kernels read
// (and WriteKv writes) them in place.
TEST_F(CudaOpsTest, PagedAttentionOverAHostTier) {
  for (const AttentionShape& c : {
           AttentionShape{.name = "decode, host tier",
          .lens = {17, 300, 1500},
          .new_tokens = {1, 1, 1},
          .host_blocks = 60},
           AttentionShape{.name = "prefill + decode, host tier",
           .lens = {300, 77},
           .new_tokens = {300, 1},
           .host_blocks = 12},
           AttentionShape{.name = "chunked prefill, window, host tier",
           .lens = {100, 40},
           .new_tokens = {37, 40},
           .window = 20,
           .host_blocks = 5},
       }) {
    CheckAttention(c);
  }
}

TEST_F(CudaOpsTest, PagedAttentionDecodeAndPrefill) {
  for (const AttentionShape& c : {
           AttentionShape{"decode 1/17/4097", {1, 17, 4097}, {1, 1, 1}},
           AttentionShape{"prefill 4097 + decode", {4097, 33}, {4097, 1}},
           AttentionShape{"chunked prefill", {100, 40}, {37, 40}},
       }) {
    CheckAttention(c);
  }
}

// Llama-3-8B's heads (32 over 8 of 128, here 8 over 2): the largest
// dimension per lane the kernels take but for 256.
TEST_F(CudaOpsTest, PagedAttentionHeadDim128) {
  for (const AttentionShape& c : {
           AttentionShape{.name = "d128 decode",
          .lens = {1, 300, 2049},
          .new_tokens = {1, 1, 1},
          .heads = 8,
          .kv_heads = 2,
          .head_dim = 128},
           AttentionShape{.name = "d128 prefill + decode",
           .lens = {300, 77},
           .new_tokens = {300, 1},
           .heads = 8,
           .kv_heads = 2,
           .head_dim = 128},
       }) {
    CheckAttention(c);
  }
}

// The decode kernel serves the query heads of one KV head together, up to
// kCudaDecodeHeadsPerBlock (16) per block, four warps over them: no grouping
// (MHA: three warps idle), a group of 8 (two heads per warp), a group of 20
// (two blocks per KV head, the second with 4 heads), and the smallest and
// largest head dimensions.
TEST_F(CudaOpsTest, PagedAttentionDecodeGroups) {
  for (const AttentionShape& c : {
           AttentionShape{.name = "MHA 4/4, d 32",
          .lens = {1, 70, 300},
          .new_tokens = {1, 1, 1},
          .heads = 4,
          .kv_heads = 4,
          .head_dim = 32},
           AttentionShape{.name = "GQA 16/2, d 128",
           .lens = {5, 129, 1000},
           .new_tokens = {1, 1, 1},
           .heads = 16,
           .kv_heads = 2,
           .head_dim = 128},
           AttentionShape{.name = "GQA 40/2, d 64",
           .lens = {33, 700},
           .new_tokens = {1, 1},
           .heads = 40,
           .kv_heads = 2,
           .head_dim = 64},
           AttentionShape{.name = "GQA 8/1, d 256",
           .lens = {3, 500},
           .new_tokens = {1, 1},
           .heads = 8,
           .kv_heads = 1,
           .head_dim = 256},
       }) {
    CheckAttention(c);
  }
}

// A long context: one decode token over 32K cached positions (many splits,
// and block tables of 2048 entries).
TEST_F(CudaOpsTest, PagedAttentionDecode32K) {
  CheckAttention({"decode at 32K", {32768, 5}, {1, 1}});
}

// Sliding windows smaller than, equal to and larger than the contexts,
// in decode, whole prefills (a window inside one 16-token tile) and
// chunked prefill.
TEST_F(CudaOpsTest, PagedAttentionSlidingWindow) {
  for (const AttentionShape& c : {
           AttentionShape{.name = "decode, window 64",
          .lens = {1, 17, 64, 65, 700},
          .new_tokens = {1, 1, 1, 1, 1},
          .window = 64},
           AttentionShape{.name = "prefill, window = context",
           .lens = {200},
           .new_tokens = {200},
           .window = 200},
           AttentionShape{.name = "prefill, window 5",
           .lens = {90, 33},
           .new_tokens = {90, 33},
           .window = 5},
           AttentionShape{.name = "chunked prefill, window 20",
           .lens = {100, 40},
           .new_tokens = {37, 40},
           .window = 20},
           AttentionShape{.name = "window beyond every context",
           .lens = {50, 3},
           .new_tokens = {10, 1},
           .window = 4096},
       }) {
    CheckAttention(c);
  }
}

TEST_F(CudaOpsTest, KvBlockSwapRoundTrip) {
  // Device -> pinned host -> another device pool, exact bytes, on a swap
  // stream of its own.
  const Shape shape = {12, 16, kKvHeads, kHeadDim};
  Tensor host = RandomBf16(shape, 15);
  Tensor dev = Dev(host, DType::kBF16);
  auto pinned =
      backend_->Allocate(DType::kBF16, shape, MemoryType::kHostPinned);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  Tensor dev2 = Empty(DType::kBF16, shape);
  auto swap = backend_->CreateStream();
  ASSERT_TRUE(swap.ok());
  const std::vector<int32_t> out_src = {3, 4, 5, 9}, out_dst = {0, 1, 2, 7};
  ASSERT_TRUE(
      CopyKvBlocksCuda(dev, *pinned, out_src, out_dst, (*swap)->native()).ok());
  ASSERT_TRUE(
      CopyKvBlocksCuda(*pinned, dev2, out_dst, out_src, (*swap)->native())
          .ok());
  ASSERT_TRUE((*swap)->Synchronize().ok());
  Tensor back = ToHost(dev2);
  const int64_t per_block = 16 * kKvHeads * kHeadDim;
  for (int32_t b : out_src) {
    for (int64_t i = 0; i < per_block; ++i) {
      ASSERT_EQ(back.f32()[b * per_block + i], host.f32()[b * per_block + i])
          << "block " << b;
    }
  }
  Tensor pageable = *Tensor::Host(DType::kBF16, shape);
  EXPECT_EQ(CopyKvBlocksCuda(dev, pageable, out_src, out_dst, (*swap)->native())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaOpsTest, ArgmaxMatchesGreedySampling) {
  for (int64_t vocab : {kHidden, int64_t{49152}}) {
    Tensor logits = RandomTensor({4, vocab}, 16, 3.0f);
    // Ties at the maximum: the lower index wins on both.
    logits.f32()[2 * vocab + 5] = 100.0f;
    logits.f32()[2 * vocab + vocab - 1] = 100.0f;
    Tensor ids = Empty(DType::kI32, {4});
    ASSERT_TRUE(ArgmaxCuda(Dev(logits), ids, exec_).ok());
    Tensor got = ToHost(ids);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(got.data<int32_t>()[r],
                SampleToken(absl::Span<const float>(
                                logits.f32().data() + r * vocab, vocab),
                            SamplingParams{}, 0))
          << "row " << r;
    }
  }
}

TEST_F(CudaOpsTest, SamplingMatchesSampleTokenDraws) {
  // Every mode on rows of 49152 and 769 logits, many seeds: the device
  // must draw exactly SampleToken's token (same uniform, same order).
  const SamplingParams modes[] = {
      {.temperature = 0.0f},
      {.temperature = 0.8f},
      {.temperature = 1.3f, .top_k = 40},
      {.temperature = 0.7f, .top_p = 0.9f},
      {.temperature = 1.0f, .top_k = 100, .top_p = 0.5f},
      {.temperature = 2.0f, .top_k = 1},
      {.temperature = 1.0f, .top_k = 100000},  // k beyond the vocabulary.
  };
  for (int64_t vocab : {kHidden, int64_t{49152}}) {
    const int64_t rows = 64;
    Tensor logits = RandomTensor({rows, vocab}, 17, 3.0f);
    // Ties inside the top-k and at its edge.
    for (int64_t r = 0; r < rows; r += 3) {
      for (int64_t j = 0; j < 8; ++j) logits.f32()[r * vocab + 7 * j] = 9.0f;
    }
    Tensor dev = Dev(logits);
    std::vector<SamplingParams> params;
    std::vector<uint64_t> steps;
    for (int64_t r = 0; r < rows; ++r) {
      SamplingParams p = modes[r % std::size(modes)];
      p.seed = 1000 + r;
      params.push_back(p);
      steps.push_back(static_cast<uint64_t>(r * 7));
    }
    Tensor ids = Empty(DType::kI32, {rows});
    ASSERT_TRUE(SampleCuda(dev, params, steps, ids, exec_).ok());
    Tensor got = ToHost(ids);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t want = SampleToken(
          absl::Span<const float>(logits.f32().data() + r * vocab, vocab),
          params[r], steps[r]);
      EXPECT_EQ(got.data<int32_t>()[r], want)
          << "vocab " << vocab << " row " << r << " temperature "
          << params[r].temperature << " top_k " << params[r].top_k << " top_p "
          << params[r].top_p;
    }
  }
}

// Gated DeltaNet against the CPU kernels composed as CpuForwardOps does:
// three sequences in one step (one fresh, two carrying random states, one
// of them a single decode token), a TP rank's share of the value heads
// (starting off a key-head boundary), shapes that fill no tile (k_dim 24,
// v_dim 40) and Qwen3.5's own (k_dim = v_dim = 128, value heads tiled);
// then the same sequences' next tokens from the states the first call left.
TEST_F(CudaOpsTest, GatedDeltaNetMatchesTheCpuKernels) {
  struct Shape {
    GatedDeltaNetShape sh;
    int64_t taps;
  };
  const Shape shapes[] = {
      {{.k_heads = 2,
        .v_heads = 3,
        .k_dim = 24,
        .v_dim = 40,
        .v_head_begin = 1,
        .v_heads_total = 4},
       4},
      {{.k_heads = 2,
        .v_heads = 4,
        .k_dim = 128,
        .v_dim = 128,
        .v_tiled = true},
       4},
  };
  for (const Shape& shape : shapes) {
    const GatedDeltaNetShape& sh = shape.sh;
    SCOPED_TRACE("k_dim " + std::to_string(sh.k_dim));
    const int64_t nqk = 2 * sh.k_heads * sh.k_dim, nv = sh.v_heads * sh.v_dim;
    const int64_t ch = nqk + nv, w = shape.taps, slots = 4;
    const Tensor conv_w = RandomTensor({ch, w}, 1, 0.5f);
    const Tensor dt = RandomTensor({sh.v_heads}, 2);
    Tensor a = RandomTensor({sh.v_heads}, 3);
    for (float& x : a.f32()) x = -std::exp(x);
    const Tensor norm = RandomTensor({sh.v_dim}, 4);
    // Host states (the CPU's) and their device copies.
    Tensor cs = RandomTensor({slots, w - 1, ch}, 5);
    Tensor rs = RandomTensor({slots, sh.v_heads, sh.k_dim, sh.v_dim}, 6, 0.1f);
    Tensor dcs = Dev(cs), drs = Dev(rs);
    for (const std::vector<CudaDeltaRun>& runs :
         {std::vector<CudaDeltaRun>{
              {0, 7, 2, true}, {7, 8, 0, false}, {8, 13, 3, false}},
          std::vector<CudaDeltaRun>{
              {0, 1, 2, false}, {1, 4, 3, false}, {4, 5, 0, false}}}) {
      const int64_t n = runs.back().end;
      const Tensor qk = RandomTensor({n, nqk}, 10 + n);
      const Tensor v = RandomTensor({n, nv}, 11 + n);
      const Tensor z = RandomTensor({n, nv}, 12 + n);
      const Tensor beta_in = RandomTensor({n, sh.v_heads}, 13 + n, 2.0f);
      const Tensor alpha_in = RandomTensor({n, sh.v_heads}, 14 + n, 2.0f);
      // The CPU: per run, the convolution, the gates, the rule; the norm.
      Tensor o = *Tensor::Host(DType::kF32, {n, sh.v_heads, sh.v_dim});
      for (const CudaDeltaRun& r : runs) {
        const int64_t t0 = r.begin, len = r.end - r.begin;
        Tensor x = *Tensor::Host(DType::kF32, {len, ch});
        Tensor g = *Tensor::Host(DType::kF32, {len, sh.v_heads});
        Tensor beta = *Tensor::Host(DType::kF32, {len, sh.v_heads});
        for (int64_t t = 0; t < len; ++t) {
          std::copy_n(qk.f32().data() + (t0 + t) * nqk, nqk,
                      x.f32().data() + t * ch);
          std::copy_n(v.f32().data() + (t0 + t) * nv, nv,
                      x.f32().data() + t * ch + nqk);
          for (int64_t h = 0; h < sh.v_heads; ++h) {
            const int64_t i = (t0 + t) * sh.v_heads + h;
            const double b = beta_in.f32()[i];
            const double y = alpha_in.f32()[i] + dt.f32()[h];
            beta.f32()[t * sh.v_heads + h] = 1.0 / (1.0 + std::exp(-b));
            g.f32()[t * sh.v_heads + h] =
                a.f32()[h] *
                (std::max(y, 0.0) + std::log1p(std::exp(-std::abs(y))));
          }
        }
        Tensor cslot = *cs.Rows(r.slot, r.slot + 1);
        cslot = *cslot.Reshaped({w - 1, ch});
        Tensor rslot = *rs.Rows(r.slot, r.slot + 1);
        rslot = *rslot.Reshaped({sh.v_heads, sh.k_dim, sh.v_dim});
        if (r.fresh) {
          std::fill(cslot.f32().begin(), cslot.f32().end(), 0.0f);
          std::fill(rslot.f32().begin(), rslot.f32().end(), 0.0f);
        }
        Tensor c = *Tensor::Host(DType::kF32, {len, ch});
        ASSERT_TRUE(CausalConv1dSilu(x, conv_w, cslot, c).ok());
        Tensor q = *Tensor::Host(DType::kF32, {len, sh.k_heads, sh.k_dim});
        Tensor k = *Tensor::Host(DType::kF32, {len, sh.k_heads, sh.k_dim});
        Tensor vv = *Tensor::Host(DType::kF32, {len, sh.v_heads, sh.v_dim});
        for (int64_t t = 0; t < len; ++t) {
          const float* row = c.f32().data() + t * ch;
          const int64_t half = nqk / 2;
          std::copy_n(row, half, q.f32().data() + t * half);
          std::copy_n(row + half, half, k.f32().data() + t * half);
          std::copy_n(row + nqk, nv, vv.f32().data() + t * nv);
        }
        Tensor orun = *o.Rows(t0, r.end);
        ASSERT_TRUE(GatedDeltaRule(q, k, vv, g, beta, sh, rslot, orun).ok());
      }
      Tensor want = *Tensor::Host(DType::kF32, {n, sh.v_heads, sh.v_dim});
      ASSERT_TRUE(GatedRmsNorm(o, *z.Reshaped({n, sh.v_heads, sh.v_dim}), norm,
                               1e-6f, want)
                      .ok());
      // The device.
      Tensor conv_out = Empty(DType::kF32, {n, ch});
      Tensor dout_o = Empty(DType::kF32, {n, nv});
      Tensor out = Empty(DType::kF32, {n, nv});
      ASSERT_TRUE(GatedDeltaNetCuda(Dev(qk), Dev(v), Dev(z), Dev(beta_in),
                                    Dev(alpha_in), Dev(conv_w), Dev(dt), Dev(a),
                                    Dev(norm), 1e-6f, sh, runs, dcs, drs,
                                    conv_out, dout_o, out, exec_)
                      .ok());
      ExpectClose(ToHost(out), *want.Reshaped({n, nv}), 1e-4, 1e-4,
                  "gated delta net output");
      ExpectClose(ToHost(dcs), cs, 0, 0, "conv states");
      ExpectClose(ToHost(drs), rs, 1e-4, 1e-5, "recurrent states");
    }
  }
}

TEST_F(CudaOpsTest, SigmoidGateBothForms) {
  const int64_t n = 5, c = 33;
  const Tensor x = RandomTensor({n, c}, 1, 3.0f);
  for (const int64_t gc : {c, int64_t{1}}) {
    const Tensor gate = RandomTensor({n, gc}, 2, 4.0f);
    Tensor want = *Tensor::Host(DType::kF32, {n, c});
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < c; ++j) {
        const double g = gate.f32()[r * gc + (gc == 1 ? 0 : j)];
        want.f32()[r * c + j] = x.f32()[r * c + j] / (1.0 + std::exp(-g));
      }
    }
    Tensor dx = Dev(x);
    ASSERT_TRUE(SigmoidGateCuda(dx, Dev(gate), exec_).ok());
    ExpectClose(ToHost(dx), want, 1e-6, 1e-6, "sigmoid gate");
  }
}

}  // namespace
}  // namespace shardlm
