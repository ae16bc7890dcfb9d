#include "kernels/threading.h"

#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SHARDLM_CPU_RELAX() _mm_pause()
#else
#define SHARDLM_CPU_RELAX() std::this_thread::yield()
#endif

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kChunksPerThread = 4;
constexpr int64_t kMaxChunks = 0xffff;
// A thread waiting (a worker for work, the caller for the last chunk)
// spins this long, then yields the core this long more, then sleeps on a
// futex. Decode runs a region every few tens of microseconds, so on an
// idle machine nobody sleeps mid-step; when another process wants the
// core, a waiter gives it up after kSpin instead of burning its quantum.
constexpr auto kSpin = std::chrono::microseconds(30);
constexpr auto kYield = std::chrono::microseconds(2000);

// Calls ready() until it is true: spinning, then yielding, then
// sleep(): the caller's futex wait, which returns to be re-checked.
template <typename Ready, typename Sleep>
void WaitUntil(Ready ready, Sleep sleep) {
  for (int i = 0; i < 64; ++i) {
    if (ready()) return;
    SHARDLM_CPU_RELAX();
  }
  const auto start = Clock::now();
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return;
      SHARDLM_CPU_RELAX();
    }
    const auto waited = Clock::now() - start;
    if (waited < kSpin) continue;
    if (waited < kSpin + kYield) {
      sched_yield();
      continue;
    }
    while (!ready()) sleep();
    return;
  }
}

// Range k of n items cut into `chunks` near-equal contiguous parts.
std::pair<int64_t, int64_t> ChunkRange(int64_t n, int64_t chunks, int64_t k) {
  const int64_t q = n / chunks, r = n % chunks;
  const int64_t begin = q * k + std::min(k, r);
  return {begin, begin + q + (k < r ? 1 : 0)};
}

// Set on a thread while it runs a ParallelFor's body (the workers always):
// a ParallelFor inside it runs inline.
thread_local bool tl_in_parallel = false;

// One calling thread's workers. The job in flight is one 64-bit word,
// (generation << 32) | (chunks << 16) | next chunk, claimed by CAS: a
// claim succeeds only while its job is the current one and has chunks
// left, and the job's other fields are read after the claim, when the
// caller cannot have moved on (it waits for every claimed chunk's done).
class Pool {
 public:
  explicit Pool(int workers) {
    // Kernels call BLAS inside their bodies; BLAS threads of its own would
    // compete with the workers for the cores.
    openblas_set_num_threads(1);
    for (int i = 0; i < workers; ++i) {
      threads_.emplace_back([this] { WorkerLoop(); });
    }
  }
  ~Pool() {
    stop_.store(true);
    epoch_.fetch_add(1);
    epoch_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  int size() const { return static_cast<int>(threads_.size()) + 1; }

  void Run(int64_t n, int64_t chunks,
           absl::FunctionRef<void(int64_t, int64_t)> body) {
    body_ = &body;
    n_ = n;
    done_.store(0, std::memory_order_relaxed);
    ++generation_;
    word_.store((generation_ << 32) | (static_cast<uint64_t>(chunks) << 16),
                std::memory_order_release);
    epoch_.fetch_add(1);
    if (sleepers_.load() > 0) epoch_.notify_all();
    tl_in_parallel = true;
    RunChunks();
    tl_in_parallel = false;
    const uint32_t total = static_cast<uint32_t>(chunks);
    WaitUntil([&] { return done_.load(std::memory_order_acquire) == total; },
              [&] {
                caller_sleeping_.store(true);
                const uint32_t d = done_.load();
                if (d != total) done_.wait(d);
                caller_sleeping_.store(false);
              });
  }

 private:
  bool HasWork() const {
    const uint64_t w = word_.load(std::memory_order_acquire);
    return (w & 0xffff) < ((w >> 16) & 0xffff);
  }

  // Claims and runs chunks of the current job until none is left.
  void RunChunks() {
    uint64_t w = word_.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t chunks = (w >> 16) & 0xffff, next = w & 0xffff;
      if (next >= chunks) return;
      if (!word_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        continue;  // w now holds the current word.
      }
      const auto [begin, end] = ChunkRange(n_, chunks, next);
      (*body_)(begin, end);
      const uint32_t d = done_.fetch_add(1, std::memory_order_acq_rel) + 1;
      if (d == chunks && caller_sleeping_.load()) done_.notify_one();
      w = word_.load(std::memory_order_acquire);
    }
  }

