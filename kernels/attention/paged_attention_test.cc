#include "kernels/attention/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/half.h"
#include "gtest/gtest.h"
#include "kernels/batch_invariance.h"
#include "kernels/cpu_isa_testing.h"
#include "kernels/threading.h"
#include "testing/random_tensors.h"
#include "testing/status.h"

namespace shardlm {
namespace {

using testing_util::IsError;

using testing_util::RandomTensor;

// One token's K or V row of one head, as a cache of `dtype` stores it (the
// reference reads these values, so that the comparison measures the
// kernel, not the rounding). int8: scale max |x| / 127, as the kernel.
std::vector<float> Rounded(DType dtype, const float* x, int64_t d) {
  std::vector<float> out(x, x + d);
  if (dtype == DType::kI8) {
    float amax = 0;
    for (float v : out) amax = std::max(amax, std::abs(v));
    const float scale = amax / 127.0f;
    const float inv = scale > 0 ? 1.0f / scale : 0.0f;
    for (float& v : out) {
      v = std::clamp(std::nearbyint(v * inv), -127.0f, 127.0f) * scale;
    }
  }
  for (float& v : out) {
    if (dtype == DType::kF16) v = Fp16ToFloat(FloatToFp16(v));
    if (dtype == DType::kBF16) v = Bf16ToFloat(FloatToBf16(v));
  }
  return out;
}

struct Case {
  std::string name;
  int64_t heads, kv_heads, d, bs;
  std::vector<int64_t> lens;        // Context of each sequence after the step.
  std::vector<int64_t> new_tokens;  // Of which the step computes the last.
  int64_t window = 0;               // Sliding window; 0: none.
  float softcap = 0;                // Score soft-capping; 0: none.
  std::vector<float> sinks = {};    // Per query head; empty: none.
};

// Sequences with contiguous ground-truth K/V [len, kv_heads, d], scattered
// through shuffled block tables over a pool twice the size they need (on
// CPUs the host tier is the same memory, ids above the device tier).
struct Fixture {
  Case c;
  DType dtype;
  int64_t blocks = 0;
  std::vector<Tensor> k, v;
  // k and v as the cache stores them (Rounded, row by row of each head),
  // computed once: the reference reads every row for every query.
  std::vector<std::vector<float>> k_stored, v_stored;
  std::vector<std::vector<int32_t>> tables;
  Tensor k_cache, v_cache;

  Fixture(Case cs, DType dt) : c(std::move(cs)), dtype(dt) {
    for (int64_t len : c.lens) blocks += 2 * ((len + c.bs - 1) / c.bs);
    std::vector<int32_t> free(blocks);
    std::iota(free.begin(), free.end(), 0);
    std::shuffle(free.begin(), free.end(), std::mt19937(5));
    for (size_t s = 0; s < c.lens.size(); ++s) {
      k.push_back(RandomTensor({c.lens[s], c.kv_heads, c.d}, 10 + s));
      v.push_back(RandomTensor({c.lens[s], c.kv_heads, c.d}, 20 + s));
      k_stored.push_back(Stored(k.back()));
      v_stored.push_back(Stored(v.back()));
      std::vector<int32_t> table;
      for (int64_t b = 0; b < (c.lens[s] + c.bs - 1) / c.bs; ++b) {
        table.push_back(free.back());
        free.pop_back();
      }
      tables.push_back(table);
    }
    k_cache = *Tensor::Host(
        dtype, KeyCacheShape(blocks, c.bs, c.kv_heads, c.d, dtype));
    v_cache = *Tensor::Host(
        dtype, ValueCacheShape(blocks, c.bs, c.kv_heads, c.d, dtype));
  }

  std::vector<float> Stored(const Tensor& t) const {
    std::vector<float> out;
    out.reserve(t.numel());
    for (int64_t r = 0; r < t.numel() / c.d; ++r) {
      const std::vector<float> row =
          Rounded(dtype, t.f32().data() + r * c.d, c.d);
      out.insert(out.end(), row.begin(), row.end());
    }
    return out;
  }

