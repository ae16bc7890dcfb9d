#include "kernels/threading.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace shardlm {
namespace {

// Restores this thread's kernel threads when a test ends.
class ThreadsGuard {
 public:
  explicit ThreadsGuard(int n) : before_(CpuThreads()) { SetCpuThreads(n); }
  ~ThreadsGuard() { SetCpuThreads(before_); }

 private:
  int before_;
};

// Every index of [0, n) is run exactly once, in ranges that tile it.
void ExpectEachIndexOnce(int64_t n, int64_t chunks) {
  std::vector<std::atomic<int>> hits(n);
  std::atomic<int64_t> calls{0};
  ParallelFor(
      n,
      [&](int64_t begin, int64_t end) {
        ASSERT_LT(begin, end);
        ASSERT_GE(begin, 0);
        ASSERT_LE(end, n);
        for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
        calls.fetch_add(1);
      },
      chunks);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
  }
  if (n > 0) {
    EXPECT_LE(calls.load(), chunks > 0 ? std::min(chunks, n) : n);
  }
}

TEST(ParallelForTest, RunsEachIndexOnceForAnySizeAndChunking) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadsGuard guard(threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 70000}) {
      for (int64_t chunks : {0, 1, 3, 1000, 100000}) {
        ExpectEachIndexOnce(n, chunks);
      }
    }
  }
}

TEST(ParallelForTest, ManyJobsInARowEachSeeTheirOwnBody) {
  // Back-to-back jobs reuse the workers: a late worker must never run a
  // chunk of the next job with the previous body.
  ThreadsGuard guard(4);
  std::vector<int64_t> sums(5000);
  for (size_t j = 0; j < sums.size(); ++j) {
    std::atomic<int64_t> sum{0};
    ParallelFor(97, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) sum.fetch_add(i + j);
    });
    sums[j] = sum.load();
  }
  for (size_t j = 0; j < sums.size(); ++j) {
    ASSERT_EQ(sums[j], 96 * 97 / 2 + 97 * static_cast<int64_t>(j)) << j;
  }
}

TEST(ParallelForTest, UsesOtherThreadsWhenItHasThem) {
  ThreadsGuard guard(2);
  // Chunks that wait until a second thread has joined: with a worker
  // running they finish; with none, the test would time out below.
  std::atomic<int> inside{0};
  std::atomic<bool> seen_two{false};
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  ParallelFor(
      2,
      [&](int64_t, int64_t) {
        inside.fetch_add(1);
        while (inside.load() < 2 &&
               std::chrono::steady_clock::now() < deadline) {
          std::this_thread::yield();
        }
        if (inside.load() >= 2) seen_two.store(true);
      },
      2);
  EXPECT_TRUE(seen_two.load()) << "no second thread ran a chunk in 20 s";
}

TEST(ParallelForTest, NestedCallsRunInline) {
  ThreadsGuard guard(3);
  std::atomic<int64_t> total{0};
  ParallelFor(8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const std::thread::id outer = std::this_thread::get_id();
      ParallelFor(10, [&](int64_t b, int64_t e) {
        EXPECT_EQ(std::this_thread::get_id(), outer);
        total.fetch_add(e - b);
      });
    }
  });
  EXPECT_EQ(total.load(), 80);
}

TEST(ParallelForTest, CallingThreadsHaveTheirOwnWorkers) {
  // The in-process executor runs a rank per thread, each with its own
  // setting: concurrent calls must neither mix nor wait on one another.
  std::vector<std::thread> callers;
  std::vector<int64_t> sums(4);
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      SetCpuThreads(c + 1);
      EXPECT_EQ(CpuThreads(), c + 1);
      for (int round = 0; round < 300; ++round) {
        std::atomic<int64_t> sum{0};
        ParallelForEach(100, true,
                        [&](int64_t i) { sum.fetch_add(i * (c + 1)); });
        sums[c] += sum.load();
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < 4; ++c) EXPECT_EQ(sums[c], 300 * 4950 * (c + 1));
}

TEST(ParallelForTest, FinishesWhenAWorkerIsStarvedOfCpu) {
  // One core for a team of 4: workers that never get the core claim
  // nothing, and the caller does the chunks itself.
  cpu_set_t before, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &before)) {
      CPU_SET(c, &one);
      break;
    }
  }
  std::atomic<int64_t> sum{0};
  std::thread caller([&] {
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    SetCpuThreads(4);
    for (int round = 0; round < 200; ++round) {
      ParallelForEach(64, true, [&](int64_t i) { sum.fetch_add(i); });
    }
  });
  caller.join();
  EXPECT_EQ(sum.load(), 200 * 63 * 64 / 2);
}

TEST(CpuThreadsForTest, AffinityAloneWithoutAQuota) {
  std::string why;
  EXPECT_EQ(CpuThreadsFor(8, "max 100000", -1, 0, &why), 8);
  EXPECT_EQ(why, "8 CPUs in the affinity mask");
  EXPECT_EQ(CpuThreadsFor(4, "", -1, 0, &why), 4);
  EXPECT_EQ(CpuThreadsFor(0, "", -1, 0, &why), 1);
}

TEST(CpuThreadsForTest, CgroupQuotaCapsRoundedUp) {
  std::string why;
  EXPECT_EQ(CpuThreadsFor(16, "150000 100000", -1, 0, &why), 2);
  EXPECT_EQ(why,
            "16 CPUs in the affinity mask, capped at 2 by the cgroup cpu.max "
            "150000 100000");
  EXPECT_EQ(CpuThreadsFor(16, "50000 100000", -1, 0, &why), 1);
  EXPECT_EQ(CpuThreadsFor(16, "", 300000, 100000, &why), 3);
  EXPECT_NE(why.find("cfs_quota_us 300000 / 100000"), std::string::npos) << why;
  // A quota above the mask leaves the mask.
  EXPECT_EQ(CpuThreadsFor(2, "400000 100000", -1, 0, &why), 2);
  EXPECT_NE(why.find("allows more"), std::string::npos) << why;
  // Garbage is no quota.
  EXPECT_EQ(CpuThreadsFor(4, "lots 100000", -1, 0, &why), 4);
  EXPECT_EQ(CpuThreadsFor(4, "100000", -1, 0, &why), 4);
}

TEST(CpuThreadsForTest, DefaultIsAtMostTheAffinityMask) {
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::string why;
  const int n = DefaultCpuThreads(&why);
  EXPECT_GE(n, 1);
  EXPECT_LE(n, CPU_COUNT(&set));
  EXPECT_NE(why.find("affinity mask"), std::string::npos) << why;
}

}  // namespace
}  // namespace shardlm
