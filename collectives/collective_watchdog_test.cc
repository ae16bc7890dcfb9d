// CollectiveWatchdog on the CPU: pieces of work are flags the test sets,
// the clock is the test's (deadlines pass when the test says so), and the
// abort callback counts. Waits on the watchdog's thread are for its poll
// rounds, each bounded in real time so that a broken watchdog fails rather
// than hangs.
#include "collectives/collective_watchdog.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const absl::Time kT0 = absl::FromUnixSeconds(1000000);

// A clock that moves only when told.
class ManualClock {
 public:
  absl::Time Now() const {
    return kT0 + absl::Nanoseconds(ns_.load(std::memory_order_acquire));
  }
  void Set(absl::Duration since_t0) {
    ns_.store(absl::ToInt64Nanoseconds(since_t0), std::memory_order_release);
  }

 private:
  std::atomic<int64_t> ns_{0};
};

// What the callbacks saw; shared so that it outlives the watchdog.
struct Counters {
  std::atomic<int> aborts{0};
  std::atomic<int> releases{0};
  std::atomic<int> polls{0};
  absl::Mutex mu;
  absl::Status abort_status ABSL_GUARDED_BY(mu);
};

WatchdogOptions Options(ManualClock& clock, std::shared_ptr<Counters> c) {
  return {.name = "tp group of stage 0",
          .interval = absl::Milliseconds(1),
          .abort =
              [c](const absl::Status& s) {
                absl::MutexLock lock(&c->mu);
                c->abort_status = s;
                c->aborts.fetch_add(1);
              },
          .now = [&clock] { return clock.Now(); }};
}

// A piece that is done once *flag is set.
WatchedWork Piece(std::string what, absl::Duration timeout,
                  std::shared_ptr<std::atomic<bool>> flag,
                  std::shared_ptr<Counters> c) {
  return {.what = std::move(what),
          .deadline = kT0 + timeout,
          .timeout = timeout,
          .done = [flag, c]() -> absl::StatusOr<bool> {
            c->polls.fetch_add(1);
            return flag->load();
          },
          .release = [c] { c->releases.fetch_add(1); }};
}

std::shared_ptr<std::atomic<bool>> Flag() {
  return std::make_shared<std::atomic<bool>>(false);
}

