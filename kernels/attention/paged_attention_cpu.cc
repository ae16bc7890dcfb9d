// The CPU paged attention (paged_attention.h): argument checks, WriteKv,
// and the split of a step into items run on the OpenMP team and merged;
// the items' arithmetic is the ISA's kernel (paged_attention_kernels.h).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/half.h"
#include "core/status.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/attention/paged_attention_kernels.h"
#include "kernels/batch_invariance.h"
#include "kernels/check_args.h"
#include "kernels/cpu_isa.h"
#include "kernels/threading.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace shardlm {
namespace {

using attention_kernels::Item;
using attention_kernels::Kernels;
using attention_kernels::Problem;
using attention_kernels::RunItemFn;
using attention_kernels::Scratch;
using attention_kernels::Tile;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// PagedAttention, and with `lse` (not null) PagedAttentionPartial.
absl::Status RunAttention(const Tensor& q, const Tensor& k_cache,
                          const Tensor& v_cache, const AttentionBatch& batch,
                          float scale, Tensor& out, Tensor* lse);

// The attention kernels of the ISA kernels/cpu_isa.h chose.
Kernels KernelsForCpu() {
  switch (ActiveCpuIsa()) {
    case CpuIsa::kAvx512:
      return attention_kernels::Avx512();
    case CpuIsa::kAvx2:
      return attention_kernels::Avx2();
    default:
      return attention_kernels::Portable();
  }
}

// Cache element types: how a token's K and V are stored in a KV head's
// block (the kernels read them back: paged_attention_kernels.inc).

// Types of one value per element: Encode one value.
template <typename E>
struct PlainKv {
  static int64_t HeadBlock(int64_t d, int64_t bs) { return d * bs; }
  template <typename T>
  static void WriteToken(const float* k, const float* v, int64_t d, int64_t bs,
                         int64_t o, T* kb, T* vb) {
    for (int64_t e = 0; e < d; ++e) kb[e * bs + o] = E::Encode(k[e]);
    for (int64_t e = 0; e < d; ++e) vb[o * d + e] = E::Encode(v[e]);
  }
};

struct F32 : PlainKv<F32> {
  using T = float;
  static T Encode(float x) { return x; }
};

struct F16 : PlainKv<F16> {
  using T = uint16_t;
  static T Encode(float x) {
#if defined(__F16C__)
    return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
#else
    return FloatToFp16(x);
#endif
  }
};

struct Bf16 : PlainKv<Bf16> {
  using T = uint16_t;
  static T Encode(float x) { return FloatToBf16(x); }
};

// int8 with an f32 scale (max |x| / 127) per token and KV head, for K and
// for V. A KV head's block is K [d + 4, bs] (rows d..d+3 hold the bs keys'
// scales as f32) and V [bs, d + 4] (each key's d values, then its scale).
struct I8 {
  using T = int8_t;
  static int64_t HeadBlock(int64_t d, int64_t bs) { return (d + 4) * bs; }
  // Quantizes x[0, d) into q[0], q[stride], ...; returns the scale.
  static float Quantize(const float* x, int64_t d, int64_t stride, T* q) {
    float amax = 0;
    for (int64_t e = 0; e < d; ++e) amax = std::max(amax, std::abs(x[e]));
    const float scale = amax / 127.0f;
    const float inv = scale > 0 ? 1.0f / scale : 0.0f;
    for (int64_t e = 0; e < d; ++e) {
      q[e * stride] = static_cast<T>(
          std::clamp(std::nearbyint(x[e] * inv), -127.0f, 127.0f));
    }
    return scale;
  }
  static void WriteToken(const float* k, const float* v, int64_t d, int64_t bs,
                         int64_t o, T* kb, T* vb) {
    const float ks = Quantize(k, d, bs, kb + o);
    std::memcpy(kb + d * bs + o * 4, &ks, sizeof ks);
    const float vs = Quantize(v, d, 1, vb + o * (d + 4));
    std::memcpy(vb + o * (d + 4) + d, &vs, sizeof vs);
  }
};

// Checks cache shapes and types and that every token's positions map to
// valid physical blocks. `d` and `kv_heads` come from the queries or new
// keys; the caches must agree.
absl::Status CheckBatch(const char* op, const AttentionBatch& batch, int64_t n,
                        const Tensor& k_cache, const Tensor& v_cache,
                        int64_t kv_heads, int64_t d) {
  if (v_cache.rank() != 4 || k_cache.rank() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": caches must be 4-D, got ", k_cache.DebugString(),
                     " and ", v_cache.DebugString()));
  }
  const int64_t blocks = v_cache.dim(1), bs = v_cache.dim(2);
  const Shape k_shape = KeyCacheShape(blocks, bs, kv_heads, d, k_cache.dtype());
  const Shape v_shape =
      ValueCacheShape(blocks, bs, kv_heads, d, k_cache.dtype());
  for (const Tensor* t : {&k_cache, &v_cache}) {
    const Shape& want = t == &k_cache ? k_shape : v_shape;
    if (t->empty() || t->memory() == MemoryType::kDevice ||
        !IsCpuKvDType(t->dtype()) || t->dtype() != k_cache.dtype() ||
        t->shape() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ", t == &k_cache ? "k_cache" : "v_cache", " is ",
          t->empty() ? "empty" : t->DebugString(),
          "; expected host f32, f16, bf16 or I8 (both caches alike) of shape ",
          ShapeString(want)));
    }
  }
  if (static_cast<int64_t>(batch.positions.size()) != n ||
      static_cast<int64_t>(batch.token_seq.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", n, " tokens but ", batch.positions.size(),
                     " positions and ", batch.token_seq.size(), " seq ids"));
  }
  const int64_t n_seqs = static_cast<int64_t>(batch.block_tables.size());
  if (batch.padding < 0 || (batch.padding > 0 && batch.padding >= n_seqs)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", batch.padding, " padding sequences of ", n_seqs,
                     " (at least one must be real)"));
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = batch.token_seq[i], pos = batch.positions[i];
    if (s < 0 || s >= n_seqs || pos < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": token ", i, " has sequence ", s, " position ", pos));
    }
    const auto& table = batch.block_tables[s];
    if (static_cast<int64_t>(table.size()) <= pos / bs) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": sequence ", s, " has ", table.size(),
                       " blocks, position ", pos, " needs ", pos / bs + 1));
    }
  }
  for (const auto& table : batch.block_tables) {
    for (int32_t b : table) {
      if (b == -1 && batch.remote_blocks) continue;  // Another CP rank's.
      if (b < 0 || b >= blocks) {
        return absl::InvalidArgumentError(absl::StrCat(
            op, ": physical block ", b, " outside the pool of ", blocks));
      }
    }
  }
  return absl::OkStatus();
}