  // Writes positions [from(s), to(s)) of every sequence through WriteKv in
  // one call, as a step does; returns the step's positions and sequences.
  void Write(const std::vector<int64_t>& from, const std::vector<int64_t>& to,
             std::vector<int32_t>& positions, std::vector<int32_t>& seqs) {
    positions.clear();
    seqs.clear();
    for (size_t s = 0; s < c.lens.size(); ++s) {
      for (int64_t p = from[s]; p < to[s]; ++p) {
        positions.push_back(static_cast<int32_t>(p));
        seqs.push_back(static_cast<int32_t>(s));
      }
    }
    const int64_t n = static_cast<int64_t>(positions.size());
    if (n == 0) return;
    const int64_t row = c.kv_heads * c.d;
    Tensor nk = *Tensor::Host(DType::kF32, {n, c.kv_heads, c.d});
    Tensor nv = *Tensor::Host(DType::kF32, {n, c.kv_heads, c.d});
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(k[seqs[i]].f32().data() + positions[i] * row, row,
                  nk.f32().data() + i * row);
      std::copy_n(v[seqs[i]].f32().data() + positions[i] * row, row,
                  nv.f32().data() + i * row);
    }
    ASSERT_TRUE(WriteKv(nk, nv, Batch(positions, seqs), k_cache, v_cache).ok());
  }

  AttentionBatch Batch(const std::vector<int32_t>& positions,
                       const std::vector<int32_t>& seqs) const {
    AttentionBatch b{.positions = positions,
                     .token_seq = seqs,
                     .window = c.window,
                     .softcap = c.softcap,
                     .sinks = c.sinks};
    for (const auto& t : tables) b.block_tables.push_back(t);
    return b;
  }

  // Naive causal attention of one query row of head h over positions [0,
  // pos] (the last c.window of them when set), its scores soft-capped (in
  // double) when c.softcap is set, exp(its sink) in the denominator when
  // c.sinks is.
  std::vector<double> Reference(const float* q, int64_t seq, int64_t h,
                                int64_t pos, double scale) const {
    const int64_t kvh = h / (c.heads / c.kv_heads);
    const int64_t kv_heads = c.kv_heads, d = c.d;
    const auto row = [&](const std::vector<float>& t, int64_t j) {
      return t.data() + (j * kv_heads + kvh) * d;
    };
    const int64_t first =
        c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
    std::vector<double> s(pos + 1, -INFINITY), out(d, 0.0);
    double max = -INFINITY, sum = 0;
    for (int64_t j = first; j <= pos; ++j) {
      const float* kj = row(k_stored[seq], j);
      double dot = 0;
      for (int64_t e = 0; e < d; ++e) dot += q[e] * double{kj[e]};
      s[j] = dot * scale;
      if (c.softcap > 0) s[j] = c.softcap * std::tanh(s[j] / c.softcap);
      max = std::max(max, s[j]);
    }
    const double sink = c.sinks.empty() ? -INFINITY : c.sinks[h];
    max = std::max(max, sink);
    if (!c.sinks.empty()) sum = std::exp(sink - max);
    for (double& x : s) sum += (x = std::exp(x - max));
    for (int64_t j = first; j <= pos; ++j) {
      const float* vj = row(v_stored[seq], j);
      for (int64_t e = 0; e < d; ++e) out[e] += s[j] / sum * vj[e];
    }
    return out;
  }
};

// The largest error of one step of `c` against the naive reference: the
// earlier positions are written by a first step, the new ones by this one.
double StepError(const Case& c, DType dtype) {
  Fixture f(c, dtype);
  std::vector<int64_t> start, end = c.lens;
  for (size_t s = 0; s < c.lens.size(); ++s) {
    start.push_back(c.lens[s] - c.new_tokens[s]);
  }
  std::vector<int32_t> positions, seqs;
  f.Write(std::vector<int64_t>(c.lens.size(), 0), start, positions, seqs);
  f.Write(start, end, positions, seqs);
  const AttentionBatch batch = f.Batch(positions, seqs);
  const int64_t n = static_cast<int64_t>(positions.size());
  Tensor q = RandomTensor({n, c.heads, c.d}, 3, 2.0f);
  Tensor out = *Tensor::Host(DType::kF32, {n, c.heads, c.d});
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  EXPECT_TRUE(PagedAttention(q, f.k_cache, f.v_cache, batch, scale, out).ok());
  // The reference depends on the case and the cache's type, not on the
  // ISA or the threads the kernel runs with: computed once per case and
  // type (in double it takes most of the test's time, under ASan seconds
  // a case), and kept for the other instances of the test.
  static std::map<std::pair<std::string, DType>, std::vector<double>> cache;
  std::vector<double>& want = cache[{c.name, dtype}];
  if (want.empty()) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < c.heads; ++h) {
        const auto row = f.Reference(q.f32().data() + (i * c.heads + h) * c.d,
                                     seqs[i], h, positions[i], scale);
        want.insert(want.end(), row.begin(), row.end());
      }
    }
  }
  if (want.size() != static_cast<size_t>(out.numel())) {
    ADD_FAILURE() << "the kept reference has " << want.size() << " values";
    return INFINITY;
  }
  return MaxAbsDiff(out.f32().data(), want.data(), want.size());
}

