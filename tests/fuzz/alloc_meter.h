// The heap one fuzz input costs (issue 39): the peak bytes allocated while
// it was handled, above what was live when it began, metered through the
// sanitizer allocator's hooks (the fuzz targets always run under ASan).
// An input whose peak exceeds kMaxBytesPerInputByte times its size plus
// the target's stated allowance aborts with both figures, so that libFuzzer
// keeps it as a finding; the largest peak so far is printed as it grows.
#ifndef SHARDLM_TESTS_FUZZ_ALLOC_METER_H_
#define SHARDLM_TESTS_FUZZ_ALLOC_METER_H_

#include <sanitizer/allocator_interface.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace shardlm::fuzz {

inline constexpr int64_t kMaxBytesPerInputByte = 32;

inline std::atomic<int64_t> g_live{0};
inline std::atomic<int64_t> g_peak{0};
inline std::atomic<int64_t> g_worst{0};

inline void OnMalloc(const volatile void*, size_t size) {
  const int64_t now =
      g_live.fetch_add(static_cast<int64_t>(size)) + static_cast<int64_t>(size);
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

inline void OnFree(const volatile void* p) {
  g_live.fetch_sub(static_cast<int64_t>(
      __sanitizer_get_allocated_size(const_cast<const void*>(p))));
}

// Meters the heap from construction to Check().
class AllocMeter {
 public:
  AllocMeter() {
    static const bool installed =
        __sanitizer_install_malloc_and_free_hooks(&OnMalloc, &OnFree) != 0;
    if (!installed) {
      std::fprintf(stderr, "alloc_meter: no sanitizer allocator hooks\n");
      std::abort();
    }
    base_ = g_live.load();
    g_peak.store(base_);
  }

  // Aborts when the peak since construction is over kMaxBytesPerInputByte
  // times `input_bytes` plus `allowance` (what the target costs for any
  // input: state set up lazily, a response's fixed parts).
  void Check(size_t input_bytes, int64_t allowance, const char* target) const {
    const int64_t peak = g_peak.load() - base_;
    const int64_t bound =
        kMaxBytesPerInputByte * static_cast<int64_t>(input_bytes) + allowance;
    int64_t worst = g_worst.load();
    if (peak > worst && g_worst.compare_exchange_strong(worst, peak)) {
      std::fprintf(stderr,
                   "%s: peak heap %lld bytes for an input of %zu (bound "
                   "%lld)\n",
                   target, static_cast<long long>(peak), input_bytes,
                   static_cast<long long>(bound));
    }
    if (peak > bound) {
      std::fprintf(stderr,
                   "%s: an input of %zu bytes peaked at %lld heap bytes, over "
                   "%lld x its size + %lld\n",
                   target, input_bytes, static_cast<long long>(peak),
                   static_cast<long long>(kMaxBytesPerInputByte),
                   static_cast<long long>(allowance));
      std::abort();
    }
  }

 private:
  int64_t base_ = 0;
};

}  // namespace shardlm::fuzz

#endif  // SHARDLM_TESTS_FUZZ_ALLOC_METER_H_
