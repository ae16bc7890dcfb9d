#include "kernels/ssm/gated_delta_net.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "testing/random_tensors.h"
#include "testing/status.h"

namespace shardlm {
namespace {

using testing_util::IsError;
using testing_util::MaxAbsDiff;
using testing_util::RandomTensor;

// Values drawn uniformly from [lo, hi).
Tensor Uniform(Shape shape, uint32_t seed, float lo, float hi) {
  Tensor t = *Tensor::Host(DType::kF32, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (float& x : t.f32()) x = dist(rng);
  return t;
}

std::vector<float> Values(const Tensor& t) {
  return {t.f32().begin(), t.f32().end()};
}

Tensor Copy(const Tensor& t) {
  Tensor c = *Tensor::Host(DType::kF32, t.shape());
  std::copy(t.f32().begin(), t.f32().end(), c.f32().begin());
  return c;
}

double MaxAbs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::abs(e));
  return m;
}

double Silu(double y) { return y / (1 + std::exp(-y)); }

// What a call should leave: its output and the state after it.
struct Expected {
  std::vector<double> out, state;
};

// The convolution in doubles, over xp = [state; x] built outright.
Expected ConvReference(const Tensor& x, const Tensor& weight,
                       const Tensor& state) {
  const int64_t n = x.dim(0), ch = x.dim(1), w = weight.dim(1);
  std::vector<double> xp(state.f32().begin(), state.f32().end());
  xp.insert(xp.end(), x.f32().begin(), x.f32().end());
  Expected e;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < ch; ++c) {
      double sum = 0;
      for (int64_t j = 0; j < w; ++j) {
        sum += double{weight.f32()[c * w + j]} * xp[(t + j) * ch + c];
      }
      e.out.push_back(Silu(sum));
    }
  }
  e.state.assign(xp.begin() + n * ch, xp.end());
  return e;
}

TEST(GatedDeltaNetConvTest, MatchesTheDoubleLoop) {
  const int64_t n = 5, ch = 12, w = 4;
  const Tensor x = RandomTensor({n, ch}, 1);
  const Tensor weight = RandomTensor({ch, w}, 2, 0.5f);
  Tensor state = RandomTensor({w - 1, ch}, 3);
  const Expected e = ConvReference(x, weight, state);
  ASSERT_OK_AND_ASSIGN(Tensor out, Tensor::Host(DType::kF32, {n, ch}));
  ASSERT_OK(CausalConv1dSilu(x, weight, state, out));
  EXPECT_LT(MaxAbsDiff(out.f32().data(), e.out.data(), n * ch), 1e-5);
  // The state is a copy of inputs: exact.
  EXPECT_EQ(MaxAbsDiff(state.f32().data(), e.state.data(), (w - 1) * ch), 0);
}

// Calls of 3, 1 and 4 tokens (chunked prefill, then decode) give what one
// call of the 8 gives: 1 token is fewer than the W - 1 = 3 kept, and 3 is
// exactly as many.
TEST(GatedDeltaNetConvTest, SplitCallsEqualOneCall) {
  const int64_t n = 8, ch = 12, w = 4;
  const Tensor x = RandomTensor({n, ch}, 4);
  const Tensor weight = RandomTensor({ch, w}, 5, 0.5f);
  const Tensor initial = RandomTensor({w - 1, ch}, 6);
  Tensor whole_state = Copy(initial);
  ASSERT_OK_AND_ASSIGN(Tensor whole, Tensor::Host(DType::kF32, {n, ch}));
  ASSERT_OK(CausalConv1dSilu(x, weight, whole_state, whole));

  Tensor split_state = Copy(initial);
  ASSERT_OK_AND_ASSIGN(Tensor split, Tensor::Host(DType::kF32, {n, ch}));
  for (auto [begin, end] :
       {std::pair<int64_t, int64_t>{0, 3}, {3, 4}, {4, 8}}) {
    ASSERT_OK_AND_ASSIGN(Tensor xs, x.Rows(begin, end));
    ASSERT_OK_AND_ASSIGN(Tensor outs, split.Rows(begin, end));
    ASSERT_OK(CausalConv1dSilu(xs, weight, split_state, outs));
  }
  const std::vector<double> want(whole.f32().begin(), whole.f32().end());
  EXPECT_LT(MaxAbsDiff(split.f32().data(), want.data(), n * ch), 1e-6);
  EXPECT_EQ(Values(split_state), Values(whole_state));
}

