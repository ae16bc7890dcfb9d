#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/half.h"
#include "core/status.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/check_args.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace shardlm {
namespace {

// Vectors of one register (GCC/Clang vector extensions): 16 floats with
// AVX-512, else 8 (AVX2's width). Wider than the register, the row tiles
// below spill: 16-float vectors on AVX2 held UpdateRows<4>'s 8 score and
// 16 value accumulators in 40 ymm registers of 16, and prefill attention
// ran at a third of the speed.
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#else
constexpr int64_t kLanes = 8;
#endif
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));
using IVec = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));
constexpr int64_t kAhead = 4;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t RoundUp(int64_t x) { return (x + kLanes - 1) / kLanes * kLanes; }
Vec Splat(float x) { return Vec{} + x; }
Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void Store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
float Max(Vec v) {
  float m = v[0];
  for (int64_t i = 1; i < kLanes; ++i) m = std::max(m, v[i]);
  return m;
}
float Sum(Vec v) {
  float s = 0;
  for (int64_t i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

// e^x, relative error ~1e-7 for x in [-87, 88] (Cephes' expf polynomial on
// x - n ln 2, times 2^n); smaller x gives ~1e-38, which callers mask.
Vec Exp(Vec x) {
  x = x < Splat(-87.0f) ? Splat(-87.0f) : x;
  x = x > Splat(88.0f) ? Splat(88.0f) : x;
  const Vec magic = Splat(12582912.0f);  // 1.5 * 2^23: rounds to integers.
  const Vec n = (x * 1.44269504f + magic) - magic;
  const Vec r = x - n * 0.693359375f - n * -2.12194440e-4f;
  Vec p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const IVec bits = (__builtin_convertvector(n, IVec) + 127) << 23;
  return p * std::bit_cast<Vec>(bits);
}

// Cache element types: how a token's K and V are stored in a KV head's
// block, and how a block is read back as f32 (K as [d, bsp], V as
// [bs, dp], padding untouched).

// Types of one value per element: Encode one value, Decode a run.
template <typename E>
struct PlainKv {
  static int64_t HeadBlock(int64_t d, int64_t bs) { return d * bs; }
  template <typename T>
  static void WriteToken(const float* k, const float* v, int64_t d, int64_t bs,
                         int64_t o, T* kb, T* vb) {
    for (int64_t e = 0; e < d; ++e) kb[e * bs + o] = E::Encode(k[e]);
    for (int64_t e = 0; e < d; ++e) vb[o * d + e] = E::Encode(v[e]);
  }
  template <typename T>
  static void DecodeBlock(const T* kb, const T* vb, int64_t d, int64_t bs,
                          int64_t bsp, int64_t dp, float* kt, float* vs) {
    if (bsp == bs) {
      E::Decode(kb, d * bs, kt);
    } else {
      for (int64_t e = 0; e < d; ++e) E::Decode(kb + e * bs, bs, kt + e * bsp);
    }
    if (dp == d) {
      E::Decode(vb, bs * d, vs);
    } else {
      for (int64_t j = 0; j < bs; ++j) E::Decode(vb + j * d, d, vs + j * dp);
    }
  }
};

struct F32 : PlainKv<F32> {
  using T = float;
  static T Encode(float x) { return x; }
  static void Decode(const T* s, int64_t n, float* d) {
    std::memcpy(d, s, n * sizeof(float));
  }
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
  static void Decode(const T* s, int64_t n, float* d) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
      // The maskz form: GCC 12 warns that _mm512_cvtph_ps reads an
      // undefined register.
      _mm512_storeu_ps(
          d + i, _mm512_maskz_cvtph_ps(
                     0xffff, _mm256_loadu_si256(
                                 reinterpret_cast<const __m256i*>(s + i))));
    }
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                  reinterpret_cast<const __m128i*>(s + i))));
    }
#endif
    for (; i < n; ++i) d[i] = Fp16ToFloat(s[i]);
  }
};

