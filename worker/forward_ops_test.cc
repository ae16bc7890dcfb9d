// The ForwardOps conformance suite: every op of the backend seam
// (worker/forward.h), each against a double-precision reference written
// here from the op's contract, with its own error bound, on every backend
// present (the CPU always; CUDA in the GPU binary, forward_ops_gpu_test).
// A new op is one test here; a new backend one OpsBackend
// (forward_ops_backend_test.h).
//
// Shapes are the awkward ones that found bugs before: hidden 769 (no
// vector multiple), 4097 tokens and a 4097-token context (one past a power
// of two), 9 query heads over 3 KV heads, block tables out of order, and
// sequences of several lengths mixed in one step.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/ssm/gated_delta_net.h"
#include "model/dequantize.h"
#include "testing/random_tensors.h"
#include "testing/status.h"
#include "worker/cpu_forward_ops.h"
#include "worker/forward_ops_backend_test.h"

namespace shardlm {
namespace {

using testing_util::RandomQuantized;
using testing_util::RandomTensor;

// ---------------------------------------------------------------------------
// The CPU backend: host tensors as they are, weights in their blocks.

// The batch outlives the ops that point at it (base-from-member).
struct CpuBatchHolder {
  AttentionBatch batch;
};

class BoundCpuOps : private CpuBatchHolder, public CpuForwardOps {
 public:
  BoundCpuOps(const StepInput& step, int64_t hidden)
      : CpuBatchHolder{MakeBatch(step)}, CpuForwardOps(step, batch, hidden) {}

 private:
  static AttentionBatch MakeBatch(const StepInput& step) {
    AttentionBatch b{.positions = step.positions, .token_seq = step.token_seq};
    for (const auto& table : step.block_tables) b.block_tables.push_back(table);
    return b;
  }
};

class CpuOpsBackend : public OpsBackend {
 public:
  std::string name() const override { return "cpu"; }
  absl::StatusOr<Tensor> Put(const Tensor& t, DType dtype) override {
    if (dtype != DType::kF32) {
      return absl::InvalidArgumentError("the CPU's buffers are f32");
    }
    ASSIGN_OR_RETURN(Tensor out,
                     Tensor::HostUninitialized(t.dtype(), t.shape()));
    std::copy_n(static_cast<const uint8_t*>(t.raw()), t.bytes(),
                static_cast<uint8_t*>(out.raw()));
    return out;
  }
  absl::StatusOr<Tensor> Weight(const Tensor& t) override {
    return Put(t, DType::kF32);
  }
  absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape) override {
    return Tensor::Host(dtype, std::move(shape));
  }
  absl::StatusOr<Tensor> Get(const Tensor& t) override {
    return Put(t, DType::kF32);
  }
  absl::StatusOr<OpsKvCache> NewKvCache(int64_t blocks, int64_t block_size,
                                        int64_t kv_heads, int64_t head_dim,
                                        DType dtype) override {
    OpsKvCache c;
    ASSIGN_OR_RETURN(
        c.k, Tensor::Host(dtype, KeyCacheShape(blocks, block_size, kv_heads,
                                               head_dim, dtype)));
    ASSIGN_OR_RETURN(
        c.v, Tensor::Host(dtype, ValueCacheShape(blocks, block_size, kv_heads,
                                                 head_dim, dtype)));
    return c;
  }
  absl::StatusOr<std::unique_ptr<ForwardOps>> Bind(const StepInput& step,
                                                   const RopeTable&,
                                                   int64_t hidden, int64_t,
                                                   int64_t) override {
    return std::make_unique<BoundCpuOps>(step, hidden);
  }
  DType gemm_input() const override { return DType::kF32; }
  double weight_rounding() const override { return 0; }
  std::vector<DType> kv_dtypes() const override {
    return {DType::kF32, DType::kF16, DType::kBF16, DType::kI8};
  }
  std::vector<DType> embedding_dtypes() const override {
    return {DType::kF32, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K};
  }
  std::vector<DType> linear_dtypes() const override {
    return {DType::kF32,    DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
            DType::kQ5_0,   DType::kQ5_1, DType::kQ2_K, DType::kQ3_K,
            DType::kQ4_K,   DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL,
            DType::kIQ4_XS, DType::kMXFP4};
  }
  bool fused_ops() const override { return false; }
  bool pad_columns() const override { return true; }
  bool sequence_parallel() const override { return true; }
  bool gated_delta_net() const override { return true; }
};

}  // namespace

std::unique_ptr<OpsBackend> MakeCpuOpsBackend() {
  return std::make_unique<CpuOpsBackend>();
}

#ifndef SHARDLM_FORWARD_OPS_WITH_CUDA
std::unique_ptr<OpsBackend> MakeCudaOpsBackend() { return nullptr; }
#endif

namespace {

// ---------------------------------------------------------------------------
// References and helpers.

// Setup that cannot fail unless the harness is wrong: abort naming it.
template <typename T>
T Must(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "forward_ops_test setup: %s\n",
                 std::string(v.status().message()).c_str());
    std::abort();
  }
  return *std::move(v);
}

// The f32 values of host `t` (f32 or quantized blocks), row-major.
std::vector<double> Values(const Tensor& t) {
  std::vector<double> out(t.numel());
  if (t.dtype() == DType::kF32) {
    std::copy(t.f32().begin(), t.f32().end(), out.begin());
    return out;
  }
  const int64_t cols = t.dim(t.rank() - 1), rows = t.numel() / cols;
  const int64_t row_bytes = Must(BytesFor(t.dtype(), cols));
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const absl::Status s = DequantizeRow(
        t.dtype(), static_cast<const uint8_t*>(t.raw()) + r * row_bytes, cols,
        row.data());
    if (!s.ok()) Must<int>(s);
    std::copy(row.begin(), row.end(), out.begin() + r * cols);
  }
  return out;
}

// x rounded as the backend's `dtype` buffer holds it (f32 or bf16).
std::vector<double> Rounded(std::vector<double> x, DType dtype) {
  if (dtype == DType::kBF16) {
    for (double& v : x) v = Bf16ToFloat(FloatToBf16(static_cast<float>(v)));
  } else {
    for (double& v : x) v = static_cast<float>(v);
  }
  return x;
}