// A delta rule's inputs in the ranges a layer makes (g = -exp(A_log)
// softplus(..) <= 0, beta a sigmoid), with a nonzero initial state.
struct RuleInputs {
  RuleInputs(const GatedDeltaNetShape& s, int64_t n, uint32_t seed)
      : q(RandomTensor({n, s.k_heads, s.k_dim}, seed)),
        k(RandomTensor({n, s.k_heads, s.k_dim}, seed + 1)),
        v(RandomTensor({n, s.v_heads, s.v_dim}, seed + 2)),
        g(Uniform({n, s.v_heads}, seed + 3, -1.5f, -0.02f)),
        beta(Uniform({n, s.v_heads}, seed + 4, 0.05f, 0.95f)),
        state(RandomTensor({s.v_heads, s.k_dim, s.v_dim}, seed + 5, 0.5f)) {}
  Tensor q, k, v, g, beta, state;
};

// The recurrence in doubles, token by token and head by head, as
// gated_delta_net.h writes it.
Expected RuleReference(const RuleInputs& in, const GatedDeltaNetShape& s) {
  const int64_t n = in.q.dim(0), kh = s.k_heads, vh = s.v_heads, dk = s.k_dim,
                dv = s.v_dim;
  Expected e;
  e.state.assign(in.state.f32().begin(), in.state.f32().end());
  e.out.assign(n * vh * dv, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < vh; ++i) {
      const int64_t j = s.v_tiled ? i % kh : i / (vh / kh);
      const float* qt = in.q.f32().data() + (t * kh + j) * dk;
      const float* kt = in.k.f32().data() + (t * kh + j) * dk;
      double qss = 0, kss = 0;
      for (int64_t r = 0; r < dk; ++r) {
        qss += double{qt[r]} * qt[r];
        kss += double{kt[r]} * kt[r];
      }
      std::vector<double> qn(dk), kn(dk);
      for (int64_t r = 0; r < dk; ++r) {
        qn[r] = qt[r] / std::sqrt(qss + 1e-6) / std::sqrt(double(dk));
        kn[r] = kt[r] / std::sqrt(kss + 1e-6);
      }
      double* st = e.state.data() + i * dk * dv;
      const double decay = std::exp(double{in.g.f32()[t * vh + i]});
      for (int64_t x = 0; x < dk * dv; ++x) st[x] *= decay;
      std::vector<double> delta(dv);
      for (int64_t c = 0; c < dv; ++c) {
        double kv = 0;
        for (int64_t r = 0; r < dk; ++r) kv += st[r * dv + c] * kn[r];
        delta[c] = in.beta.f32()[t * vh + i] *
                   (in.v.f32()[(t * vh + i) * dv + c] - kv);
      }
      for (int64_t r = 0; r < dk; ++r) {
        for (int64_t c = 0; c < dv; ++c) st[r * dv + c] += kn[r] * delta[c];
      }
      for (int64_t c = 0; c < dv; ++c) {
        double o = 0;
        for (int64_t r = 0; r < dk; ++r) o += st[r * dv + c] * qn[r];
        e.out[(t * vh + i) * dv + c] = o;
      }
    }
  }
  return e;
}

void CheckRule(GatedDeltaNetShape s, int64_t n) {
  SCOPED_TRACE(::testing::Message()
               << "v_tiled " << s.v_tiled << ", " << s.v_heads << " v heads of "
               << s.v_dim << ", T " << n);
  RuleInputs in(s, n, 10);
  const Expected e = RuleReference(in, s);
  ASSERT_OK_AND_ASSIGN(Tensor out,
                       Tensor::Host(DType::kF32, {n, s.v_heads, s.v_dim}));
  ASSERT_OK(GatedDeltaRule(in.q, in.k, in.v, in.g, in.beta, s, in.state, out));
  EXPECT_LT(MaxAbsDiff(out.f32().data(), e.out.data(), out.numel()),
            1e-4 * MaxAbs(e.out));
  EXPECT_LT(MaxAbsDiff(in.state.f32().data(), e.state.data(), in.state.numel()),
            1e-4 * MaxAbs(e.state));
}