const Case kCases[] = {
    // Decode at contexts around a block boundary; SmolLM2's 9 over 3 heads.
    {"decode ctx 1/15/16/17", 9, 3, 64, 16, {1, 15, 16, 17}, {1, 1, 1, 1}},
    // One long decode: too few tiles for the threads, so the context is
    // split and the partial softmaxes merged.
    {"decode ctx 4097 (split)", 9, 3, 64, 16, {4097}, {1}},
    // A prefill chunk late in a long context, next to a decode.
    {"chunk at 4097 + decode", 9, 3, 64, 16, {4097, 33}, {70, 1}},
    {"mixed prefill 37 + decode 71", 9, 3, 64, 16, {37, 71}, {37, 1}},
    {"no GQA (group 1)", 4, 4, 64, 16, {17, 33}, {17, 1}},
    {"group 4, prefill 200", 8, 2, 64, 16, {200}, {200}},
    {"head_dim 128", 4, 1, 128, 16, {65, 3}, {65, 1}},
    // Neither block size nor head_dim a multiple of the vector width.
    {"block 5, head_dim 40", 6, 2, 40, 5, {23, 9, 1}, {10, 1, 1}},
    // Sliding windows (Mistral): smaller than a block, a block, not a
    // multiple of the block, larger than the context; with splits.
    {"window 20, decode ctx 4097 (split)", 9, 3, 64, 16, {4097}, {1}, 20},
    {"window 1, prefill + decode", 9, 3, 64, 16, {37, 71}, {37, 1}, 1},
    {"window 16, chunk at 4097 + decode",
     9,
     3,
     64,
     16,
     {4097, 33},
     {70, 1},
     16},
    {"window 7, group 4, prefill 200", 8, 2, 64, 16, {200}, {200}, 7},
    {"window 1000 > context", 9, 3, 64, 16, {37, 71}, {37, 1}, 1000},
    {"window 12, block 5", 6, 2, 40, 5, {23, 9, 1}, {10, 1, 1}, 12},
    {"window 600, decode ctx 4097 (split)", 9, 3, 64, 16, {4097}, {1}, 600},
    // Gemma 2's soft-capping, tight enough that most scores saturate
    // (|q.k| / 8 reaches ~10 here): decode with splits, a windowed prefill
    // chunk, a cap that changes little.
    {"softcap 1, decode ctx 4097 (split)", 9, 3, 64, 16, {4097}, {1}, 0, 1.0f},
    {"softcap 2, window 20, chunk + decode",
     8,
     4,
     64,
     16,
     {300, 33},
     {70, 1},
     20,
     2.0f},
    {"softcap 50, block 5", 6, 2, 40, 5, {23, 9, 1}, {10, 1, 1}, 0, 50.0f},
    // gpt-oss's attention sinks, of the scores' size (up to ~10 here):
    // decode split over the context (the sink joins the merge of the
    // splits once), a windowed chunk, with soft-capping.
    {"sinks, decode ctx 4097 (split)",
     4,
     2,
     64,
     16,
     {4097},
     {1},
     0,
     0,
     {2.0f, -1.0f, 8.0f, 0.5f}},
    {"sinks, window 20, chunk + decode",
     4,
     1,
     64,
     16,
     {300, 33},
     {70, 1},
     20,
     0,
     {3.0f, 0.0f, -2.0f, 5.0f}},
    {"sinks, softcap 2, block 5",
     2,
     2,
     40,
     5,
     {23, 9, 1},
     {10, 1, 1},
     0,
     2.0f,
     {1.0f, 2.5f}},
};