// |got - want| <= bound[i] everywhere, else a failure naming the worst
// element.
void ExpectNear(const Tensor& got, const std::vector<double>& want,
                const std::vector<double>& bound, const std::string& what) {
  ASSERT_EQ(got.dtype(), DType::kF32) << what;
  ASSERT_EQ(static_cast<size_t>(got.numel()), want.size()) << what;
  const absl::Span<const float> g = got.f32();
  int64_t worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(g[i] - want[i]);
    if (!(err <= bound[i])) {  // NaN fails too.
      const double excess = std::isnan(err) ? INFINITY : err - bound[i];
      if (worst < 0 || excess > worst_excess) {
        worst = static_cast<int64_t>(i);
        worst_excess = excess;
      }
    }
  }
  EXPECT_EQ(worst, -1) << what << ": element " << worst << " is "
                       << (worst >= 0 ? g[worst] : 0) << ", reference "
                       << (worst >= 0 ? want[worst] : 0) << ", bound "
                       << (worst >= 0 ? bound[worst] : 0);
}

void ExpectNear(const Tensor& got, const std::vector<double>& want,
                double bound, const std::string& what) {
  ExpectNear(got, want, std::vector<double>(want.size(), bound), what);
}

Tensor HostF32(Shape shape, const std::vector<double>& v) {
  Tensor t = *Tensor::Host(DType::kF32, std::move(shape));
  std::copy(v.begin(), v.end(), t.f32().begin());
  return t;
}

// A step of n tokens of one sequence at positions [0, n) in blocks
// 0, 1, ... of 16: what ops that ignore the step are bound to.
StepInput PlainStep(int64_t n) {
  StepInput s;
  for (int64_t i = 0; i < n; ++i) {
    s.tokens.push_back(static_cast<int32_t>(i));
    s.positions.push_back(static_cast<int32_t>(i));
    s.token_seq.push_back(0);
  }
  s.block_tables.emplace_back();
  for (int64_t j = 0; j < (n + 15) / 16; ++j) {
    s.block_tables[0].push_back(static_cast<int32_t>(j));
  }
  return s;
}

RopeTable TestRope(RopeStyle style, int64_t head_dim) {
  return MakeRopeTable(style, 10000.0f, head_dim, RopeScaling{});
}

// One head's d values at `x` turned by RoPE at `pos`, in double, into `out`.
void RopeReference(const RopeTable& rope, int64_t pos, int64_t d,
                   const double* x, double* out) {
  for (int64_t k = 0; k < d / 2; ++k) {
    const double a = pos * rope.inv_freq[k];
    const double c = std::cos(a) * rope.mscale, s = std::sin(a) * rope.mscale;
    const bool half = rope.style == RopeStyle::kRotateHalf;
    const int64_t p0 = half ? k : 2 * k, p1 = half ? k + d / 2 : 2 * k + 1;
    out[p0] = x[p0] * c - x[p1] * s;
    out[p1] = x[p0] * s + x[p1] * c;
  }
}

class ForwardOpsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = GetParam() == "cpu" ? MakeCpuOpsBackend() : MakeCudaOpsBackend();
    if (backend_ == nullptr) GTEST_SKIP() << "no " << GetParam() << " device";
  }
  OpsBackend& b() { return *backend_; }
  // The ops bound to `step`; the step must outlive them.
  std::unique_ptr<ForwardOps> Bind(const StepInput& step, int64_t hidden,
                                   const RopeTable& rope = {},
                                   int64_t block_size = 16) {
    int64_t blocks = 1;
    for (const auto& table : step.block_tables) {
      for (int32_t id : table) blocks = std::max<int64_t>(blocks, id + 1);
    }
    return Must(b().Bind(step, rope, hidden, block_size, blocks));
  }
  Tensor Put(const Tensor& t, DType dtype = DType::kF32) {
    return Must(b().Put(t, dtype));
  }
  Tensor Get(const Tensor& t) { return Must(b().Get(t)); }
  Tensor Weight(const Tensor& t) { return Must(b().Weight(t)); }
  Tensor Zeros(DType dtype, Shape shape) {
    return Must(b().Zeros(dtype, std::move(shape)));
  }
  // Relative rounding of a GEMM input buffer.
  double input_rounding() const {
    return backend_->gemm_input() == DType::kBF16 ? 1.0 / 256 : 0.0;
  }

  std::unique_ptr<OpsBackend> backend_;
};

// ---------------------------------------------------------------------------
// Embed: rows of the table for the step's ids, offset by vocab_begin; ids
// outside the slice embed to exactly zero (vocab-parallel TP sums them).

TEST_P(ForwardOpsTest, Embed) {
  for (const DType dtype : b().embedding_dtypes()) {
    // 769 columns where a plain type allows it; whole blocks otherwise.
    const int64_t hidden = IsQuantized(dtype) ? 768 : 769, rows = 50;
    const int64_t vocab_begin = 20;
    const Tensor host = IsQuantized(dtype)
                            ? RandomQuantized(dtype, rows, hidden, 7)
                            : RandomTensor({rows, hidden}, 7);
    StepInput step = PlainStep(6);
    step.tokens = {20, 69, 3, 45, 70, 1000};  // In, in, before, in, after x2.
    const std::vector<double> table = Values(host);
    std::vector<double> want(6 * hidden, 0.0);
    for (int64_t i = 0; i < 6; ++i) {
      const int64_t r = step.tokens[i] - vocab_begin;
      if (r < 0 || r >= rows) continue;
      std::copy_n(table.begin() + r * hidden, hidden,
                  want.begin() + i * hidden);
    }
    const Tensor w = Weight(host);
    Tensor x = Zeros(DType::kF32, {6, hidden});
    ASSERT_OK(Bind(step, hidden)->Embed(w, vocab_begin, x));
    std::vector<double> bound(want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      bound[i] = b().weight_rounding() * std::abs(want[i]);
    }
    ExpectNear(Get(x), want, bound, DTypeName(dtype));
  }
}

// ---------------------------------------------------------------------------
// RmsNorm: out = x / sqrt(mean(x^2) + eps) * weight, row by row; also in
// place over per-head rows (Qwen3's q/k norm).

std::vector<double> RmsNormRef(const std::vector<double>& x,
                               const std::vector<double>& w, int64_t cols,
                               double eps) {
  std::vector<double> out(x.size());
  for (size_t r = 0; r < x.size() / cols; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < cols; ++j) ss += x[r * cols + j] * x[r * cols + j];
    const double inv = 1.0 / std::sqrt(ss / cols + eps);
    for (int64_t j = 0; j < cols; ++j) {
      out[r * cols + j] = x[r * cols + j] * inv * w[j];
    }
  }
  return out;
}