TEST(GatedDeltaNetRuleTest, MatchesTheDoubleLoop) {
  for (bool tiled : {false, true}) {
    CheckRule(
        {.k_heads = 2, .v_heads = 4, .k_dim = 16, .v_dim = 8, .v_tiled = tiled},
        7);
  }
  // Large enough for the kernel's OpenMP path (one head per item).
  CheckRule(
      {.k_heads = 4, .v_heads = 16, .k_dim = 32, .v_dim = 24, .v_tiled = false},
      3);
}

// Calls of 3, 1 and 3 tokens give what one call of the 7 gives.
TEST(GatedDeltaNetRuleTest, SplitCallsEqualOneCall) {
  for (bool tiled : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "v_tiled " << tiled);
    const GatedDeltaNetShape s{
        .k_heads = 2, .v_heads = 4, .k_dim = 16, .v_dim = 8, .v_tiled = tiled};
    const int64_t n = 7;
    RuleInputs in(s, n, 20);
    Tensor split_state = Copy(in.state);
    ASSERT_OK_AND_ASSIGN(Tensor whole, Tensor::Host(DType::kF32, {n, 4, 8}));
    ASSERT_OK(
        GatedDeltaRule(in.q, in.k, in.v, in.g, in.beta, s, in.state, whole));

    ASSERT_OK_AND_ASSIGN(Tensor split, Tensor::Host(DType::kF32, {n, 4, 8}));
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 3}, {3, 4}, {4, 7}}) {
      ASSERT_OK_AND_ASSIGN(Tensor q, in.q.Rows(b, e));
      ASSERT_OK_AND_ASSIGN(Tensor k, in.k.Rows(b, e));
      ASSERT_OK_AND_ASSIGN(Tensor v, in.v.Rows(b, e));
      ASSERT_OK_AND_ASSIGN(Tensor g, in.g.Rows(b, e));
      ASSERT_OK_AND_ASSIGN(Tensor beta, in.beta.Rows(b, e));
      ASSERT_OK_AND_ASSIGN(Tensor out, split.Rows(b, e));
      ASSERT_OK(GatedDeltaRule(q, k, v, g, beta, s, split_state, out));
    }
    const std::vector<double> want(whole.f32().begin(), whole.f32().end());
    EXPECT_LT(MaxAbsDiff(split.f32().data(), want.data(), whole.numel()), 1e-5);
    const std::vector<double> want_state(in.state.f32().begin(),
                                         in.state.f32().end());
    EXPECT_LT(MaxAbsDiff(split_state.f32().data(), want_state.data(),
                         in.state.numel()),
              1e-5);
  }
}