template <typename E>
void WriteKvAs(const Tensor& k, const Tensor& v, const AttentionBatch& batch,
               Tensor& k_cache, Tensor& v_cache) {
  const int64_t n = k.dim(0), kv_heads = k.dim(1), d = k.dim(2);
  const int64_t blocks = v_cache.dim(1), bs = v_cache.dim(2);
  using T = typename E::T;
  T* kc = k_cache.data<T>();
  T* vc = v_cache.data<T>();
  const int64_t first_padding =
      static_cast<int64_t>(batch.block_tables.size()) - batch.padding;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t pos = batch.positions[i];
    if (batch.token_seq[i] >= first_padding) continue;  // Writes nothing.
    const int64_t block = batch.block_tables[batch.token_seq[i]][pos / bs];
    if (block < 0) continue;  // Another CP rank's (remote_blocks).
    const int64_t o = pos % bs;
    for (int64_t g = 0; g < kv_heads; ++g) {
      const float* ki = k.data<float>() + (i * kv_heads + g) * d;
      const float* vi = v.data<float>() + (i * kv_heads + g) * d;
      const int64_t at = (g * blocks + block) * E::HeadBlock(d, bs);
      E::WriteToken(ki, vi, d, bs, o, kc + at, vc + at);
    }
  }
}

// ---------------------------------------------------------------------------
// Attention: the step is split into items (paged_attention_kernels.h),
// which the ISA's kernel runs on the OpenMP team.

// Merges the partial softmaxes of one tile's splits (items [begin, end) of
// one KV head, in key order) into the output.
void MergeSplits(const Problem& p, const Tile& tile,
                 absl::Span<const Item> splits, const float* parts) {
  const int64_t d = p.d;
  for (int64_t t = 0; t < tile.count; ++t) {
    const int64_t tok = p.order[tile.first + t];
    for (int64_t g = 0; g < p.group; ++g) {
      const int64_t r = t * p.group + g, h = splits[0].kvh * p.group + g;
      float m = kNegInf;
      for (const Item& it : splits) {
        m = std::max(m, parts[it.part + r * p.part_row()]);
      }
      float* dst = p.out + (tok * p.heads + h) * d;
      std::fill(dst, dst + d, 0.0f);
      float l = 0;
      for (const Item& it : splits) {
        const float* part = parts + it.part + r * p.part_row();
        if (part[1] == 0) continue;  // No key of this row in the split.
        const float wgt = std::exp(part[0] - m);
        l += part[1] * wgt;
        for (int64_t e = 0; e < d; ++e) dst[e] += part[2 + e] * wgt;
      }
      if (p.lse != nullptr) {  // A CP part: it may hold none of the keys.
        p.lse[tok * p.heads + h] = l == 0 ? kNegInf : m + std::log(l);
        if (l == 0) continue;  // dst stays 0.
      } else if (!p.batch->sinks.empty()) {
        l += std::exp(p.batch->sinks[h] - m);  // A row always has a key.
      }
      const float inv = 1.0f / l;
      for (int64_t e = 0; e < d; ++e) dst[e] *= inv;
    }
  }
}