struct Bf16 : PlainKv<Bf16> {
  using T = uint16_t;
  static T Encode(float x) { return FloatToBf16(x); }
  static void Decode(const T* s, int64_t n, float* d) {
    for (int64_t i = 0; i < n; ++i) {
      d[i] = std::bit_cast<float>(static_cast<uint32_t>(s[i]) << 16);
    }
  }
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
  // kLanes int8 values as f32 (GCC 12 scalarizes __builtin_convertvector
  // of int8 vectors, hence the intrinsics).
  static Vec Widen(const T* q) {
#if defined(__AVX512F__)
    // maskz: see F16::Decode.
    return std::bit_cast<Vec>(_mm512_maskz_cvtepi32_ps(
        0xffff,
        _mm512_maskz_cvtepi8_epi32(
            0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)))));
#elif defined(__AVX2__)
    // 8 values (kLanes is 8 without AVX-512).
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
    return std::bit_cast<Vec>(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
#else
    Vec v;
    for (int64_t i = 0; i < kLanes; ++i) v[i] = q[i];
    return v;
#endif
  }
  static void DecodeBlock(const T* kb, const T* vb, int64_t d, int64_t bs,
                          int64_t bsp, int64_t dp, float* kt, float* vs) {
    if (bs % kLanes == 0 && d % kLanes == 0 && bs <= 64) {
      Vec scale[64 / kLanes];
      std::memcpy(scale, kb + d * bs, bs * sizeof(float));
      for (int64_t e = 0; e < d; ++e) {
        for (int64_t c = 0; c < bs; c += kLanes) {
          Store(kt + e * bsp + c, Widen(kb + e * bs + c) * scale[c / kLanes]);
        }
      }
      for (int64_t j = 0; j < bs; ++j) {
        const T* q = vb + j * (d + 4);
        float s;
        std::memcpy(&s, q + d, sizeof s);
        for (int64_t e = 0; e < d; e += kLanes) {
          Store(vs + j * dp + e, Widen(q + e) * s);
        }
      }
      return;
    }
    constexpr int64_t kRun = 64;  // Keys whose scales are read at once.
    for (int64_t j0 = 0; j0 < bs; j0 += kRun) {
      const int64_t n = std::min(kRun, bs - j0);
      float scale[kRun];
      std::memcpy(scale, kb + d * bs + j0 * 4, n * sizeof(float));
      for (int64_t e = 0; e < d; ++e) {
        const T* q = kb + e * bs + j0;
        float* out = kt + e * bsp + j0;
        for (int64_t j = 0; j < n; ++j) out[j] = q[j] * scale[j];
      }
    }
    for (int64_t j = 0; j < bs; ++j) {
      const T* q = vb + j * (d + 4);
      float scale;
      std::memcpy(&scale, q + d, sizeof scale);
      for (int64_t e = 0; e < d; ++e) vs[j * dp + e] = q[e] * scale;
    }
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
  for (int64_t i = 0; i < n; ++i) {
    const int32_t pos = batch.positions[i];
    const int64_t block = batch.block_tables[batch.token_seq[i]][pos / bs];
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
// Attention. A tile is up to kTileTokens query tokens of one sequence; an
// item is a tile's rows (tokens x the GQA group's heads) against one KV
// head's keys in [k0, k1), whole blocks.

struct Tile {
  int32_t seq = 0;
  int64_t first = 0, count = 0;  // Into the position-sorted token order.
  int64_t context = 0;           // Largest position + 1.
  int64_t key_begin = 0;         // First key any token of it attends to.
};

struct Item {
  int64_t tile = 0, kvh = 0;
  int64_t k0 = 0, k1 = 0;
  int64_t part = -1;  // Offset of its partial results, or -1: final.
  int64_t cost = 0;
};

struct Problem {
  const float* q = nullptr;
  float* out = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const AttentionBatch* batch = nullptr;
  std::vector<int64_t> order;  // Token indices, by sequence then position.
  int64_t heads = 0, kv_heads = 0, group = 0, d = 0, dp = 0, bs = 0, bsp = 0;
  int64_t blocks = 0;  // In the pool.
  float scale = 1;

  int64_t rows(const Tile& t) const { return t.count * group; }
  // Floats of one row's partial result: max, sum, accumulator[dp].
  int64_t part_row() const { return dp + 2; }
};

// One thread's buffers (dp = head_dim rounded up to 64, bsp = block_size
// rounded up to the vector width; the padding stays zero).
struct Scratch {
  // first/limit: each row's keys are positions [first, limit).
  std::vector<float> q, o, m, l, first, limit, kt, vs, s;
  void Reset(const Problem& p, int64_t rows) {
    const auto fit = [](std::vector<float>& v, int64_t n) {
      if (static_cast<int64_t>(v.size()) < n) v.assign(n, 0.0f);
    };
    fit(q, rows * p.dp);
    fit(o, rows * p.dp);
    fit(m, rows);
    fit(l, rows);
    fit(first, rows);
    fit(limit, rows);
    fit(kt, p.d * p.bsp);
    fit(vs, p.bs * p.dp);
    fit(s, 4 * p.bsp);
  }
};

void Prefetch(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 0, 1);
}

// Rows [r0, r0 + NR) of a tile meet one block of keys starting at position
// `start` (its K and V already in w.kt and w.vs as f32): scores, the online
// softmax update, and the probability-weighted values. The NR rows share
// every K and V load and keep 2 * NR (scores) and 4 * NR (values)
// independent FMA chains in flight.
template <int NR>
void UpdateRows(const Problem& p, Scratch& w, int64_t r0, int64_t start) {
  const int64_t d = p.d, dp = p.dp, bsp = p.bsp;
  // Row g sees the block's keys [lo[g], valid[g]); valid[g] = 0: none.
  int64_t lo[NR], valid[NR], most = 0;
  for (int g = 0; g < NR; ++g) {
    valid[g] = std::clamp<int64_t>(
        static_cast<int64_t>(w.limit[r0 + g]) - start, 0, p.bs);
    lo[g] = std::clamp<int64_t>(static_cast<int64_t>(w.first[r0 + g]) - start,
                                0, p.bs);
    if (lo[g] >= valid[g]) lo[g] = valid[g] = 0;
    most = std::max(most, valid[g]);
  }
  if (most == 0) return;
  const float* q[NR];
  for (int g = 0; g < NR; ++g) q[g] = w.q.data() + (r0 + g) * dp;
  float* s = w.s.data();  // [NR, bsp]: scores, then probabilities.
  Vec lane;
  for (int64_t i = 0; i < kLanes; ++i) lane[i] = static_cast<float>(i);

  // Scores, masked outside each row's keys.
  float block_max[NR];
  std::fill_n(block_max, NR, kNegInf);
  for (int64_t c = 0; c < bsp; c += kLanes) {
    const float* kt = w.kt.data() + c;
    Vec a[NR][2] = {};
    int64_t e = 0;
    for (; e + 1 < d; e += 2) {
      const Vec k0 = Load(kt + e * bsp), k1 = Load(kt + (e + 1) * bsp);
      for (int g = 0; g < NR; ++g) {
        a[g][0] += q[g][e] * k0;
        a[g][1] += q[g][e + 1] * k1;
      }
    }
    if (e < d) {
      const Vec k0 = Load(kt + e * bsp);
      for (int g = 0; g < NR; ++g) a[g][0] += q[g][e] * k0;
    }
    const Vec idx = lane + Splat(static_cast<float>(c));
    for (int g = 0; g < NR; ++g) {
      const Vec sc = (idx >= Splat(static_cast<float>(lo[g]))) &
                             (idx < Splat(static_cast<float>(valid[g])))
                         ? a[g][0] + a[g][1]
                         : Splat(kNegInf);
      block_max[g] = std::max(block_max[g], Max(sc));
      Store(s + g * bsp + c, sc);
    }
  }

  // Online softmax: probabilities against the new running maximum, and
  // the factor that rescales what came before (1 when the maximum holds).
  float alpha[NR];
  for (int g = 0; g < NR; ++g) {
    const int64_t r = r0 + g;
    alpha[g] = 1.0f;
    if (valid[g] == 0) {  // Every key of the block is past this row.
      std::fill_n(s + g * bsp, bsp, 0.0f);
      continue;
    }
    const float m_new = std::max(w.m[r], block_max[g]);
    if (m_new > w.m[r]) alpha[g] = std::exp(w.m[r] - m_new);  // 0 at first.
    float sum = 0;
    for (int64_t c = 0; c < bsp; c += kLanes) {
      const Vec pr = Exp(Load(s + g * bsp + c) - m_new);
      const Vec idx = lane + Splat(static_cast<float>(c));
      const Vec masked = (idx >= Splat(static_cast<float>(lo[g]))) &
                                 (idx < Splat(static_cast<float>(valid[g])))
                             ? pr
                             : Splat(0.0f);
      sum += Sum(masked);
      Store(s + g * bsp + c, masked);
    }
    w.l[r] = w.l[r] * alpha[g] + sum;
    w.m[r] = m_new;
  }

  // Values, 4 * kLanes columns at a time (dp is a multiple of 64).
  for (int64_t c = 0; c < dp; c += 4 * kLanes) {
    Vec acc[NR][4];
    for (int g = 0; g < NR; ++g) {
      const float* o = w.o.data() + (r0 + g) * dp + c;
      for (int k = 0; k < 4; ++k) acc[g][k] = Load(o + k * kLanes) * alpha[g];
    }
    for (int64_t j = 0; j < most; ++j) {
      const float* v = w.vs.data() + j * dp + c;
      const Vec v0 = Load(v), v1 = Load(v + kLanes), v2 = Load(v + 2 * kLanes),
                v3 = Load(v + 3 * kLanes);
      for (int g = 0; g < NR; ++g) {
        const float pr = s[g * bsp + j];
        acc[g][0] += pr * v0;
        acc[g][1] += pr * v1;
        acc[g][2] += pr * v2;
        acc[g][3] += pr * v3;
      }
    }
    for (int g = 0; g < NR; ++g) {
      float* o = w.o.data() + (r0 + g) * dp + c;
      for (int k = 0; k < 4; ++k) Store(o + k * kLanes, acc[g][k]);
    }
  }
}

template <typename E>
void RunItem(const Problem& p, const Tile& tile, const Item& it, Scratch& w,
             float* parts) {
  using T = typename E::T;
  const int64_t d = p.d, dp = p.dp, bs = p.bs, bsp = p.bsp;
  const int64_t rows = p.rows(tile);
  const auto& table = p.batch->block_tables[tile.seq];
  w.Reset(p, rows);
  const int64_t window = p.batch->window;
  int64_t key_end = 0;
  for (int64_t t = 0; t < tile.count; ++t) {
    const int64_t tok = p.order[tile.first + t];
    const int64_t pos = p.batch->positions[tok];
    const int64_t limit = std::min<int64_t>(pos + 1, it.k1);
    const int64_t first =
        window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
    key_end = std::max(key_end, limit);
    for (int64_t g = 0; g < p.group; ++g) {
      const int64_t r = t * p.group + g, h = it.kvh * p.group + g;
      const float* qi = p.q + (tok * p.heads + h) * d;
      float* qr = w.q.data() + r * dp;
      for (int64_t e = 0; e < d; ++e) qr[e] = qi[e] * p.scale;
      std::fill(w.o.data() + r * dp, w.o.data() + (r + 1) * dp, 0.0f);
      w.m[r] = kNegInf;
      w.l[r] = 0;
      w.first[r] = static_cast<float>(first);
      w.limit[r] = static_cast<float>(limit);
    }
  }
  const T* kbase = static_cast<const T*>(p.k_cache);
  const T* vbase = static_cast<const T*>(p.v_cache);
  const int64_t head_block = E::HeadBlock(d, bs);
  const auto head_of = [&](const T* base, int64_t start) {
    return base + (it.kvh * p.blocks + table[start / bs]) * head_block;
  };
  for (int64_t start = it.k0; start < key_end; start += bs) {
    const T* kb = head_of(kbase, start);
    const T* vb = head_of(vbase, start);
    // The pool's blocks are scattered: fetch the next one while this one
    // is computed.
    if (start + kAhead * bs < key_end) {
      Prefetch(head_of(kbase, start + kAhead * bs), head_block * sizeof(T));
      Prefetch(head_of(vbase, start + kAhead * bs), head_block * sizeof(T));
    }
    E::DecodeBlock(kb, vb, d, bs, bsp, dp, w.kt.data(), w.vs.data());
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) UpdateRows<4>(p, w, r, start);
    switch (rows - r) {
      case 3:
        UpdateRows<3>(p, w, r, start);
        break;
      case 2:
        UpdateRows<2>(p, w, r, start);
        break;
      case 1:
        UpdateRows<1>(p, w, r, start);
        break;
    }
  }

  for (int64_t t = 0; t < tile.count; ++t) {
    const int64_t tok = p.order[tile.first + t];
    for (int64_t g = 0; g < p.group; ++g) {
      const int64_t r = t * p.group + g, h = it.kvh * p.group + g;
      const float* o = w.o.data() + r * dp;
      if (it.part < 0) {
        float* dst = p.out + (tok * p.heads + h) * d;
        const float inv = 1.0f / w.l[r];
        for (int64_t e = 0; e < d; ++e) dst[e] = o[e] * inv;
      } else {
        float* dst = parts + it.part + r * p.part_row();
        dst[0] = w.m[r];
        dst[1] = w.l[r];
        std::copy_n(o, d, dst + 2);
      }
    }
  }
}

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
      const float inv = 1.0f / l;
      for (int64_t e = 0; e < d; ++e) dst[e] *= inv;
    }
  }
}