TEST_P(ForwardOpsTest, RmsNorm) {
  constexpr double kBound = 2e-6;  // Relative, f32 sums of 769 squares.
  for (const int64_t n : {1, 7, 4097}) {
    const int64_t hidden = 769;
    const Tensor x = RandomTensor({n, hidden}, 11, 3.0f);
    const Tensor w = RandomTensor({hidden}, 12);
    const std::vector<double> want =
        RmsNormRef(Values(x), Values(w), hidden, 1e-5);
    const DType out_type = b().gemm_input();
    Tensor out = Zeros(out_type, {n, hidden});
    ASSERT_OK(Bind(PlainStep(n), hidden)->RmsNorm(Put(x), Put(w), 1e-5f, out));
    std::vector<double> bound(want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      bound[i] = (kBound + input_rounding()) * std::abs(want[i]) + 1e-7;
    }
    ExpectNear(Get(out), want, bound, absl::StrCat("n = ", n));
  }
}

TEST_P(ForwardOpsTest, RmsNormInPlacePerHead) {
  // [n * heads, head_dim] rows normed in place, f32 in and out.
  const int64_t n = 5, heads = 9, d = 64;
  const Tensor x = RandomTensor({n * heads, d}, 13, 2.0f);
  const Tensor w = RandomTensor({d}, 14);
  const std::vector<double> want = RmsNormRef(Values(x), Values(w), d, 1e-6);
  Tensor dev = Put(x);
  ASSERT_OK(Bind(PlainStep(n), 769)->RmsNorm(dev, Put(w), 1e-6f, dev));
  std::vector<double> bound(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    bound[i] = 2e-6 * std::abs(want[i]) + 1e-7;
  }
  ExpectNear(Get(dev), want, bound, "in place");
}

// ---------------------------------------------------------------------------
// Linear: y = x w^T, or y += x w^T, for every weight type the backend
// holds, at decode (1 row), small-batch (7) and GEMM (37) sizes.

TEST_P(ForwardOpsTest, Linear) {
  for (const DType dtype : b().linear_dtypes()) {
    // 769 inputs where a plain type allows it; two 256-value super-blocks
    // otherwise.
    const int64_t in = IsQuantized(dtype) ? 512 : 769, out = 40;
    const Tensor w_host = IsQuantized(dtype)
                              ? RandomQuantized(dtype, out, in, 3)
                              : RandomTensor({out, in}, 3, 0.05f);
    const Tensor w = Weight(w_host);
    const std::vector<double> wv = Values(w_host);
    for (const int64_t n : {1, 7, 37}) {
      for (const bool accumulate : {false, true}) {
        const Tensor x = RandomTensor({n, in}, 4);
        const Tensor y0 = RandomTensor({n, out}, 5);
        // The GEMM reads x as the backend's buffers hold it.
        const std::vector<double> xv = Rounded(Values(x), b().gemm_input());
        std::vector<double> want(n * out), bound(n * out);
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < out; ++j) {
            double sum = 0, mag = 0;
            for (int64_t k = 0; k < in; ++k) {
              sum += xv[i * in + k] * wv[j * in + k];
              mag += std::abs(xv[i * in + k] * wv[j * in + k]);
            }
            const double base = accumulate ? y0.f32()[i * out + j] : 0.0;
            want[i * out + j] = base + sum;
            // f32 accumulation, plus the weight's rounding as held.
            bound[i * out + j] = (1e-5 + 2 * b().weight_rounding()) * mag +
                                 1e-6 * std::abs(base);
          }
        }
        Tensor y = Put(y0);
        ASSERT_OK(Bind(PlainStep(n), in)
                      ->Linear(Put(x, b().gemm_input()), w, y, accumulate));
        ExpectNear(Get(y), want, bound,
                   absl::StrCat(DTypeName(dtype), " n = ", n,
                                accumulate ? " accumulate" : ""));
      }
    }
  }
}

TEST_P(ForwardOpsTest, LinearRefusesMismatchedShapes) {
  const Tensor w = Weight(RandomTensor({40, 769}, 3));
  const Tensor x = Put(RandomTensor({3, 768}, 4), b().gemm_input());
  Tensor y = Zeros(DType::kF32, {3, 40});
  const absl::Status s = Bind(PlainStep(3), 769)->Linear(x, w, y, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("Linear"), std::string::npos) << s;
}

// ---------------------------------------------------------------------------
// Rope: each pair rotated by position * inv_freq, in both pair styles, at
// positions across a 4097-token context.

TEST_P(ForwardOpsTest, Rope) {
  const int64_t heads = 9, d = 64, n = 9;
  for (const RopeStyle style :
       {RopeStyle::kRotateHalf, RopeStyle::kAdjacentPairs}) {
    const RopeTable rope = TestRope(style, d);
    StepInput step = PlainStep(n);
    step.positions = {0, 1, 2, 17, 255, 1023, 4094, 4095, 4096};
    // The sequence's table must hold its last position (the CUDA batch
    // checks it when the ops are bound).
    step.block_tables[0].clear();
    for (int32_t j = 0; j <= 4096 / 16; ++j) step.block_tables[0].push_back(j);
    const Tensor x = RandomTensor({n, heads, d}, 21);
    const std::vector<double> xv = Values(x);
    std::vector<double> want(xv.size());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = (i * heads + h) * d;
        RopeReference(rope, step.positions[i], d, xv.data() + base,
                      want.data() + base);
      }
    }
    Tensor dev = Put(x);
    ASSERT_OK(Bind(step, 769, rope)->Rope(dev, rope));
    // The angle in double, its cos and sin rounded to f32 (a GPU's sincosf
    // at 4096 radians is within a few ulps of that).
    ExpectNear(Get(dev), want, 2e-5,
               style == RopeStyle::kRotateHalf ? "rotate half" : "adjacent");
  }
}

// ---------------------------------------------------------------------------
// WriteKv + Attention: causal attention over the paged cache, per query
// head over its KV head (GQA 9 / 3), for three sequences in one step: one
// at the end of a 4097-token context (written over two steps), one
// prefilling its first 5 tokens, one decoding at position 37; block tables
// out of order; with and without a sliding window.

