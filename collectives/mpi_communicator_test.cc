// MpiCommunicator under mpirun (np 2, 3, 4): the exact-result checks of the
// fake's test across the world and across Split sub-communicators, plus
// timeouts. Every rank runs every test in the same order; main() combines
// the ranks' results so that a failure anywhere fails the run.
#include "collectives/mpi_communicator.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "collectives/collective_checks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

using ::testing::HasSubstr;

MpiCommunicator* g_world = nullptr;  // Owned by main(); 20 s timeout.

TEST(MpiCommunicatorTest, WorldExactResults) {
  EXPECT_EQ(g_world->world_ranks().size(),
            static_cast<size_t>(g_world->size()));
  CheckExactResults(*g_world);
}

TEST(MpiCommunicatorTest, SplitIntoTpGroupsAndPpChains) {
  // TP groups of 2 consecutive world ranks; PP chains link equal TP ranks.
  const int r = g_world->rank();
  auto tp =
      g_world->Split(r / 2, r, "tp group of stage " + std::to_string(r / 2));
  ASSERT_TRUE(tp.ok()) << tp.status();
  auto pp = g_world->Split(r % 2, r, "pp chain " + std::to_string(r % 2));
  ASSERT_TRUE(pp.ok()) << pp.status();
  EXPECT_EQ((*tp)->rank(), r % 2);
  EXPECT_EQ((*pp)->rank(), r / 2);
  EXPECT_EQ((*tp)->world_ranks()[(*tp)->rank()], r);
  CheckExactResults(**tp);
  CheckExactResults(**pp);
}

TEST(MpiCommunicatorTest, SumIsBitIdenticalOnEveryRankAndInRankOrder) {
  const int size = g_world->size();
  constexpr int64_t kN = 1031;
  std::vector<std::vector<float>> inputs(size, std::vector<float>(kN));
  std::mt19937 rng(123);  // Same seed everywhere: every rank knows all.
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : inputs) {
    for (float& x : v) x = u(rng) * std::pow(10.0f, u(rng) * 6);
  }
  std::vector<float> want(kN);
  for (int64_t i = 0; i < kN; ++i) {
    float s = inputs[0][i];
    for (int r = 1; r < size; ++r) s += inputs[r][i];
    want[i] = s;
  }
  Tensor t = F32(kN);
  std::memcpy(t.raw(), inputs[g_world->rank()].data(), t.bytes());
  ASSERT_TRUE(g_world->AllReduce(t, t, ReduceOp::kSum).ok());
  EXPECT_EQ(std::memcmp(t.raw(), want.data(), t.bytes()), 0);
}

TEST(MpiCommunicatorTest, BadArgumentsAreInvalidArgument) {
  MpiCommunicator& c = *g_world;
  Tensor a = F32(4), b = F32(5);
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(c.AllReduce(a, b, ReduceOp::kSum).code(), kInvalid);
  Tensor h = Tensor::Host(DType::kF16, {4}).value();
  EXPECT_EQ(c.AllReduce(h, h, ReduceOp::kSum).code(), kInvalid);
  EXPECT_EQ(c.AllGather(a, b).code(), kInvalid);
  EXPECT_EQ(c.Broadcast(a, c.size()).code(), kInvalid);
  EXPECT_EQ(c.Send(a, c.rank()).code(), kInvalid);
  float x[4];
  Tensor dev = Tensor::View(DType::kF32, {4}, x, MemoryType::kDevice).value();
  absl::Status s = c.AllReduce(dev, dev, ReduceOp::kSum);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_THAT(std::string(s.message()), HasSubstr("device memory"));
  EXPECT_EQ(c.Split(-1, 0, "x").status().code(), kInvalid);
  // A Recv into a smaller or larger buffer than was sent.
  if (c.rank() < 2) {
    const int peer = 1 - c.rank();
    Tensor out = F32(8);
    if (c.rank() == 0) {
      ASSERT_TRUE(c.Send(out, peer).ok());
      ASSERT_TRUE(c.Send(out, peer).ok());
    } else {
      Tensor small = F32(4), big = F32(9);
      s = c.Recv(small, peer);
      EXPECT_EQ(s.code(), kInvalid) << s;
      s = c.Recv(big, peer);
      EXPECT_EQ(s.code(), kInvalid) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("sent 32 bytes"));
    }
  }
  ASSERT_TRUE(c.Barrier().ok());
}