// A TP rank's share of the value heads (v_head_begin, v_heads_total)
// gives those heads of the whole call, for a share that does not start at
// a multiple of k_heads too.
TEST(GatedDeltaNetRuleTest, ShareOfValueHeadsEqualsThoseOfTheWhole) {
  for (bool tiled : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "v_tiled " << tiled);
    const int64_t n = 5, kh = 2, vh = 4, dk = 16, dv = 8;
    const GatedDeltaNetShape whole_shape{.k_heads = kh,
                                         .v_heads = vh,
                                         .k_dim = dk,
                                         .v_dim = dv,
                                         .v_tiled = tiled};
    RuleInputs in(whole_shape, n, 40);
    Tensor whole_state = Copy(in.state);
    ASSERT_OK_AND_ASSIGN(Tensor whole, Tensor::Host(DType::kF32, {n, vh, dv}));
    ASSERT_OK(GatedDeltaRule(in.q, in.k, in.v, in.g, in.beta, whole_shape,
                             whole_state, whole));
    for (auto [h0, h1] : {std::pair<int64_t, int64_t>{0, 1}, {1, 4}}) {
      SCOPED_TRACE(::testing::Message() << "heads " << h0 << ".." << h1);
      const int64_t m = h1 - h0;
      GatedDeltaNetShape share = whole_shape;
      share.v_heads = m;
      share.v_head_begin = h0;
      share.v_heads_total = vh;
      // The share's columns of v, g and beta, and its state.
      ASSERT_OK_AND_ASSIGN(Tensor v, Tensor::Host(DType::kF32, {n, m, dv}));
      ASSERT_OK_AND_ASSIGN(Tensor g, Tensor::Host(DType::kF32, {n, m}));
      ASSERT_OK_AND_ASSIGN(Tensor beta, Tensor::Host(DType::kF32, {n, m}));
      for (int64_t t = 0; t < n; ++t) {
        std::copy_n(in.v.f32().data() + (t * vh + h0) * dv, m * dv,
                    v.f32().data() + t * m * dv);
        std::copy_n(in.g.f32().data() + t * vh + h0, m, g.f32().data() + t * m);
        std::copy_n(in.beta.f32().data() + t * vh + h0, m,
                    beta.f32().data() + t * m);
      }
      ASSERT_OK_AND_ASSIGN(Tensor state,
                           Tensor::Host(DType::kF32, {m, dk, dv}));
      std::copy_n(in.state.f32().data() + h0 * dk * dv, m * dk * dv,
                  state.f32().data());
      ASSERT_OK_AND_ASSIGN(Tensor out, Tensor::Host(DType::kF32, {n, m, dv}));
      ASSERT_OK(GatedDeltaRule(in.q, in.k, v, g, beta, share, state, out));
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t e = 0; e < m * dv; ++e) {
          ASSERT_EQ(out.f32()[t * m * dv + e],
                    whole.f32()[(t * vh + h0) * dv + e])
              << "token " << t << " value " << e;
        }
      }
    }
  }
}

// The gated norm in doubles.
std::vector<double> NormReference(const Tensor& o, const Tensor& z,
                                  const Tensor& weight, double eps) {
  const int64_t d = o.dim(2), rows = o.numel() / d;
  std::vector<double> out;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t e = 0; e < d; ++e) {
      ss += double{o.f32()[r * d + e]} * o.f32()[r * d + e];
    }
    const double inv = 1 / std::sqrt(ss / d + eps);
    for (int64_t e = 0; e < d; ++e) {
      out.push_back(o.f32()[r * d + e] * inv * weight.f32()[e] *
                    Silu(z.f32()[r * d + e]));
    }
  }
  return out;
}

TEST(GatedDeltaNetNormTest, MatchesTheDoubleLoop) {
  const Tensor o = RandomTensor({3, 4, 16}, 30);
  const Tensor z = RandomTensor({3, 4, 16}, 31);
  const Tensor weight = RandomTensor({16}, 32);
  const std::vector<double> want = NormReference(o, z, weight, 1e-6);
  ASSERT_OK_AND_ASSIGN(Tensor out, Tensor::Host(DType::kF32, {3, 4, 16}));
  ASSERT_OK(GatedRmsNorm(o, z, weight, 1e-6f, out));
  EXPECT_LT(MaxAbsDiff(out.f32().data(), want.data(), out.numel()), 1e-5);
}

TEST(GatedDeltaNetNormTest, OutMayBeO) {
  Tensor o = RandomTensor({3, 4, 16}, 33);
  const Tensor z = RandomTensor({3, 4, 16}, 34);
  const Tensor weight = RandomTensor({16}, 35);
  const std::vector<double> want = NormReference(o, z, weight, 1e-6);
  ASSERT_OK(GatedRmsNorm(o, z, weight, 1e-6f, o));
  EXPECT_LT(MaxAbsDiff(o.f32().data(), want.data(), o.numel()), 1e-5);
}