void Attend(Problem& p, RunItemFn run_item) {
  const AttentionBatch& batch = *p.batch;
  const int64_t n = static_cast<int64_t>(batch.positions.size());
  // Tokens by sequence, then position.
  p.order.resize(n);
  for (int64_t i = 0; i < n; ++i) p.order[i] = i;
  std::stable_sort(p.order.begin(), p.order.end(), [&](int64_t a, int64_t b) {
    return batch.token_seq[a] != batch.token_seq[b]
               ? batch.token_seq[a] < batch.token_seq[b]
               : batch.positions[a] < batch.positions[b];
  });
  // About 48 rows per tile: Q, accumulators and one block of K and V stay
  // in L1/L2 while the tile walks the context.
  const int64_t tile_tokens = std::max<int64_t>(1, 48 / p.group);
  std::vector<Tile> tiles;
  for (int64_t i = 0; i < n;) {
    Tile t{.seq = batch.token_seq[p.order[i]], .first = i};
    // Tokens are in position order: the first one's window starts first.
    if (batch.window > 0) {
      t.key_begin =
          std::max<int64_t>(0, batch.positions[p.order[i]] - batch.window + 1);
    }
    while (i < n && batch.token_seq[p.order[i]] == t.seq &&
           t.count < tile_tokens) {
      t.context = std::max<int64_t>(t.context, batch.positions[p.order[i]] + 1);
      ++t.count;
      ++i;
    }
    tiles.push_back(t);
  }
  // Split the context when there are too few (tile, KV head) pairs to keep
  // every thread busy, in runs of at least 16 blocks.
  const int64_t threads = CpuThreads();
  const int64_t pairs = static_cast<int64_t>(tiles.size()) * p.kv_heads;
  // Eight items per thread or more: dynamic scheduling then evens out
  // the threads to within an eighth of one's work.
  const int64_t want =
      pairs >= 8 * threads ? 1 : (8 * threads + pairs - 1) / pairs;
  const bool invariant = BatchInvariant();
  std::vector<Item> items;
  int64_t part_floats = 0;
  for (int64_t ti = 0; ti < static_cast<int64_t>(tiles.size()); ++ti) {
    const Tile& t = tiles[ti];
    // Blocks [b0, b1) hold the tile's keys; those before are out of
    // every token's window and never read.
    const int64_t b0 = t.key_begin / p.bs, b1 = (t.context + p.bs - 1) / p.bs;
    const int64_t blocks = b1 - b0;
    const int64_t splits =
        std::clamp<int64_t>(std::min(want, blocks / 16), 1, blocks);
    // Batch-invariant: parts are the runs of kInvariantSplitBlocks blocks
    // from block 0, whatever the step, so that a row's keys are always
    // cut (and merged) in the same places.
    const int64_t per =
        invariant ? kInvariantSplitBlocks : (blocks + splits - 1) / splits;
    const bool split = invariant ? b0 / per != (b1 - 1) / per : per < blocks;
    for (int64_t kvh = 0; kvh < p.kv_heads; ++kvh) {
      for (int64_t b = b0; b < b1;
           b = invariant ? (b / per + 1) * per : b + per) {
        const int64_t b_end = invariant ? (b / per + 1) * per : b + per;
        Item it{.tile = ti,
                .kvh = kvh,
                .k0 = b * p.bs,
                .k1 = std::min(t.context, b_end * p.bs)};
        it.cost = p.rows(t) * (it.k1 - it.k0);
        if (split) {
          it.part = part_floats;
          part_floats += p.rows(t) * p.part_row();
        }
        items.push_back(it);
      }
    }
  }
  std::vector<float> parts(part_floats);
  // Largest first, so that the long causal tiles do not finish last.
  std::vector<int64_t> by_cost(items.size());
  for (size_t i = 0; i < items.size(); ++i) by_cost[i] = i;
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](int64_t a, int64_t b) {
    return items[a].cost > items[b].cost;
  });
  const int64_t n_items = static_cast<int64_t>(items.size());
  // One item per chunk, claimed largest first: the items' costs differ too
  // much for ranges of several.
  ParallelFor(
      n_items,
      [&](int64_t begin, int64_t end) {
        thread_local Scratch w;  // Kept: its buffers only grow.
        for (int64_t i = begin; i < end; ++i) {
          const Item& it = items[by_cost[i]];
          run_item(p, tiles[it.tile], it, w, parts.data());
        }
      },
      n_items);
  // Items of one (tile, KV head) are adjacent and in key order.
  for (size_t i = 0; i < items.size();) {
    size_t j = i + 1;
    while (j < items.size() && items[j].tile == items[i].tile &&
           items[j].kvh == items[i].kvh) {
      ++j;
    }
    if (items[i].part >= 0) {
      MergeSplits(p, tiles[items[i].tile],
                  absl::MakeConstSpan(items).subspan(i, j - i), parts.data());
    }
    i = j;
  }
}

}  // namespace