struct AttentionSetup {
  static constexpr int64_t kHeads = 9, kKvHeads = 3, kDim = 64, kBlock = 16;
  // Positions each sequence has after the second step.
  std::vector<int64_t> lengths = {4097, 5, 38};
  std::vector<std::vector<int32_t>> tables;
  int64_t blocks = 0;
  // Every sequence's K and V by position: [len, kv_heads, dim].
  std::vector<std::vector<double>> k, v;
  StepInput first, second;  // Positions [0, len - t) and the last t.
  Tensor k1, v1, k2, v2, q2;

  AttentionSetup() {
    std::mt19937 rng(5);
    for (int64_t len : lengths) blocks += (len + kBlock - 1) / kBlock;
    blocks += 7;  // Unused blocks in between.
    std::vector<int32_t> perm(blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    size_t next = 0;
    std::normal_distribution<double> dist(0.0, 1.0);
    for (int64_t len : lengths) {
      std::vector<int32_t> table;
      for (int64_t j = 0; j < (len + kBlock - 1) / kBlock; ++j) {
        table.push_back(perm[next++]);
      }
      tables.push_back(table);
      std::vector<double> ks(len * kKvHeads * kDim), vs(ks.size());
      for (double& x : ks) x = dist(rng);
      for (double& x : vs) x = dist(rng);
      k.push_back(ks);
      v.push_back(vs);
    }
    // The second step: 3 tokens of sequence 0, all 5 of 1, the last of 2.
    const std::vector<int64_t> in_second = {3, 5, 1};
    std::vector<double> kf, vf, ks, vs;
    for (int64_t s = 0; s < 3; ++s) {
      const int64_t split = lengths[s] - in_second[s];
      for (int64_t p = 0; p < lengths[s]; ++p) {
        StepInput& step = p < split ? first : second;
        step.tokens.push_back(0);
        step.positions.push_back(static_cast<int32_t>(p));
        step.token_seq.push_back(static_cast<int32_t>(s));
        auto& kd = p < split ? kf : ks;
        auto& vd = p < split ? vf : vs;
        const int64_t row = kKvHeads * kDim;
        kd.insert(kd.end(), k[s].begin() + p * row,
                  k[s].begin() + (p + 1) * row);
        vd.insert(vd.end(), v[s].begin() + p * row,
                  v[s].begin() + (p + 1) * row);
      }
    }
    for (StepInput* step : {&first, &second}) step->block_tables = tables;
    const auto rows = [](const StepInput& s) {
      return static_cast<int64_t>(s.tokens.size());
    };
    k1 = HostF32({rows(first), kKvHeads, kDim}, kf);
    v1 = HostF32({rows(first), kKvHeads, kDim}, vf);
    k2 = HostF32({rows(second), kKvHeads, kDim}, ks);
    v2 = HostF32({rows(second), kKvHeads, kDim}, vs);
    q2 = RandomTensor({rows(second), kHeads, kDim}, 6);
  }

  // The attention of the second step's queries (as `q_rounding` rounds
  // them) with window `window`, and bounds: `rel` of each output's scale
  // (max |v| it averages over) plus the effect of K rounded by
  // `kv_rounding` on the scores.
  void Reference(int64_t window, double scale, std::vector<double>& want,
                 std::vector<double>& bound, double rel,
                 double kv_rounding) const {
    const std::vector<double> q = Values(q2);
    const int64_t n = static_cast<int64_t>(second.tokens.size());
    want.assign(n * kHeads * kDim, 0.0);
    bound.assign(want.size(), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t s = second.token_seq[i], pos = second.positions[i];
      const int64_t begin =
          window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
      for (int64_t h = 0; h < kHeads; ++h) {
        const int64_t g = h / (kHeads / kKvHeads);
        const double* qh = q.data() + (i * kHeads + h) * kDim;
        std::vector<double> scores;
        double top = -INFINITY, qnorm = 0;
        for (int64_t d = 0; d < kDim; ++d) qnorm += std::abs(qh[d]);
        for (int64_t p = begin; p <= pos; ++p) {
          const double* kp = k[s].data() + (p * kKvHeads + g) * kDim;
          double dot = 0;
          for (int64_t d = 0; d < kDim; ++d) dot += qh[d] * kp[d];
          scores.push_back(dot * scale);
          top = std::max(top, scores.back());
        }
        double sum = 0;
        for (double& x : scores) sum += (x = std::exp(x - top));
        double* out = want.data() + (i * kHeads + h) * kDim;
        double vmax = 0;
        for (int64_t p = begin; p <= pos; ++p) {
          const double w = scores[p - begin] / sum;
          const double* vp = v[s].data() + (p * kKvHeads + g) * kDim;
          for (int64_t d = 0; d < kDim; ++d) {
            out[d] += w * vp[d];
            vmax = std::max(vmax, std::abs(vp[d]));
          }
        }
        // A score off by e moves the output by at most about 2 e vmax.
        const double score_err = kv_rounding * qnorm * 4.0 * scale;
        for (int64_t d = 0; d < kDim; ++d) {
          bound[(i * kHeads + h) * kDim + d] =
              (rel + kv_rounding + 2 * score_err) * vmax + 1e-6;
        }
      }
    }
  }
};

// Relative rounding of a KV element as the cache stores it.
double KvRounding(DType t) {
  switch (t) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1.0 / 2048;
    case DType::kBF16:
      return 1.0 / 256;
    default:  // int8 per token and head: max |x| / 254 of ~4 sigma.
      return 4.0 / 254;
  }
}

TEST_P(ForwardOpsTest, WriteKvThenAttention) {
  using S = AttentionSetup;
  const S setup;
  const double scale = 1.0 / std::sqrt(static_cast<double>(S::kDim));
  for (const DType kv : b().kv_dtypes()) {
    for (const int64_t window : {int64_t{0}, int64_t{100}}) {
      ASSERT_OK_AND_ASSIGN(
          OpsKvCache cache,
          b().NewKvCache(setup.blocks, S::kBlock, S::kKvHeads, S::kDim, kv));
      const KvLayer layer{.k = cache.k, .v = cache.v};
      {
        const auto ops = Bind(setup.first, 769, {}, S::kBlock);
        ASSERT_OK(ops->WriteKv(Put(setup.k1), Put(setup.v1), layer));
      }
      const auto ops = Bind(setup.second, 769, {}, S::kBlock);
      ASSERT_OK(ops->WriteKv(Put(setup.k2), Put(setup.v2), layer));
      Tensor out = Zeros(b().gemm_input(), setup.q2.shape());
      ASSERT_OK(ops->Attention(
          Put(setup.q2), layer,
          {.scale = static_cast<float>(scale), .window = window}, out));
      std::vector<double> want, bound;
      setup.Reference(window, scale, want, bound, 2e-5 + input_rounding(),
                      KvRounding(kv));
      ExpectNear(Get(out), want, bound,
                 absl::StrCat(DTypeName(kv), " window ", window));
    }
  }
}