// Waits (up to 10 s of real time) for `n` more poll rounds: a round that
// started after the caller's last change to the clock or a flag has ended.
void AwaitRounds(const CollectiveWatchdog& w, int n = 3) {
  const int64_t target = w.rounds() + n;
  const absl::Time limit = absl::Now() + absl::Seconds(10);
  while (w.rounds() < target) {
    ASSERT_LT(absl::Now(), limit) << "the watchdog stopped polling";
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

TEST(CollectiveWatchdogTest, CompletedWorkIsReleasedAndNeverAborts) {
  ManualClock clock;
  auto c = std::make_shared<Counters>();
  CollectiveWatchdog w(Options(clock, c));
  auto flag = Flag();
  ASSERT_TRUE(w.Watch(Piece("AllReduce", absl::Seconds(5), flag, c)).ok());
  AwaitRounds(w);
  EXPECT_GT(c->polls.load(), 0);  // Polled, and held while not done.
  EXPECT_EQ(w.pending(), 1);
  EXPECT_EQ(c->releases.load(), 0);

  flag->store(true);
  AwaitRounds(w);
  EXPECT_EQ(w.pending(), 0);
  EXPECT_EQ(c->releases.load(), 1);
  EXPECT_TRUE(w.Wait().ok());

  // Its deadline passing afterwards changes nothing.
  clock.Set(absl::Seconds(60));
  AwaitRounds(w);
  EXPECT_EQ(c->aborts.load(), 0);
  EXPECT_TRUE(w.status().ok()) << w.status();
  EXPECT_EQ(c->releases.load(), 1);
}

TEST(CollectiveWatchdogTest, WorkNeverDoneAbortsOnceAtItsDeadline) {
  ManualClock clock;
  auto c = std::make_shared<Counters>();
  CollectiveWatchdog w(Options(clock, c));
  const std::string what =
      "tp group of stage 0: Recv on rank 0 (device 0), waiting for rank 1";
  ASSERT_TRUE(w.Watch(Piece(what, absl::Seconds(5), Flag(), c)).ok());

  clock.Set(absl::Seconds(5));  // At the deadline, not past it.
  AwaitRounds(w);
  EXPECT_EQ(c->aborts.load(), 0);
  EXPECT_TRUE(w.status().ok()) << w.status();

  clock.Set(absl::Seconds(5) + absl::Milliseconds(1));
  const absl::Status s = w.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(what));
  EXPECT_THAT(std::string(s.message()), HasSubstr("not done within 5s"));
  EXPECT_EQ(c->aborts.load(), 1);
  {
    absl::MutexLock lock(&c->mu);
    EXPECT_EQ(c->abort_status, s);  // The callback got the recorded status.
  }
  EXPECT_EQ(c->releases.load(), 1);
  EXPECT_EQ(w.pending(), 0);

  // Once: later time, later rounds, later work.
  clock.Set(absl::Seconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(w.Watch(Piece("Barrier", absl::Seconds(1), Flag(), c)), s);
  EXPECT_EQ(c->releases.load(), 2);  // Released at once, not kept.
  EXPECT_EQ(w.pending(), 0);
  EXPECT_EQ(w.status(), s);
  EXPECT_EQ(w.Wait(), s);
  EXPECT_EQ(c->aborts.load(), 1);
}

TEST(CollectiveWatchdogTest, AsyncErrorAbortsBeforeAnyDeadline) {
  ManualClock clock;
  auto c = std::make_shared<Counters>();
  auto broken = Flag();
  WatchdogOptions o = Options(clock, c);
  o.async_error = [broken] {
    return broken->load()
               ? absl::UnavailableError("NCCL: remote process exited")
               : absl::OkStatus();
  };
  CollectiveWatchdog w(std::move(o));
  ASSERT_TRUE(w.Watch(Piece("AllGather", absl::Seconds(30), Flag(), c)).ok());
  AwaitRounds(w);
  EXPECT_EQ(c->aborts.load(), 0);

  broken->store(true);  // The clock stays at T0: no deadline has passed.
  const absl::Status s = w.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(s.message(), "NCCL: remote process exited");
  EXPECT_EQ(c->aborts.load(), 1);
  EXPECT_EQ(c->releases.load(), 1);
}

TEST(CollectiveWatchdogTest, DoneErrorAbortsNamingThePiece) {
  ManualClock clock;
  auto c = std::make_shared<Counters>();
  CollectiveWatchdog w(Options(clock, c));
  WatchedWork bad =
      Piece("Broadcast from root 1", absl::Seconds(30), Flag(), c);
  bad.done = []() -> absl::StatusOr<bool> {
    return absl::InternalError("cudaEventQuery: cudaErrorLaunchFailure");
  };
  ASSERT_TRUE(w.Watch(std::move(bad)).ok());
  const absl::Status s = w.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(s.message(),
            "Broadcast from root 1: cudaEventQuery: cudaErrorLaunchFailure");
  EXPECT_EQ(c->aborts.load(), 1);
}

// Three pieces with staggered deadlines: only the one still running at its
// deadline fails the watchdog, and its name is the one in the error.
TEST(CollectiveWatchdogTest, SeveralPiecesEachAgainstItsOwnDeadline) {
  ManualClock clock;
  auto c = std::make_shared<Counters>();
  CollectiveWatchdog w(Options(clock, c));
  auto a = Flag(), b = Flag(), d = Flag();
  ASSERT_TRUE(w.Watch(Piece("piece A", absl::Seconds(1), a, c)).ok());
  ASSERT_TRUE(w.Watch(Piece("piece B", absl::Seconds(2), b, c)).ok());
  ASSERT_TRUE(w.Watch(Piece("piece C", absl::Seconds(3), d, c)).ok());
  AwaitRounds(w);
  EXPECT_EQ(w.pending(), 3);

  a->store(true);
  AwaitRounds(w);
  clock.Set(absl::Milliseconds(1500));  // Past A's deadline: A is done.
  AwaitRounds(w);
  EXPECT_EQ(w.pending(), 2);
  EXPECT_EQ(c->releases.load(), 1);

  b->store(true);
  AwaitRounds(w);
  clock.Set(absl::Milliseconds(2500));
  AwaitRounds(w);
  EXPECT_EQ(w.pending(), 1);
  EXPECT_EQ(c->aborts.load(), 0);
  EXPECT_TRUE(w.status().ok()) << w.status();

  clock.Set(absl::Milliseconds(3500));
  const absl::Status s = w.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("piece C: not done within"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("piece B")));
  EXPECT_EQ(c->aborts.load(), 1);
  EXPECT_EQ(c->releases.load(), 3);
}

// Wait on another thread blocks while work runs and returns the error
// only after the abort callback has returned.
TEST(CollectiveWatchdogTest, WaitReturnsTheRecordedErrorAfterTheAbort) {
  ManualClock clock;
  auto c = std::make_shared<Counters>();
  auto abort_returned = Flag();
  WatchdogOptions o = Options(clock, c);
  o.abort = [c, abort_returned](const absl::Status&) {
    c->aborts.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    abort_returned->store(true);
  };
  CollectiveWatchdog w(std::move(o));
  ASSERT_TRUE(
      w.Watch(Piece("Send to rank 2", absl::Seconds(1), Flag(), c)).ok());
  std::atomic<bool> waited{false};
  absl::Status got;
  std::thread waiter([&] {
    got = w.Wait();
    EXPECT_TRUE(abort_returned->load()) << "Wait returned before the abort";
    waited.store(true);
  });
  AwaitRounds(w, 10);
  EXPECT_FALSE(waited.load()) << "Wait returned while the work ran";
  clock.Set(absl::Seconds(2));
  waiter.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kDeadlineExceeded) << got;
  EXPECT_THAT(std::string(got.message()), HasSubstr("Send to rank 2"));
  EXPECT_EQ(c->aborts.load(), 1);
}