TEST(GatedDeltaNetArgsTest, ConvRefusesBadArgumentsAndChangesNothing) {
  const int64_t n = 5, ch = 12, w = 4;
  const Tensor x = RandomTensor({n, ch}, 40);
  const Tensor weight = RandomTensor({ch, w}, 41);
  Tensor state = RandomTensor({w - 1, ch}, 42);
  Tensor out = RandomTensor({n, ch}, 43);
  const std::vector<float> state0 = Values(state), out0 = Values(out);
  ASSERT_OK_AND_ASSIGN(Tensor half, Tensor::Host(DType::kF16, {n, ch}));
  EXPECT_TRUE(IsError(CausalConv1dSilu(half, weight, state, out),
                      absl::StatusCode::kInvalidArgument,
                      "CausalConv1dSilu: x is"));
  Tensor long_state = RandomTensor({w, ch}, 44);
  const std::vector<float> long_state0 = Values(long_state);
  EXPECT_TRUE(IsError(CausalConv1dSilu(x, weight, long_state, out),
                      absl::StatusCode::kInvalidArgument,
                      "CausalConv1dSilu: state is"));
  EXPECT_EQ(Values(long_state), long_state0);
  Tensor in_place = Copy(x);
  EXPECT_TRUE(IsError(CausalConv1dSilu(in_place, weight, state, in_place),
                      absl::StatusCode::kInvalidArgument, "out overlaps x"));
  EXPECT_EQ(Values(in_place), Values(x));
  EXPECT_EQ(Values(state), state0);
  EXPECT_EQ(Values(out), out0);
}

TEST(GatedDeltaNetArgsTest, RuleRefusesBadArgumentsAndChangesNothing) {
  const GatedDeltaNetShape s{
      .k_heads = 2, .v_heads = 4, .k_dim = 16, .v_dim = 8, .v_tiled = false};
  const int64_t n = 3;
  RuleInputs in(s, n, 50);
  Tensor out = RandomTensor({n, 4, 8}, 56);
  const std::vector<float> state0 = Values(in.state), out0 = Values(out);
  const auto unchanged = [&] {
    EXPECT_EQ(Values(in.state), state0);
    EXPECT_EQ(Values(out), out0);
  };

  ASSERT_OK_AND_ASSIGN(Tensor half, Tensor::Host(DType::kF16, {n, 2, 16}));
  EXPECT_TRUE(
      IsError(GatedDeltaRule(half, in.k, in.v, in.g, in.beta, s, in.state, out),
              absl::StatusCode::kInvalidArgument, "GatedDeltaRule: q is"));
  unchanged();

  const Tensor long_v = RandomTensor({n + 1, 4, 8}, 57);
  EXPECT_TRUE(IsError(
      GatedDeltaRule(in.q, in.k, long_v, in.g, in.beta, s, in.state, out),
      absl::StatusCode::kInvalidArgument, "GatedDeltaRule: v is"));
  unchanged();

  GatedDeltaNetShape three = s;
  three.v_heads = 3;
  EXPECT_TRUE(IsError(
      GatedDeltaRule(in.q, in.k, in.v, in.g, in.beta, three, in.state, out),
      absl::StatusCode::kInvalidArgument, "a multiple of k_heads"));
  unchanged();

  // [v_heads, v_dim, k_dim]: as many values, in the wrong layout.
  Tensor transposed = RandomTensor({4, 8, 16}, 58);
  const std::vector<float> transposed0 = Values(transposed);
  EXPECT_TRUE(IsError(
      GatedDeltaRule(in.q, in.k, in.v, in.g, in.beta, s, transposed, out),
      absl::StatusCode::kInvalidArgument, "GatedDeltaRule: state is"));
  EXPECT_EQ(Values(transposed), transposed0);
  unchanged();
}

TEST(GatedDeltaNetArgsTest, NormRefusesBadArgumentsAndChangesNothing) {
  const Tensor o = RandomTensor({3, 4, 16}, 60);
  const Tensor z = RandomTensor({3, 4, 16}, 61);
  const Tensor weight = RandomTensor({16}, 62);
  Tensor out = RandomTensor({3, 4, 16}, 63);
  const std::vector<float> out0 = Values(out);
  ASSERT_OK_AND_ASSIGN(Tensor half, Tensor::Host(DType::kF16, {3, 4, 16}));
  EXPECT_TRUE(IsError(GatedRmsNorm(o, half, weight, 1e-6f, out),
                      absl::StatusCode::kInvalidArgument,
                      "GatedRmsNorm: z is"));
  const Tensor short_weight = RandomTensor({8}, 64);
  EXPECT_TRUE(IsError(GatedRmsNorm(o, z, short_weight, 1e-6f, out),
                      absl::StatusCode::kInvalidArgument,
                      "GatedRmsNorm: weight is"));
  EXPECT_EQ(Values(out), out0);
}

}  // namespace
}  // namespace shardlm