class PagedAttentionTest
    : public testing::TestWithParam<std::tuple<CpuIsa, DType>>,
      public OnCpuIsa {
 protected:
  void SetUp() override { Use(std::get<0>(GetParam())); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

TEST_P(PagedAttentionTest, MatchesNaiveAttention) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    EXPECT_LT(StepError(c, dtype()), 1e-5);
  }
}

// One thread takes every tile and split in turn; the result is the same.
TEST_P(PagedAttentionTest, MatchesNaiveAttentionOnOneThread) {
  const int before = CpuThreads();
  SetCpuThreads(1);
  for (const Case& c : {kCases[1], kCases[2], kCases[8], kCases[10]}) {
    SCOPED_TRACE(c.name);
    EXPECT_LT(StepError(c, dtype()), 1e-5);
  }
  SetCpuThreads(before);
}

// Batch-invariant (kernels/batch_invariance.h), a row's output does not
// depend on its step: the last token of a 700-token context (44 blocks,
// cut in parts of kInvariantSplitBlocks) alone, as the last of its
// sequence's five rows (a speculative step's verification), and beside
// another sequence's decode and a third's prefill chunk, bit for bit, on
// one thread and two. Still the naive attention.
TEST_P(PagedAttentionTest, BatchInvariantRowsDoNotDependOnTheirStep) {
  SetBatchInvariant(true);
  for (int64_t window : {int64_t{0}, int64_t{300}}) {
    Case c{"invariant", 9, 3, 64, 16, {700, 300, 40}, {0, 0, 0}, window};
    Fixture f(c, dtype());
    std::vector<int32_t> positions, seqs;
    f.Write({0, 0, 0}, c.lens, positions, seqs);
    const Tensor q_last = RandomTensor({1, c.heads, c.d}, 4, 2.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    const int64_t row = c.heads * c.d;
    // Runs one step; returns the output row of seq 0's position 699.
    const auto run = [&](std::vector<int32_t> pos, std::vector<int32_t> seq) {
      const int64_t n = static_cast<int64_t>(pos.size());
      Tensor q = RandomTensor({n, c.heads, c.d}, 8, 2.0f);
      int64_t at = -1;
      for (int64_t i = 0; i < n; ++i) {
        if (seq[i] == 0 && pos[i] == 699) at = i;
      }
      std::copy_n(q_last.f32().begin(), row, q.f32().begin() + at * row);
      Tensor out = *Tensor::Host(DType::kF32, {n, c.heads, c.d});
      const absl::Status st = PagedAttention(q, f.k_cache, f.v_cache,
                                             f.Batch(pos, seq), scale, out);
      EXPECT_TRUE(st.ok()) << st;
      return std::vector<float>(out.f32().begin() + at * row,
                                out.f32().begin() + (at + 1) * row);
    };
    const int before = CpuThreads();
    for (int threads : {1, 2}) {
      SCOPED_TRACE(::testing::Message()
                   << "window " << window << " threads " << threads);
      SetCpuThreads(threads);
      const std::vector<float> alone = run({699}, {0});
      EXPECT_EQ(run({695, 696, 697, 698, 699}, {0, 0, 0, 0, 0}), alone);
      std::vector<int32_t> pos = {299, 699}, seq = {1, 0};
      for (int32_t p = 0; p < 40; ++p) pos.push_back(p), seq.push_back(2);
      EXPECT_EQ(run(pos, seq), alone);
      std::vector<double> want;
      for (int64_t h = 0; h < c.heads; ++h) {
        const auto r =
            f.Reference(q_last.f32().data() + h * c.d, 0, h, 699, scale);
        want.insert(want.end(), r.begin(), r.end());
      }
      EXPECT_LT(MaxAbsDiff(alone.data(), want.data(), want.size()), 1e-5);
    }
    SetCpuThreads(before);
  }
  SetBatchInvariant(false);
}

INSTANTIATE_TEST_SUITE_P(
    IsasAndKvDTypes, PagedAttentionTest,
    testing::Combine(testing::ValuesIn(TestIsas()),
                     testing::Values(DType::kF32, DType::kF16, DType::kBF16,
                                     DType::kI8)),
    [](const auto& info) {
      return std::string(CpuIsaName(std::get<0>(info.param))) + "_" +
             DTypeName(std::get<1>(info.param));
    });

// Compact caches round each stored value once: against an f32 cache the
// outputs differ by about the rounding of V (|v| ~ 1, max |v| ~ 3 here),
// not more.
class PagedAttentionDTypeTest : public testing::TestWithParam<CpuIsa>,
                                public OnCpuIsa {
 protected:
  void SetUp() override { Use(GetParam()); }
};

TEST_P(PagedAttentionDTypeTest, CompactCachesStayCloseToF32) {
  const Case c = kCases[3];
  for (auto [dtype, bound] :
       {std::pair{DType::kF16, 2e-3}, std::pair{DType::kBF16, 1.6e-2},
        std::pair{DType::kI8, 3e-2}}) {
    Fixture f32(c, DType::kF32), half(c, dtype);
    std::vector<int32_t> positions, seqs;
    const std::vector<int64_t> zero(c.lens.size(), 0);
    f32.Write(zero, c.lens, positions, seqs);
    half.Write(zero, c.lens, positions, seqs);
    const int64_t n = static_cast<int64_t>(positions.size());
    Tensor q = RandomTensor({n, c.heads, c.d}, 4);
    Tensor a = *Tensor::Host(DType::kF32, {n, c.heads, c.d});
    Tensor b = *Tensor::Host(DType::kF32, {n, c.heads, c.d});
    ASSERT_TRUE(PagedAttention(q, f32.k_cache, f32.v_cache,
                               f32.Batch(positions, seqs), 0.125f, a)
                    .ok());
    ASSERT_TRUE(PagedAttention(q, half.k_cache, half.v_cache,
                               half.Batch(positions, seqs), 0.125f, b)
                    .ok());
    const double diff = MaxAbsDiff(a.f32(), b.f32());
    EXPECT_GT(diff, 0) << DTypeName(dtype) << " rounded nothing";
    EXPECT_LT(diff, bound) << DTypeName(dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, PagedAttentionDTypeTest,
                         testing::ValuesIn(TestIsas()), [](const auto& info) {
                           return std::string(CpuIsaName(info.param));
                         });

TEST(PagedAttentionTest, RejectsBadBlockTables) {
  Fixture f({"", 3, 3, 64, 16, {20}, {1}}, DType::kF32);
  const std::vector<int32_t> positions = {19}, token_seq = {0};
  const std::vector<int32_t> short_table = {f.tables[0][0]};
  const std::vector<int32_t> bad_block = {0, static_cast<int32_t>(f.blocks)};
  Tensor q = RandomTensor({1, 3, 64}, 1);
  Tensor out = *Tensor::Host(DType::kF32, {1, 3, 64});
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const std::string outside =
      "PagedAttention: physical block " + std::to_string(f.blocks) +
      " outside the pool of " + std::to_string(f.blocks);
  for (const auto& [table, why] :
       {std::pair{short_table, std::string("PagedAttention: sequence 0 has 1 "
                                           "blocks, position 19 needs 2")},
        std::pair{bad_block, outside}}) {
    AttentionBatch batch{.positions = positions,
                         .token_seq = token_seq,
                         .block_tables = {table}};
    EXPECT_TRUE(
        IsError(PagedAttention(q, f.k_cache, f.v_cache, batch, 1.0f, out),
                kInvalid, why));
  }
  const std::vector<int32_t> bad_seq = {1};
  AttentionBatch batch{.positions = positions,
                       .token_seq = bad_seq,
                       .block_tables = {f.tables[0]}};
  EXPECT_TRUE(IsError(PagedAttention(q, f.k_cache, f.v_cache, batch, 1.0f, out),
                      kInvalid, "PagedAttention: token 0 has sequence 1"));
}

// Padding sequences (a CUDA graph's fixed batch size) attend as any other
// but write no K/V: the real rows' outputs and the caches are those of the
// step without them.
TEST(PagedAttentionTest, PaddingSequencesWriteNothing) {
  const int64_t heads = 4, kv_heads = 2, d = 32, bs = 16, blocks = 8;
  const auto random_cache = [&](const Shape& shape, uint32_t seed) {
    Tensor t = RandomTensor({blocks * bs * kv_heads * d}, seed);
    return *t.Reshaped(shape);
  };
  const Tensor k0 = random_cache(KeyCacheShape(blocks, bs, kv_heads, d), 1);
  const Tensor v0 = random_cache(ValueCacheShape(blocks, bs, kv_heads, d), 2);
  const auto copy = [](const Tensor& t) {
    Tensor c = *Tensor::Host(t.dtype(), t.shape());
    std::memcpy(c.raw(), t.raw(), t.bytes());
    return c;
  };
  // Three real decode tokens at contexts 5, 20 and 33, then two padding
  // sequences at position 0 whose tables name block 0, which sequence 0
  // holds (its slot 0 is a real key).
  const std::vector<std::vector<int32_t>> tables = {
      {0}, {3, 5}, {1, 2, 6}, {0}, {0}};
  const std::vector<int32_t> positions = {4, 19, 32, 0, 0};
  const std::vector<int32_t> token_seq = {0, 1, 2, 3, 4};
  const Tensor k = RandomTensor({5, kv_heads, d}, 3);
  const Tensor v = RandomTensor({5, kv_heads, d}, 4);
  const Tensor q = RandomTensor({5, heads, d}, 5);
  struct Run {
    Tensor k_cache, v_cache, out;
  };
  const auto run = [&](int64_t n, int64_t padding) {
    Run r{copy(k0), copy(v0), *Tensor::Host(DType::kF32, {n, heads, d})};
    AttentionBatch batch{.positions = absl::MakeConstSpan(positions).first(n),
                         .token_seq = absl::MakeConstSpan(token_seq).first(n),
                         .padding = padding};
    for (int64_t s = 0; s < n; ++s) batch.block_tables.push_back(tables[s]);
    const absl::Status wrote =
        WriteKv(*k.Rows(0, n), *v.Rows(0, n), batch, r.k_cache, r.v_cache);
    EXPECT_TRUE(wrote.ok()) << wrote;
    const absl::Status attended = PagedAttention(
        *q.Rows(0, n), r.k_cache, r.v_cache, batch, 0.125f, r.out);
    EXPECT_TRUE(attended.ok()) << attended;
    return r;
  };
  const Run real = run(3, 0), padded = run(5, 2), unmarked = run(5, 0);
  const auto same_bytes = [](const Tensor& a, const Tensor& b) {
    return a.bytes() == b.bytes() &&
           std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
  };
  EXPECT_TRUE(same_bytes(padded.k_cache, real.k_cache));
  EXPECT_TRUE(same_bytes(padded.v_cache, real.v_cache));
  // Unmarked, the same tokens overwrite sequence 0's first key.
  EXPECT_FALSE(same_bytes(unmarked.k_cache, real.k_cache));
  const float* a = real.out.data<float>();
  const float* b = padded.out.data<float>();
  for (int64_t i = 0; i < 3 * heads * d; ++i) {
    ASSERT_NEAR(b[i], a[i], 1e-5f * (1.0f + std::fabs(a[i]))) << "at " << i;
  }
  // At least one must be real; no more than there are.
  AttentionBatch all_padding{.positions = absl::MakeConstSpan(positions),
                             .token_seq = absl::MakeConstSpan(token_seq),
                             .padding = 5};
  for (const auto& t : tables) all_padding.block_tables.push_back(t);
  Tensor kc = copy(k0), vc = copy(v0);
  EXPECT_TRUE(IsError(WriteKv(k, v, all_padding, kc, vc),
                      absl::StatusCode::kInvalidArgument,
                      "WriteKv: 5 padding sequences of 5"));
}

// Caches of another type, of two types, or in the CUDA layout are refused.
TEST(PagedAttentionTest, RejectsCachesItCannotRead) {
  Fixture f({"", 3, 3, 64, 16, {20}, {1}}, DType::kF32);
  const std::vector<int32_t> positions = {19}, token_seq = {0};
  const AttentionBatch batch = f.Batch(positions, token_seq);
  Tensor q = RandomTensor({1, 3, 64}, 1);
  Tensor out = *Tensor::Host(DType::kF32, {1, 3, 64});
  Tensor k16 = *Tensor::Host(DType::kF16, f.k_cache.shape());
  Tensor q8 = *Tensor::Host(DType::kQ8_0, {3, f.blocks, 16, 64});
  Tensor cuda_layout =
      *Tensor::Host(DType::kF32, {f.blocks, 16, 3, 64});  // [blocks, bs, ...]
  EXPECT_EQ(PagedAttention(q, k16, f.v_cache, batch, 1.0f, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PagedAttention(q, f.k_cache, q8, batch, 1.0f, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PagedAttention(q, cuda_layout, f.v_cache, batch, 1.0f, out).code(),
            absl::StatusCode::kInvalidArgument);
  Tensor k = RandomTensor({1, 3, 64}, 2);
  EXPECT_EQ(WriteKv(k, k, batch, k16, f.v_cache).code(),
            absl::StatusCode::kInvalidArgument);
}

// The CUDA decode kernel's plan (cuda_decode_plan.h), worked by hand for an
// H200's 132 SMs and Llama-3-8B's heads (32 over 8): a block per (token,
// KV head, split), about three blocks per SM, no split under 32 keys.
TEST(CudaDecodePlanTest, SplitsFillTheGpuWithoutTinySplits) {
  // One token: 8 blocks per split; 396 / 8 -> 50 splits would fill the GPU.
  EXPECT_EQ(CudaDecodeSplits(136, 1, 32, 8, 132), 5);  // 136 keys / 32.
  EXPECT_EQ(CudaDecodeSplits(2048, 1, 32, 8, 132), 50);
  EXPECT_EQ(CudaDecodeSplits(100000, 1, 32, 8, 132), 50);
  // 64 tokens are 512 blocks already.
  EXPECT_EQ(CudaDecodeSplits(2048, 64, 32, 8, 132), 1);
  // At most kMaxCudaDecodeSplits; at least one, even for no keys.
  EXPECT_EQ(CudaDecodeSplits(1 << 20, 1, 1, 1, 10000), kMaxCudaDecodeSplits);
  EXPECT_EQ(CudaDecodeSplits(0, 1, 32, 8, 132), 1);
  EXPECT_EQ(CudaDecodeSplits(32, 1, 32, 8, 132), 1);
  EXPECT_EQ(CudaDecodeSplits(33, 1, 32, 8, 132), 2);
  // A group of 20 heads takes two blocks of up to 16 heads.
  EXPECT_EQ(CudaDecodeBlocks(1, 40, 2), 4);
  EXPECT_EQ(CudaDecodeBlocks(3, 32, 8), 24);
  // The workspace: per (token, query head, split) max, sum and head_dim.
  EXPECT_EQ(CudaDecodeWorkspaceFloats(2, 32, 128, 3), 2 * 32 * 3 * 130);
  EXPECT_EQ(CudaDecodeWorkspaceFloats(2, 32, 128, 1), 0);
}

}  // namespace
}  // namespace shardlm