  void WorkerLoop() {
    tl_in_parallel = true;
    for (;;) {
      WaitUntil([&] { return stop_.load() || HasWork(); },
                [&] {
                  sleepers_.fetch_add(1);
                  const uint32_t e = epoch_.load();
                  if (!stop_.load() && !HasWork()) epoch_.wait(e);
                  sleepers_.fetch_sub(1);
                });
      if (stop_.load()) return;
      RunChunks();
    }
  }

  std::vector<std::thread> threads_;
  // The job: written by the caller before word_'s release store, read by
  // workers after a claim.
  const absl::FunctionRef<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t n_ = 0;
  uint64_t generation_ = 0;  // The caller's only.
  std::atomic<uint64_t> word_{0};
  std::atomic<uint32_t> done_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<uint32_t> epoch_{0};  // Bumped per job: the sleepers' futex.
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

// 0: not set on this thread (DefaultCpuThreads()).
thread_local int tl_threads = 0;
thread_local std::unique_ptr<Pool> tl_pool;

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

int64_t ReadInt(const std::string& path, int64_t fallback) {
  std::ifstream in(path);
  int64_t v = fallback;
  if (!(in >> v)) return fallback;
  return v;
}

// The unified (v2) cgroup of this process, from /proc/self/cgroup's
// "0::/path" line; empty when there is none.
std::string CgroupV2Path() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  }
  return "";
}

}  // namespace

int CpuThreadsFor(int affinity, const std::string& cgroup_v2_max,
                  int64_t v1_quota_us, int64_t v1_period_us, std::string* why) {
  const int cpus = std::max(1, affinity);
  std::string reason = absl::StrCat(cpus, " CPUs in the affinity mask");
  double quota = 0;  // CPUs; 0: no quota.
  std::string source;
  std::istringstream max(cgroup_v2_max);
  std::string q;
  int64_t period = 0;
  if (max >> q >> period && q != "max" && period > 0) {
    try {
      quota = static_cast<double>(std::stoll(q)) / period;
      source = absl::StrCat("cgroup cpu.max ", cgroup_v2_max);
    } catch (...) {
      quota = 0;
    }
  } else if (v1_quota_us > 0 && v1_period_us > 0) {
    quota = static_cast<double>(v1_quota_us) / v1_period_us;
    source = absl::StrCat("cgroup cpu.cfs_quota_us ", v1_quota_us, " / ",
                          v1_period_us);
  }
  int n = cpus;
  if (quota > 0) {
    const int capped = std::max(1, static_cast<int>(quota + 0.999));
    if (capped < cpus) {
      n = capped;
      reason = absl::StrCat(reason, ", capped at ", capped, " by the ", source);
    } else {
      reason = absl::StrCat(reason, " (", source, " allows more)");
    }
  }
  if (why != nullptr) *why = reason;
  return n;
}

int DefaultCpuThreads(std::string* why) {
  int affinity = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) affinity = CPU_COUNT(&set);
  std::string v2 =
      ReadFirstLine("/sys/fs/cgroup" + CgroupV2Path() + "/cpu.max");
  if (v2.empty()) v2 = ReadFirstLine("/sys/fs/cgroup/cpu.max");
  const int64_t v1_quota = ReadInt("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", -1);
  const int64_t v1_period = ReadInt("/sys/fs/cgroup/cpu/cpu.cfs_period_us", 0);
  return CpuThreadsFor(affinity, v2, v1_quota, v1_period, why);
}

void SetCpuThreads(int n) {
  if (n <= 0) {
    static const int default_threads = DefaultCpuThreads();
    n = default_threads;
  }
  tl_threads = n;
  // Kernels call BLAS inside their bodies; BLAS threads of its own would
  // compete with the workers for the cores.
  openblas_set_num_threads(1);
}

void EnsureCpuThreads(int n) {
  thread_local int set = 0;
  if (n > 0 && n != set) {
    SetCpuThreads(n);
    set = n;
  }
}

int CpuThreads() {
  if (tl_threads <= 0) SetCpuThreads(0);
  return tl_threads;
}

void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> body,
                 int64_t chunks) {
  if (n <= 0) return;
  const int threads = CpuThreads();
  if (n == 1 || threads == 1 || tl_in_parallel) {
    body(0, n);
    return;
  }
  if (chunks <= 0) chunks = kChunksPerThread * threads;
  chunks = std::min({chunks, n, kMaxChunks});
  if (chunks == 1) {
    body(0, n);
    return;
  }
  if (tl_pool == nullptr || tl_pool->size() != threads) {
    tl_pool.reset();  // Joins the old workers first.
    tl_pool = std::make_unique<Pool>(threads - 1);
  }
  tl_pool->Run(n, chunks, body);
}

}  // namespace shardlm