Shape KeyCacheShape(int64_t blocks, int64_t block_size, int64_t kv_heads,
                    int64_t head_dim, DType dtype) {
  const int64_t rows = dtype == DType::kI8 ? head_dim + 4 : head_dim;
  return {kv_heads, blocks, rows, block_size};
}

Shape ValueCacheShape(int64_t blocks, int64_t block_size, int64_t kv_heads,
                      int64_t head_dim, DType dtype) {
  const int64_t row = dtype == DType::kI8 ? head_dim + 4 : head_dim;
  return {kv_heads, blocks, block_size, row};
}

bool IsCpuKvDType(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 ||
         t == DType::kI8;
}

absl::Status WriteKv(const Tensor& k, const Tensor& v,
                     const AttentionBatch& batch, Tensor& k_cache,
                     Tensor& v_cache) {
  if (k.rank() != 3) {
    return absl::InvalidArgumentError("WriteKv: k must be [n, kv_heads, d]");
  }
  const int64_t n = k.dim(0), kv_heads = k.dim(1), d = k.dim(2);
  RETURN_IF_ERROR(CheckHostF32("WriteKv", "k", k, {n, kv_heads, d}));
  RETURN_IF_ERROR(CheckHostF32("WriteKv", "v", v, {n, kv_heads, d}));
  RETURN_IF_ERROR(
      CheckBatch("WriteKv", batch, n, k_cache, v_cache, kv_heads, d));
  switch (k_cache.dtype()) {
    case DType::kF16:
      WriteKvAs<F16>(k, v, batch, k_cache, v_cache);
      break;
    case DType::kBF16:
      WriteKvAs<Bf16>(k, v, batch, k_cache, v_cache);
      break;
    case DType::kI8:
      WriteKvAs<I8>(k, v, batch, k_cache, v_cache);
      break;
    default:
      WriteKvAs<F32>(k, v, batch, k_cache, v_cache);
  }
  return absl::OkStatus();
}

absl::Status PagedAttention(const Tensor& q, const Tensor& k_cache,
                            const Tensor& v_cache, const AttentionBatch& batch,
                            float scale, Tensor& out) {
  return RunAttention(q, k_cache, v_cache, batch, scale, out, nullptr);
}

absl::Status PagedAttentionPartial(const Tensor& q, const Tensor& k_cache,
                                   const Tensor& v_cache,
                                   const AttentionBatch& batch, float scale,
                                   Tensor& out, Tensor& lse) {
  return RunAttention(q, k_cache, v_cache, batch, scale, out, &lse);
}

