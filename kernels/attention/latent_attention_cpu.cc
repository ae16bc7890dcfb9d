// The CPU latent attention (latent_attention.h): one OpenMP item per query
// token, every head of it at once, so each cached entry is decoded once per
// token and block; an online softmax per head, rescaled once per block.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/half.h"
#include "core/status.h"
#include "kernels/attention/latent_attention.h"
#include "kernels/check_args.h"
#include "kernels/threading.h"

namespace shardlm {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Bytes of one entry of `d` values.
int64_t EntryBytes(DType t, int64_t d) {
  switch (t) {
    case DType::kI8:
      return d + 4;
    case DType::kF16:
    case DType::kBF16:
      return 2 * d;
    default:
      return 4 * d;
  }
}

void Encode(const float* x, int64_t d, DType t, uint8_t* dst) {
  switch (t) {
    case DType::kF16: {
      auto* p = reinterpret_cast<uint16_t*>(dst);
      for (int64_t e = 0; e < d; ++e) p[e] = FloatToFp16(x[e]);
      return;
    }
    case DType::kBF16: {
      auto* p = reinterpret_cast<uint16_t*>(dst);
      for (int64_t e = 0; e < d; ++e) p[e] = FloatToBf16(x[e]);
      return;
    }
    case DType::kI8: {
      float amax = 0;
      for (int64_t e = 0; e < d; ++e) amax = std::max(amax, std::abs(x[e]));
      const float scale = amax / 127.0f;
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
      auto* p = reinterpret_cast<int8_t*>(dst);
      for (int64_t e = 0; e < d; ++e) {
        p[e] = static_cast<int8_t>(
            std::clamp(std::nearbyint(x[e] * inv), -127.0f, 127.0f));
      }
      std::memcpy(dst + d, &scale, sizeof scale);
      return;
    }
    default:
      std::memcpy(dst, x, d * sizeof(float));
  }
}

// The f32 values of `count` entries from `src` into `out` ([count, d]);
// f32 entries are returned in place.
const float* Decode(const uint8_t* src, int64_t count, int64_t d, DType t,
                    float* out) {
  if (t == DType::kF32) return reinterpret_cast<const float*>(src);
  const int64_t bytes = EntryBytes(t, d);
  for (int64_t j = 0; j < count; ++j) {
    const uint8_t* e = src + j * bytes;
    float* o = out + j * d;
    if (t == DType::kI8) {
      float scale;
      std::memcpy(&scale, e + d, sizeof scale);
      const auto* p = reinterpret_cast<const int8_t*>(e);
      for (int64_t k = 0; k < d; ++k) o[k] = scale * p[k];
    } else {
      const auto* p = reinterpret_cast<const uint16_t*>(e);
      for (int64_t k = 0; k < d; ++k) {
        o[k] = t == DType::kF16 ? Fp16ToFloat(p[k]) : Bf16ToFloat(p[k]);
      }
    }
  }
  return out;
}

// The cache's shape and type, and every token's table covering its
// position with blocks of the cache.
absl::Status CheckLatentBatch(const char* op, const AttentionBatch& batch,
                              int64_t n, const Tensor& cache, int64_t d) {
  if (cache.rank() != 4 || cache.memory() != MemoryType::kHost ||
      !IsCpuKvDType(cache.dtype()) ||
      cache.shape() !=
          LatentCacheShape(cache.dim(1), cache.dim(2), d, cache.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": cache is ", cache.DebugString(),
                     "; expected a host f32, f16, bf16 or I8 tensor of [1, "
                     "blocks, block_size, ",
                     d, " (+ 4 for I8)]"));
  }
  if (batch.remote_blocks) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": latent attention under context parallel"));
  }
  if (static_cast<int64_t>(batch.positions.size()) != n ||
      static_cast<int64_t>(batch.token_seq.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", batch.positions.size(), " positions and ",
        batch.token_seq.size(), " sequence ids for ", n, " tokens"));
  }
  const int64_t blocks = cache.dim(1), bs = cache.dim(2);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t seq = batch.token_seq[i], pos = batch.positions[i];
    if (seq < 0 || static_cast<size_t>(seq) >= batch.block_tables.size() ||
        pos < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": token ", i, " has sequence ", seq, " (of ",
                       batch.block_tables.size(), ") and position ", pos));
    }
    const auto& table = batch.block_tables[seq];
    if (pos / bs >= static_cast<int64_t>(table.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": token ", i, " at position ", pos,
                       " is past its table of ", table.size(), " blocks"));
    }
    for (int64_t j = 0; j <= pos / bs; ++j) {
      if (table[j] < 0 || table[j] >= blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat(op, ": token ", i, "'s block ", table[j],
                         " is outside the cache of ", blocks, " blocks"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

Shape LatentCacheShape(int64_t blocks, int64_t block_size, int64_t dim,
                       DType dtype) {
  return ValueCacheShape(blocks, block_size, /*kv_heads=*/1, dim, dtype);
}

absl::Status WriteLatent(const Tensor& first, const Tensor& second,
                         const AttentionBatch& batch, Tensor& cache) {
  if (first.rank() != 2 || second.rank() != 2) {
    return absl::InvalidArgumentError(
        "WriteLatent: the entry's parts must be [n, a] and [n, b]");
  }
  const int64_t n = first.dim(0), a = first.dim(1), d = a + second.dim(1);
  RETURN_IF_ERROR(CheckHostF32("WriteLatent", "first", first, {n, a}));
  RETURN_IF_ERROR(CheckHostF32("WriteLatent", "second", second, {n, d - a}));
  RETURN_IF_ERROR(CheckLatentBatch("WriteLatent", batch, n, cache, d));
  const int64_t bs = cache.dim(2);
  const int64_t bytes = EntryBytes(cache.dtype(), d);
  std::vector<float> entry(d);
  auto* base = static_cast<uint8_t*>(cache.raw());
  for (int64_t i = 0; i < n; ++i) {
    const int32_t pos = batch.positions[i];
    const int32_t block = batch.block_tables[batch.token_seq[i]][pos / bs];
    std::copy_n(first.f32().data() + i * a, a, entry.data());
    std::copy_n(second.f32().data() + i * (d - a), d - a, entry.data() + a);
    Encode(entry.data(), d, cache.dtype(),
           base + (block * bs + pos % bs) * bytes);
  }
  return absl::OkStatus();
}

absl::Status LatentAttention(const Tensor& q, const Tensor& cache,
                             const AttentionBatch& batch, float scale,
                             int64_t value_offset, Tensor& out) {
  if (q.rank() != 3 || out.rank() != 3) {
    return absl::InvalidArgumentError(
        "LatentAttention: q and out must be [n, heads, d]");
  }
  const int64_t n = q.dim(0), heads = q.dim(1), d = q.dim(2), vd = out.dim(2);
  RETURN_IF_ERROR(CheckHostF32("LatentAttention", "q", q, {n, heads, d}));
  RETURN_IF_ERROR(CheckHostF32("LatentAttention", "out", out, {n, heads, vd}));
  if (value_offset < 0 || value_offset + vd > d) {
    return absl::InvalidArgumentError(
        absl::StrCat("LatentAttention: values [", value_offset, ", ",
                     value_offset + vd, ") of an entry of ", d));
  }
  RETURN_IF_ERROR(CheckLatentBatch("LatentAttention", batch, n, cache, d));
  const int64_t bs = cache.dim(2);
  const DType t = cache.dtype();
  const int64_t bytes = EntryBytes(t, d);
  const auto* base = static_cast<const uint8_t*>(cache.raw());
  const float* qd = q.f32().data();
  float* od = out.f32().data();
  // One token per chunk: their contexts differ in length.
  const auto tokens = [&](int64_t begin, int64_t end) {
    std::vector<float> block_buf(bs * d), scores(heads * bs);
    std::vector<float> m(heads), l(heads), acc(heads * vd);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t pos = batch.positions[i];
      const auto& table = batch.block_tables[batch.token_seq[i]];
      const int64_t first =
          batch.window > 0 ? std::max<int64_t>(0, pos - batch.window + 1) : 0;
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t b = first / bs; b <= pos / bs; ++b) {
        const int64_t j0 = std::max(first, b * bs) - b * bs;
        const int64_t j1 = std::min(pos + 1, (b + 1) * bs) - b * bs;
        const float* e =
            Decode(base + table[b] * bs * bytes, j1, d, t, block_buf.data());
        for (int64_t h = 0; h < heads; ++h) {
          const float* qh = qd + (i * heads + h) * d;
          float* s = scores.data() + h * bs;
          float block_max = kNegInf;
          for (int64_t j = j0; j < j1; ++j) {
            const float* ej = e + j * d;
            float dot = 0;
            // Reassociated into vector lanes (the order of an f32 sum).
#pragma omp simd reduction(+ : dot)
            for (int64_t k = 0; k < d; ++k) dot += qh[k] * ej[k];
            s[j] = dot * scale;
            block_max = std::max(block_max, s[j]);
          }
          const float new_max = std::max(m[h], block_max);
          const float rescale = std::exp(m[h] - new_max);  // 0 at first.
          float* ah = acc.data() + h * vd;
          if (rescale != 1.0f) {
            for (int64_t k = 0; k < vd; ++k) ah[k] *= rescale;
          }
          l[h] *= rescale;
          m[h] = new_max;
          for (int64_t j = j0; j < j1; ++j) {
            const float p = std::exp(s[j] - new_max);
            l[h] += p;
            const float* v = e + j * d + value_offset;
            for (int64_t k = 0; k < vd; ++k) ah[k] += p * v[k];
          }
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        const float inv = 1.0f / l[h];
        for (int64_t k = 0; k < vd; ++k) {
          od[(i * heads + h) * vd + k] = acc[h * vd + k] * inv;
        }
      }
    }
  };
  ParallelFor(n, tokens, n);
  return absl::OkStatus();
}

}  // namespace shardlm