// ---------------------------------------------------------------------------
// Elementwise ops.

double Silu(double x) { return x / (1.0 + std::exp(-x)); }

TEST_P(ForwardOpsTest, SwiGlu) {
  for (const int64_t n : {1, 37}) {
    const int64_t f = 769;
    const Tensor gate = RandomTensor({n, f}, 31, 3.0f);
    const Tensor up = RandomTensor({n, f}, 32, 3.0f);
    const std::vector<double> g = Values(gate), u = Values(up);
    std::vector<double> want(g.size()), bound(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      want[i] = Silu(g[i]) * u[i];
      bound[i] = (4e-7 * 8 + input_rounding()) * std::abs(want[i]) + 1e-7;
    }
    Tensor out = Zeros(b().gemm_input(), {n, f});
    ASSERT_OK(Bind(PlainStep(n), 769)->SwiGlu(Put(gate), Put(up), out));
    ExpectNear(Get(out), want, bound, absl::StrCat("n = ", n));
  }
}

TEST_P(ForwardOpsTest, AddAndAddBias) {
  const int64_t n = 7, c = 769;
  const Tensor x = RandomTensor({n, c}, 41), y = RandomTensor({n, c}, 42);
  const Tensor bias = RandomTensor({c}, 43);
  const std::vector<double> xv = Values(x), yv = Values(y), bv = Values(bias);
  std::vector<double> sum(xv.size()), biased(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    sum[i] = xv[i] + yv[i];
    biased[i] = xv[i] + bv[i % c];
  }
  const auto ops = Bind(PlainStep(n), c);
  Tensor dev = Put(x);
  ASSERT_OK(ops->Add(dev, Put(y)));
  ExpectNear(Get(dev), sum, 1e-6, "Add");
  dev = Put(x);
  ASSERT_OK(ops->AddBias(dev, Put(bias)));
  ExpectNear(Get(dev), biased, 1e-6, "AddBias");
}

TEST_P(ForwardOpsTest, GatherLogitRows) {
  const int64_t n = 9, hidden = 769;
  StepInput step = PlainStep(n);
  step.logit_rows = {8, 0, 4};
  const Tensor x = RandomTensor({n, hidden}, 51);
  const std::vector<double> xv = Values(x);
  std::vector<double> want;
  for (int32_t r : step.logit_rows) {
    want.insert(want.end(), xv.begin() + r * hidden,
                xv.begin() + (r + 1) * hidden);
  }
  Tensor out = Zeros(DType::kF32, {3, hidden});
  ASSERT_OK(Bind(step, hidden)->GatherLogitRows(Put(x), out));
  ExpectNear(Get(out), want, 0.0, "rows 8, 0, 4");
}

TEST_P(ForwardOpsTest, ToHostReadsBack) {
  const Tensor x = RandomTensor({3, 769}, 61);
  ASSERT_OK_AND_ASSIGN(const Tensor host,
                       Bind(PlainStep(3), 769)->ToHost(Put(x)));
  ASSERT_EQ(host.memory(), MemoryType::kHost);
  ExpectNear(host, Values(x), 0.0, "ToHost");
}

// ---------------------------------------------------------------------------
// The optional ops: each backend implements them or says Unimplemented.

TEST_P(ForwardOpsTest, FusedOps) {
  const int64_t n = 5, q = 9 * 64, kv = 3 * 64, f = 769;
  const Tensor qkv = RandomTensor({n, q + 2 * kv}, 71);
  const Tensor gate_up = RandomTensor({n, 2 * f}, 72, 3.0f);
  Tensor dq = Zeros(DType::kF32, {n, q}), dk = Zeros(DType::kF32, {n, kv}),
         dv = Zeros(DType::kF32, {n, kv});
  Tensor h = Zeros(b().gemm_input(), {n, f});
  const auto ops = Bind(PlainStep(n), f);
  const absl::Status split = ops->SplitQkv(Put(qkv), dq, dk, dv);
  const absl::Status fused = ops->SwiGluFused(Put(gate_up), h);
  if (!b().fused_ops()) {
    EXPECT_EQ(split.code(), absl::StatusCode::kUnimplemented) << split;
    EXPECT_EQ(fused.code(), absl::StatusCode::kUnimplemented) << fused;
    return;
  }
  ASSERT_OK(split);
  ASSERT_OK(fused);
  const std::vector<double> all = Values(qkv), gu = Values(gate_up);
  std::vector<double> wq, wk, wv, wh(n * f), bound(n * f);
  for (int64_t i = 0; i < n; ++i) {
    const auto row = all.begin() + i * (q + 2 * kv);
    wq.insert(wq.end(), row, row + q);
    wk.insert(wk.end(), row + q, row + q + kv);
    wv.insert(wv.end(), row + q + kv, row + q + 2 * kv);
    for (int64_t j = 0; j < f; ++j) {
      wh[i * f + j] = Silu(gu[i * 2 * f + j]) * gu[i * 2 * f + f + j];
      bound[i * f + j] =
          (4e-7 * 8 + input_rounding()) * std::abs(wh[i * f + j]) + 1e-7;
    }
  }
  ExpectNear(Get(dq), wq, 0.0, "SplitQkv q");
  ExpectNear(Get(dk), wk, 0.0, "SplitQkv k");
  ExpectNear(Get(dv), wv, 0.0, "SplitQkv v");
  ExpectNear(Get(h), wh, bound, "SwiGluFused");
}

