// The per-ISA half of the CPU paged attention (internal to
// kernels/attention/). paged_attention_cpu.cc checks the arguments, writes
// the caches, splits a step into items and merges split softmaxes; a
// Kernels row runs one item: a tile's query rows against a range of one
// KV head's blocks (decode the block to f32, scores, online softmax,
// values). One file per ISA (paged_attention_avx512.cc, _avx2.cc,
// _portable.cc), each the code of paged_attention_kernels.inc compiled for
// its ISA; kernels/cpu_isa.h chooses which one runs.
//
// Nothing here is ISA-specific: every inline function below is compiled
// with the build's flags in every file that includes it.
#ifndef SHARDLM_KERNELS_ATTENTION_PAGED_ATTENTION_KERNELS_H_
#define SHARDLM_KERNELS_ATTENTION_PAGED_ATTENTION_KERNELS_H_

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/attention/paged_attention.h"

namespace shardlm::attention_kernels {

// A tile is up to ~48 rows' worth of query tokens of one sequence; an item
// is a tile's rows (tokens x the GQA group's heads) against one KV head's
// keys in [k0, k1), whole blocks.
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
  const float* q = nullptr;  // [n, heads, d]
  float* out = nullptr;      // [n, heads, d]
  // [n, heads]: log sum exp of each row's scaled scores, or null: not
  // wanted (PagedAttentionPartial). Rows with no keys then get out = 0.
  float* lse = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const AttentionBatch* batch = nullptr;
  std::vector<int64_t> order;  // Token indices, by sequence then position.
  // dp: d rounded up to 64; bsp: bs rounded up to the kernels' lanes.
  int64_t heads = 0, kv_heads = 0, group = 0, d = 0, dp = 0, bs = 0, bsp = 0;
  int64_t blocks = 0;      // In the pool.
  int64_t head_block = 0;  // Elements of one KV head's K (or V) in a block.
  float scale = 1;

  int64_t rows(const Tile& t) const { return t.count * group; }
  // Floats of one row's partial result: max, sum, accumulator[dp].
  int64_t part_row() const { return dp + 2; }
};

// One thread's buffers (the padding of dp and bsp stays zero).
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

// Runs item `it` of tile `tile`: its rows' final outputs into p.out
// (it.part < 0), else their max, sum and unnormalized accumulators into
// parts + it.part, [rows, p.part_row()].
using RunItemFn = void (*)(const Problem& p, const Tile& tile, const Item& it,
                           Scratch& w, float* parts);

struct Kernels {
  int64_t lanes = 0;  // Floats per vector; p.bsp is a multiple of it.
  RunItemFn f32 = nullptr, f16 = nullptr, bf16 = nullptr, i8 = nullptr;
};

// The kernels of each ISA (calling the AVX ones on a CPU without them is
// the caller's error: kernels/cpu_isa.h).
Kernels Portable();
Kernels Avx2();
Kernels Avx512();

}  // namespace shardlm::attention_kernels

#endif  // SHARDLM_KERNELS_ATTENTION_PAGED_ATTENTION_KERNELS_H_