absl::Status MergeAttention(const Tensor& outs, const Tensor& lses, Tensor& out,
                            absl::Span<const float> sinks) {
  if (outs.rank() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("MergeAttention: outs must be [parts, n, heads, d], got ",
                     outs.DebugString()));
  }
  const int64_t parts = outs.dim(0), n = outs.dim(1), heads = outs.dim(2),
                d = outs.dim(3);
  RETURN_IF_ERROR(
      CheckHostF32("MergeAttention", "outs", outs, {parts, n, heads, d}));
  RETURN_IF_ERROR(
      CheckHostF32("MergeAttention", "lses", lses, {parts, n, heads}));
  RETURN_IF_ERROR(CheckHostF32("MergeAttention", "out", out, {n, heads, d}));
  if (!sinks.empty() && static_cast<int64_t>(sinks.size()) != heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MergeAttention: ", sinks.size(), " sinks for ", heads, " heads"));
  }
  const float* o = outs.data<float>();
  const float* lse = lses.data<float>();
  float* dst = out.data<float>();
  const int64_t rows = n * heads;
  for (int64_t r = 0; r < rows; ++r) {
    float m = kNegInf;
    for (int64_t p = 0; p < parts; ++p) m = std::max(m, lse[p * rows + r]);
    const bool sink = !sinks.empty();
    if (sink) m = std::max(m, sinks[r % heads]);
    if (m == kNegInf) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MergeAttention: row ", r, " (token ", r / heads, ", head ",
          r % heads, ") has no key in any of the ", parts, " parts"));
    }
    float* y = dst + r * d;
    std::fill(y, y + d, 0.0f);
    float l = sink ? std::exp(sinks[r % heads] - m) : 0.0f;
    for (int64_t p = 0; p < parts; ++p) {
      const float l_p = lse[p * rows + r];
      if (l_p == kNegInf) continue;
      const float w = std::exp(l_p - m);
      l += w;
      const float* x = o + (p * rows + r) * d;
      for (int64_t e = 0; e < d; ++e) y[e] += w * x[e];
    }
    const float inv = 1.0f / l;
    for (int64_t e = 0; e < d; ++e) y[e] *= inv;
  }
  return absl::OkStatus();
}

namespace {

absl::Status RunAttention(const Tensor& q, const Tensor& k_cache,
                          const Tensor& v_cache, const AttentionBatch& batch,
                          float scale, Tensor& out, Tensor* lse) {
  if (q.rank() != 3 || v_cache.rank() != 4) {
    return absl::InvalidArgumentError(
        "PagedAttention: q must be [n, heads, d], caches 4-D");
  }
  const int64_t n = q.dim(0), heads = q.dim(1), d = q.dim(2);
  const int64_t kv_heads = v_cache.dim(0);
  RETURN_IF_ERROR(CheckHostF32("PagedAttention", "q", q, {n, heads, d}));
  RETURN_IF_ERROR(CheckHostF32("PagedAttention", "out", out, {n, heads, d}));
  if (lse != nullptr) {
    RETURN_IF_ERROR(CheckHostF32("PagedAttention", "lse", *lse, {n, heads}));
  }
  if (kv_heads <= 0 || heads % kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: ", heads,
                                                   " query heads over ",
                                                   kv_heads, " KV heads"));
  }
  RETURN_IF_ERROR(
      CheckBatch("PagedAttention", batch, n, k_cache, v_cache, kv_heads, d));
  if (!(batch.softcap >= 0) || !std::isfinite(batch.softcap)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttention: softcap ", batch.softcap, " must be finite and >= 0"));
  }
  if (!batch.sinks.empty() &&
      static_cast<int64_t>(batch.sinks.size()) != heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttention: ", batch.sinks.size(), " sinks for ",
                     heads, " query heads"));
  }
  for (const float s : batch.sinks) {
    if (!std::isfinite(s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("PagedAttention: sink ", s, " is not finite"));
    }
  }
  if (n == 0) return absl::OkStatus();
  const Kernels kernels = KernelsForCpu();
  const int64_t bs = v_cache.dim(2), lanes = kernels.lanes;
  int64_t head_block = F32::HeadBlock(d, bs);
  RunItemFn run_item = kernels.f32;
  switch (k_cache.dtype()) {
    case DType::kF16:
      run_item = kernels.f16;
      break;
    case DType::kBF16:
      run_item = kernels.bf16;
      break;
    case DType::kI8:
      head_block = I8::HeadBlock(d, bs);
      run_item = kernels.i8;
      break;
    default:
      break;
  }
  Problem p{.q = q.data<float>(),
            .out = out.data<float>(),
            .k_cache = k_cache.raw(),
            .v_cache = v_cache.raw(),
            .batch = &batch,
            .heads = heads,
            .kv_heads = kv_heads,
            .group = heads / kv_heads,
            .d = d,
            .dp = (d + 63) / 64 * 64,  // UpdateRows takes 64 columns.
            .bs = bs,
            .bsp = (bs + lanes - 1) / lanes * lanes,
            .blocks = v_cache.dim(1),
            .head_block = head_block,
            .scale = scale};
  if (lse != nullptr) p.lse = lse->data<float>();
  Attend(p, run_item);
  return absl::OkStatus();
}

}  // namespace
}  // namespace shardlm