// QkvRopeKv: SplitQkv, Rope of q and k, WriteKv (one kernel on GPUs): q
// against the double-precision rotation, the caches against the unfused
// ops' (each tested above) bit for bit, over the attention test's step
// (three sequences, positions up to 4096, block tables out of order).
TEST_P(ForwardOpsTest, QkvRopeKvIsSplitRopeAndWriteKv) {
  using S = AttentionSetup;
  const S setup;
  const StepInput& step = setup.second;
  const int64_t n = static_cast<int64_t>(step.tokens.size());
  const int64_t heads = S::kHeads, kvh = S::kKvHeads, d = S::kDim;
  const Tensor qkv = RandomTensor({n, (heads + 2 * kvh) * d}, 91);
  for (const RopeStyle style :
       {RopeStyle::kRotateHalf, RopeStyle::kAdjacentPairs}) {
    const RopeTable rope = TestRope(style, d);
    const auto ops = Bind(step, 769, rope, S::kBlock);
    for (const DType kv : b().kv_dtypes()) {
      OpsKvCache fused =
          Must(b().NewKvCache(setup.blocks, S::kBlock, kvh, d, kv));
      OpsKvCache apart =
          Must(b().NewKvCache(setup.blocks, S::kBlock, kvh, d, kv));
      const KvLayer fused_layer{.k = fused.k, .v = fused.v};
      const KvLayer apart_layer{.k = apart.k, .v = apart.v};
      Tensor q = Zeros(DType::kF32, {n, heads, d});
      Tensor k = Zeros(DType::kF32, {n, kvh, d});
      Tensor v = Zeros(DType::kF32, {n, kvh, d});
      const absl::Status done =
          ops->QkvRopeKv(Put(qkv), rope, q, k, v, fused_layer);
      if (!b().fused_ops()) {  // The default composition: SplitQkv first.
        EXPECT_EQ(done.code(), absl::StatusCode::kUnimplemented) << done;
        return;
      }
      ASSERT_OK(done);
      const std::vector<double> all = Values(qkv);
      std::vector<double> want(n * heads * d);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t h = 0; h < heads; ++h) {
          RopeReference(rope, step.positions[i], d,
                        all.data() + i * (heads + 2 * kvh) * d + h * d,
                        want.data() + (i * heads + h) * d);
        }
      }
      const std::string what = absl::StrCat(
          style == RopeStyle::kRotateHalf ? "rotate half" : "adjacent", " ",
          DTypeName(kv));
      ExpectNear(Get(q), want, 2e-5, what + " q");
      // The unfused ops into the other cache.
      Tensor q2 = Zeros(DType::kF32, {n, heads * d});
      Tensor k2 = Zeros(DType::kF32, {n, kvh * d});
      Tensor v2 = Zeros(DType::kF32, {n, kvh * d});
      ASSERT_OK(ops->SplitQkv(Put(qkv), q2, k2, v2));
      Tensor k3 = Must(k2.Reshaped({n, kvh, d}));
      Tensor q3 = Must(q2.Reshaped({n, heads, d}));
      ASSERT_OK(ops->Rope(q3, rope));
      ASSERT_OK(ops->Rope(k3, rope));
      ASSERT_OK(ops->WriteKv(k3, Must(v2.Reshaped({n, kvh, d})), apart_layer));
      ExpectNear(Get(q), Values(Get(q3)), 0.0, what + " q against Rope");
      ExpectNear(Get(fused.k), Values(Get(apart.k)), 0.0, what + " K cache");
      ExpectNear(Get(fused.v), Values(Get(apart.v)), 0.0, what + " V cache");
    }
  }
}