// The last rank skips an AllReduce: the others time out naming the group,
// then that rank joins late (with a long timeout), which completes the
// others' abandoned requests so that MPI_Finalize finds nothing pending.
TEST(MpiCommunicatorTest, CollectiveTimeoutNamesGroupAndLateRankCompletes) {
  const int size = g_world->size();
  const bool late = g_world->rank() == size - 1;
  const absl::Duration timeout = absl::Milliseconds(500);
  auto comm =
      MpiCommunicator::World({.timeout = late ? absl::Seconds(30) : timeout});
  ASSERT_TRUE(comm.ok()) << comm.status();
  Tensor t = F32(7);
  if (!late) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = (*comm)->AllReduce(t, t, ReduceOp::kSum);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("world: AllReduce on rank"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("world ranks 0, 1"));
    EXPECT_GE(secs, 0.49);
    // It ends (no hang); how soon after the timeout depends on the load of
    // the machine (oversubscribed ranks on 2 cores), so the bound is
    // generous.
    EXPECT_LT(secs, 10.0);
    s = (*comm)->Barrier();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  }
  // Everyone but the late rank has timed out once this barrier is reached.
  ASSERT_TRUE(g_world->Barrier().ok());
  if (late) {
    EXPECT_TRUE((*comm)->AllReduce(t, t, ReduceOp::kSum).ok());
  }
  // The others make MPI progress here, completing their abandoned requests.
  ASSERT_TRUE(g_world->Barrier().ok());
}

TEST(MpiCommunicatorTest, RecvTimeoutNamesPeer) {
  const int r = g_world->rank();
  auto comm = MpiCommunicator::World(
      {.timeout = r == 0 ? absl::Milliseconds(300) : absl::Seconds(30)});
  ASSERT_TRUE(comm.ok()) << comm.status();
  Tensor t = F32(5);
  if (r == 0) {
    absl::Status s = (*comm)->Recv(t, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("Recv on rank 0 (world rank 0) timed out after "
                          "300ms waiting for rank 1 (world rank 1)"));
    EXPECT_EQ((*comm)->Recv(t, 1).code(), absl::StatusCode::kUnavailable);
  }
  ASSERT_TRUE(g_world->Barrier().ok());
  // The late send matches rank 0's abandoned receive.
  if (r == 1) {
    EXPECT_TRUE((*comm)->Send(t, 0).ok());
  }
  ASSERT_TRUE(g_world->Barrier().ok());
}

// Prints failures of ranks other than 0 (whose default output is off).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                   r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.message());
    }
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) {
  using namespace shardlm;
  ::testing::InitGoogleTest(&argc, argv);
  auto runtime = MpiRuntime::Start();
  if (!runtime.ok()) {
    std::fprintf(stderr, "%s\n", runtime.status().ToString().c_str());
    return 1;
  }
  auto world = MpiCommunicator::World({.timeout = absl::Seconds(20)});
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().ToString().c_str());
    return 1;
  }
  g_world = world->get();
  const int rank = g_world->rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  // Every rank reports; the run fails if any rank failed.
  std::vector<int> failed(g_world->size());
  int rc = MPI_Gather(&local_failed, 1, MPI_INT, failed.data(), 1, MPI_INT, 0,
                      MPI_COMM_WORLD);
  int any_failed = local_failed;
  if (rc == MPI_SUCCESS) {
    rc = MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX,
                       MPI_COMM_WORLD);
  }
  if (rank == 0) {
    for (int r = 0; r < g_world->size(); ++r) {
      std::printf("rank %d of %d: %s\n", r, g_world->size(),
                  failed[r] ? "FAILED" : "passed");
    }
  }
  world->reset();
  g_world = nullptr;
  runtime->reset();  // MPI_Finalize.
  return (rc != MPI_SUCCESS || any_failed) ? 1 : 0;
}