TEST(CollectiveWatchdogTest, NoAbortAfterDestruction) {
  ManualClock clock;
  auto c = std::make_shared<Counters>();
  {
    CollectiveWatchdog w(Options(clock, c));
    ASSERT_TRUE(w.Watch(Piece("AllReduce", absl::Seconds(1), Flag(), c)).ok());
    AwaitRounds(w);
  }
  EXPECT_EQ(c->releases.load(), 1);  // Released by the destructor.
  clock.Set(absl::Seconds(10));      // Past the deadline, with no watchdog.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(c->aborts.load(), 0);
}

// A destructor that races an abort in progress returns after it.
TEST(CollectiveWatchdogTest, DestructorWaitsForARunningAbort) {
  ManualClock clock;
  auto c = std::make_shared<Counters>();
  auto started = Flag(), finished = Flag();
  WatchdogOptions o = Options(clock, c);
  o.abort = [c, started, finished](const absl::Status&) {
    started->store(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    c->aborts.fetch_add(1);
    finished->store(true);
  };
  {
    CollectiveWatchdog w(std::move(o));
    ASSERT_TRUE(w.Watch(Piece("AllReduce", absl::Seconds(1), Flag(), c)).ok());
    clock.Set(absl::Seconds(2));
    const absl::Time limit = absl::Now() + absl::Seconds(10);
    while (!started->load()) {
      ASSERT_LT(absl::Now(), limit) << "no abort";
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  EXPECT_TRUE(finished->load()) << "the abort outlived the watchdog";
  EXPECT_EQ(c->aborts.load(), 1);
}

// The owner's own failure: recorded, pieces released, no abort callback.
TEST(CollectiveWatchdogTest, FailByTheOwnerRecordsWithoutAborting) {
  ManualClock clock;
  auto c = std::make_shared<Counters>();
  CollectiveWatchdog w(Options(clock, c));
  ASSERT_TRUE(w.Watch(Piece("AllReduce", absl::Seconds(1), Flag(), c)).ok());
  const absl::Status mine = absl::InternalError("ncclAllReduce: unhandled");
  EXPECT_EQ(w.Fail(mine), mine);
  EXPECT_EQ(w.Fail(absl::UnknownError("second")), mine);  // The first stays.
  EXPECT_EQ(w.Wait(), mine);
  EXPECT_EQ(c->releases.load(), 1);
  clock.Set(absl::Seconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(c->aborts.load(), 0);
}

// The default clock: a piece that never completes fails no earlier than
// its deadline, and (loosely, the machine is shared) not much later.
TEST(CollectiveWatchdogTest, RealClockDeadline) {
  auto c = std::make_shared<Counters>();
  CollectiveWatchdog w(
      {.name = "pp chain of tp 0",
       .interval = absl::Milliseconds(2),
       .abort = [c](const absl::Status&) { c->aborts.fetch_add(1); }});
  const absl::Time start = absl::Now();
  const absl::Duration timeout = absl::Milliseconds(100);
  ASSERT_TRUE(w.Watch({.what = "Recv from rank 1",
                       .deadline = w.now() + timeout,
                       .timeout = timeout,
                       .done = []() -> absl::StatusOr<bool> { return false; }})
                  .ok());
  const absl::Status s = w.Wait();
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("pp chain of tp 0"));
  EXPECT_GE(took, timeout);
  EXPECT_LT(took, timeout + absl::Seconds(5));
  EXPECT_EQ(c->aborts.load(), 1);
}

}  // namespace
}  // namespace shardlm