TEST_P(ForwardOpsTest, PadColumns) {
  const int64_t n = 4, c = 100, width = 256, offset = 37;
  const Tensor x = RandomTensor({n, c}, 81);
  const auto ops = Bind(PlainStep(n), 769);
  absl::StatusOr<Tensor> padded = ops->PadColumns(Put(x), offset, width);
  if (!b().pad_columns()) {
    EXPECT_EQ(padded.status().code(), absl::StatusCode::kUnimplemented);
    return;
  }
  ASSERT_OK(padded.status());
  const std::vector<double> xv = Values(x);
  std::vector<double> want(n * width, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(xv.begin() + i * c, c, want.begin() + i * width + offset);
  }
  ExpectNear(Get(*padded), want, 0.0, "padded");
  // Columns that do not fit are refused.
  EXPECT_EQ(ops->PadColumns(Put(x), 200, width).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Sequence parallel: slices of 3, 4 and 3 rows gathered in slots of 4
// move together, in place; a logit row of -1 (another CP rank's) is zeros.
TEST_P(ForwardOpsTest, SequenceParallelRows) {
  const int64_t slot = 4, c = 769;
  const std::vector<int64_t> counts = {3, 4, 3};
  const Tensor x = RandomTensor({3 * slot, c}, 91);
  const auto ops = Bind(PlainStep(3 * slot), c);
  Tensor dev = Put(x);
  const absl::Status compact = ops->CompactRows(dev, slot, counts);
  if (!b().sequence_parallel()) {
    EXPECT_EQ(compact.code(), absl::StatusCode::kUnimplemented) << compact;
    return;
  }
  ASSERT_OK(compact);
  const std::vector<double> xv = Values(x), got = Values(Get(dev));
  std::vector<double> want;
  for (int64_t i = 0; i < 3; ++i) {
    want.insert(want.end(), xv.begin() + i * slot * c,
                xv.begin() + (i * slot + counts[i]) * c);
  }
  const std::vector<double> head(got.begin(), got.begin() + 10 * c);
  EXPECT_EQ(head, want);
  // A part longer than its slot, and a tensor of other rows, are refused.
  EXPECT_EQ(ops->CompactRows(dev, slot, {3, 5, 3}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ops->CompactRows(dev, 5, counts).code(),
            absl::StatusCode::kInvalidArgument);

  StepInput step = PlainStep(5);
  step.logit_rows = {-1, 2, -1};
  const Tensor rows = RandomTensor({5, c}, 92);
  Tensor out = Put(RandomTensor({3, c}, 93));
  ASSERT_OK(Bind(step, c)->GatherLogitRows(Put(rows), out));
  const std::vector<double> rv = Values(rows);
  std::vector<double> want_rows(3 * c, 0.0);
  std::copy_n(rv.begin() + 2 * c, c, want_rows.begin() + c);
  ExpectNear(Get(out), want_rows, 0.0, "rows -1, 2, -1");
}

TEST_P(ForwardOpsTest, ExpertRows) {
  const int64_t n = 6, c = 769;
  const Tensor x = RandomTensor({n, c}, 91);
  const std::vector<int32_t> rows = {5, 0, 3};
  const std::vector<float> weights = {0.25f, 0.5f, 1.5f};
  const auto ops = Bind(PlainStep(n), c);
  Tensor gathered = Zeros(DType::kF32, {3, c});
  Tensor acc = Put(RandomTensor({n, c}, 92));
  ASSERT_OK(ops->Zero(acc));
  ExpectNear(Get(acc), std::vector<double>(n * c, 0.0), 0.0, "Zero");
  ASSERT_OK(ops->GatherRows(Put(x), rows, gathered));
  const std::vector<double> xv = Values(x);
  std::vector<double> want_gathered, want_acc(n * c, 0.0);
  for (size_t i = 0; i < rows.size(); ++i) {
    want_gathered.insert(want_gathered.end(), xv.begin() + rows[i] * c,
                         xv.begin() + (rows[i] + 1) * c);
  }
  ExpectNear(Get(gathered), want_gathered, 0.0, "GatherRows");
  // The forward pass gathers GEMM inputs (bf16 on GPUs): copied exactly.
  const Tensor x_in = Put(x, b().gemm_input());
  Tensor gathered_in = Zeros(b().gemm_input(), {3, c});
  ASSERT_OK(ops->GatherRows(x_in, rows, gathered_in));
  const std::vector<double> xv_in = Values(Get(x_in));
  std::vector<double> want_in;
  for (int32_t r : rows) {
    want_in.insert(want_in.end(), xv_in.begin() + r * c,
                   xv_in.begin() + (r + 1) * c);
  }
  ExpectNear(Get(gathered_in), want_in, 0.0, "GatherRows of GEMM inputs");
  // Scattered twice: the second adds to the first.
  for (int pass = 0; pass < 2; ++pass) {
    ASSERT_OK(ops->ScatterAddRows(gathered, rows, weights, acc));
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int64_t j = 0; j < c; ++j) {
        want_acc[rows[i] * c + j] += weights[i] * want_gathered[i * c + j];
      }
    }
  }
  ExpectNear(Get(acc), want_acc, 1e-6, "ScatterAddRows");
  // A row outside the tensor is refused.
  const std::vector<int32_t> bad = {0, 6, 1};
  EXPECT_EQ(ops->GatherRows(Put(x), bad, gathered).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ops->ScatterAddRows(gathered, bad, weights, acc).code(),
            absl::StatusCode::kInvalidArgument);
}

// More rows than one CUDA launch takes (256), in a shuffled order.
TEST_P(ForwardOpsTest, ExpertRowsOfALongPrefill) {
  const int64_t n = 600, c = 40;
  const Tensor x = RandomTensor({n, c}, 93);
  std::vector<int32_t> rows(n);
  for (int32_t i = 0; i < n; ++i) rows[i] = i;
  std::shuffle(rows.begin(), rows.end(), std::mt19937(94));
  rows.resize(300);
  std::vector<float> weights(rows.size());
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 0.01f * (i % 97);
  const auto ops = Bind(PlainStep(n), c);
  Tensor gathered = Zeros(DType::kF32, {300, c});
  ASSERT_OK(ops->GatherRows(Put(x), rows, gathered));
  Tensor acc = Zeros(DType::kF32, {n, c});
  ASSERT_OK(ops->ScatterAddRows(gathered, rows, weights, acc));
  const std::vector<double> xv = Values(x);
  std::vector<double> want_gathered, want_acc(n * c, 0.0);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t j = 0; j < c; ++j) {
      const double v = xv[rows[i] * c + j];
      want_gathered.push_back(v);
      want_acc[rows[i] * c + j] = double{weights[i]} * static_cast<float>(v);
    }
  }
  ExpectNear(Get(gathered), want_gathered, 0.0, "GatherRows");
  ExpectNear(Get(acc), want_acc, 1e-6, "ScatterAddRows");
}

// ---------------------------------------------------------------------------
// GatedDeltaNet: each sequence's contiguous tokens through its own state
// slot (zeroed first when they start at position 0), other slots untouched;
// against the CPU kernels (kernels/ssm, each held to a double loop) run by
// hand per sequence, with the gates computed here in double. A step whose
// tokens the recurrence cannot take is refused with every state unchanged.