template <typename E>
void Attend(Problem& p) {
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
  const int64_t threads = omp_get_max_threads();
  const int64_t pairs = static_cast<int64_t>(tiles.size()) * p.kv_heads;
  // Eight items per thread or more: dynamic scheduling then evens out
  // the threads to within an eighth of one's work.
  const int64_t want =
      pairs >= 8 * threads ? 1 : (8 * threads + pairs - 1) / pairs;
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
    const int64_t per = (blocks + splits - 1) / splits;
    for (int64_t kvh = 0; kvh < p.kv_heads; ++kvh) {
      for (int64_t b = b0; b < b1; b += per) {
        Item it{.tile = ti,
                .kvh = kvh,
                .k0 = b * p.bs,
                .k1 = std::min(t.context, (b + per) * p.bs)};
        it.cost = p.rows(t) * (it.k1 - it.k0);
        if (per < blocks) {
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
#pragma omp parallel if (n_items > 1)
  {
    Scratch w;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_items; ++i) {
      const Item& it = items[by_cost[i]];
      RunItem<E>(p, tiles[it.tile], it, w, parts.data());
    }
  }
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
  if (q.rank() != 3 || v_cache.rank() != 4) {
    return absl::InvalidArgumentError(
        "PagedAttention: q must be [n, heads, d], caches 4-D");
  }
  const int64_t n = q.dim(0), heads = q.dim(1), d = q.dim(2);
  const int64_t kv_heads = v_cache.dim(0);
  RETURN_IF_ERROR(CheckHostF32("PagedAttention", "q", q, {n, heads, d}));
  RETURN_IF_ERROR(CheckHostF32("PagedAttention", "out", out, {n, heads, d}));
  if (kv_heads <= 0 || heads % kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: ", heads,
                                                   " query heads over ",
                                                   kv_heads, " KV heads"));
  }
  RETURN_IF_ERROR(
      CheckBatch("PagedAttention", batch, n, k_cache, v_cache, kv_heads, d));
  if (n == 0) return absl::OkStatus();
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
            .bs = v_cache.dim(2),
            .bsp = RoundUp(v_cache.dim(2)),
            .blocks = v_cache.dim(1),
            .scale = scale};
  switch (k_cache.dtype()) {
    case DType::kF16:
      Attend<F16>(p);
      break;
    case DType::kBF16:
      Attend<Bf16>(p);
      break;
    case DType::kI8:
      Attend<I8>(p);
      break;
    default:
      Attend<F32>(p);
  }
  return absl::OkStatus();
}

}  // namespace shardlm