TEST_P(ForwardOpsTest, GatedDeltaNetRunsEachSequenceThroughItsSlot) {
  if (!b().gated_delta_net()) GTEST_SKIP() << "not on " << GetParam();
  // Value heads [1, 4) of 4 (a TP rank's share off a key-head boundary).
  const GatedDeltaNetShape sh{.k_heads = 2,
                              .v_heads = 3,
                              .k_dim = 8,
                              .v_dim = 8,
                              .v_tiled = true,
                              .v_head_begin = 1,
                              .v_heads_total = 4};
  const int64_t w = 4, nqk = 2 * 2 * 8, nv = 3 * 8, ch = nqk + nv, slots = 3;
  // Sequence 0 (slot 2) starts at position 0, 5 tokens; sequence 1 (slot
  // 0) goes on at position 7, 3 tokens; slot 1 is another sequence's.
  StepInput step;
  for (int64_t i = 0; i < 8; ++i) {
    step.tokens.push_back(1);
    step.positions.push_back(static_cast<int32_t>(i < 5 ? i : 2 + i));
    step.token_seq.push_back(i < 5 ? 0 : 1);
  }
  step.block_tables = {{0}, {1}};
  step.state_slots = {2, 0};
  const int64_t n = 8;
  const Tensor qk = RandomTensor({n, nqk}, 61), v = RandomTensor({n, nv}, 62);
  const Tensor z = RandomTensor({n, nv}, 63);
  const Tensor beta_in = RandomTensor({n, 3}, 64, 2.0f);
  const Tensor alpha_in = RandomTensor({n, 3}, 65, 2.0f);
  const Tensor conv = RandomTensor({ch, w}, 66, 0.5f);
  const Tensor dt = RandomTensor({3}, 67);
  Tensor a = RandomTensor({3}, 68);
  for (float& x : a.f32()) x = -std::exp(x);
  const Tensor norm = RandomTensor({8}, 69);
  Tensor conv_state = RandomTensor({slots, w - 1, ch}, 70);
  Tensor rec_state = RandomTensor({slots, 3, 8, 8}, 71, 0.5f);
  const std::vector<double> conv_before = Values(conv_state);
  const std::vector<double> rec_before = Values(rec_state);

  // The reference: each sequence by hand through the kernels.
  std::vector<double> want_out(n * nv), want_conv = conv_before,
                                        want_rec = rec_before;
  for (auto [t0, t1, slot] :
       {std::tuple<int64_t, int64_t, int64_t>{0, 5, 2}, {5, 8, 0}}) {
    const int64_t m = t1 - t0;
    Tensor cs = HostF32({w - 1, ch}, {});
    Tensor rs = HostF32({3, 8, 8}, {});
    if (t0 != 0) {  // Sequence 1 goes on from its slot.
      std::copy_n(conv_before.begin() + slot * (w - 1) * ch, (w - 1) * ch,
                  cs.f32().begin());
      std::copy_n(rec_before.begin() + slot * 3 * 64, 3 * 64, rs.f32().begin());
    }
    Tensor x = HostF32({m, ch}, {}), c = HostF32({m, ch}, {});
    Tensor q = HostF32({m, 2, 8}, {}), k = HostF32({m, 2, 8}, {});
    Tensor vv = HostF32({m, 3, 8}, {}), o = HostF32({m, 3, 8}, {});
    Tensor g = HostF32({m, 3}, {}), beta = HostF32({m, 3}, {});
    for (int64_t t = 0; t < m; ++t) {
      std::copy_n(qk.f32().data() + (t0 + t) * nqk, nqk,
                  x.f32().data() + t * ch);
      std::copy_n(v.f32().data() + (t0 + t) * nv, nv,
                  x.f32().data() + t * ch + nqk);
      for (int64_t h = 0; h < 3; ++h) {
        const double bi = beta_in.f32()[(t0 + t) * 3 + h];
        const double ai = alpha_in.f32()[(t0 + t) * 3 + h] + dt.f32()[h];
        beta.f32()[t * 3 + h] = static_cast<float>(1 / (1 + std::exp(-bi)));
        g.f32()[t * 3 + h] =
            static_cast<float>(a.f32()[h] * std::log1p(std::exp(ai)));
      }
    }
    ASSERT_OK(CausalConv1dSilu(x, conv, cs, c));
    for (int64_t t = 0; t < m; ++t) {
      std::copy_n(c.f32().data() + t * ch, 16, q.f32().data() + t * 16);
      std::copy_n(c.f32().data() + t * ch + 16, 16, k.f32().data() + t * 16);
      std::copy_n(c.f32().data() + t * ch + nqk, nv, vv.f32().data() + t * nv);
    }
    ASSERT_OK(GatedDeltaRule(q, k, vv, g, beta, sh, rs, o));
    ASSERT_OK_AND_ASSIGN(Tensor zs, z.Rows(t0, t1));
    ASSERT_OK_AND_ASSIGN(Tensor z3, zs.Reshaped({m, 3, 8}));
    ASSERT_OK(GatedRmsNorm(o, z3, norm, 1e-6f, o));
    std::copy(o.f32().begin(), o.f32().end(), want_out.begin() + t0 * nv);
    std::copy(cs.f32().begin(), cs.f32().end(),
              want_conv.begin() + slot * (w - 1) * ch);
    std::copy(rs.f32().begin(), rs.f32().end(),
              want_rec.begin() + slot * 3 * 64);
  }

  const auto ops = Bind(step, 64);
  Tensor out = Zeros(DType::kF32, {n, nv});
  const DeltaNetLayer layer{.conv = conv,
                            .dt = dt,
                            .a = a,
                            .norm = norm,
                            .eps = 1e-6f,
                            .shape = sh,
                            .conv_state = conv_state,
                            .recurrent_state = rec_state};
  ASSERT_OK(ops->GatedDeltaNet(qk, v, z, beta_in, alpha_in, layer, out));
  // The gates in double against the op's f32: a few ulps through the norm.
  ExpectNear(out, want_out, 1e-5, "out");
  ExpectNear(conv_state, want_conv, 0.0, "conv states (slot 1 untouched)");
  ExpectNear(rec_state, want_rec, 1e-6, "recurrent states (slot 1 untouched)");

  // Refused, every state unchanged: a sequence's tokens out of order, or
  // split into two runs; a slot outside those held.
  const std::vector<double> conv_after = Values(conv_state);
  const std::vector<double> rec_after = Values(rec_state);
  for (int bad = 0; bad < 3; ++bad) {
    StepInput wrong = step;
    if (bad == 0) std::swap(wrong.positions[6], wrong.positions[7]);
    if (bad == 1) std::swap(wrong.token_seq[4], wrong.token_seq[5]);
    if (bad == 2) wrong.state_slots[1] = 3;
    const absl::Status s =
        Bind(wrong, 64)->GatedDeltaNet(qk, v, z, beta_in, alpha_in, layer, out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad << ": " << s;
    ExpectNear(conv_state, conv_after, 0.0, absl::StrCat("bad ", bad));
    ExpectNear(rec_state, rec_after, 0.0, absl::StrCat("bad ", bad));
  }
}

TEST_P(ForwardOpsTest, SigmoidGate) {
  if (!b().gated_delta_net()) GTEST_SKIP() << "not on " << GetParam();
  const int64_t n = 5, c = 769;
  const Tensor x = RandomTensor({n, c}, 81, 3.0f);
  const Tensor gate = RandomTensor({n, c}, 82, 3.0f);
  const Tensor row_gate = RandomTensor({n, 1}, 83, 3.0f);
  const std::vector<double> xv = Values(x), gv = Values(gate),
                            rv = Values(row_gate);
  std::vector<double> each(xv.size()), per_row(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    each[i] = xv[i] / (1 + std::exp(-gv[i]));
    per_row[i] = xv[i] / (1 + std::exp(-rv[i / c]));
  }
  const auto ops = Bind(PlainStep(n), c);
  Tensor y = Put(x);
  ASSERT_OK(ops->SigmoidGate(y, Put(gate)));
  ExpectNear(Get(y), each, 1e-5, "per value");
  y = Put(x);
  ASSERT_OK(ops->SigmoidGate(y, Put(row_gate)));
  ExpectNear(Get(y), per_row, 1e-5, "per row");
}

// The GPU binary runs CUDA's cases (skipped without a device) beside the
// CPU's.
std::vector<std::string> Backends() {
#ifdef SHARDLM_FORWARD_OPS_WITH_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

INSTANTIATE_TEST_SUITE_P(Backends, ForwardOpsTest,
                         ::testing::ValuesIn(Backends()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace shardlm
