// MakeGroupComms: who is asked for which member of which group, on which
// thread, in which order; that members of one group are asked for at once
// (NCCL's init returns only when the whole group has arrived); and that an
// error names its group and rank without leaving a thread behind.
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "executor/in_process_executor.h"
#include "gtest/gtest.h"
#include "testing/status.h"

namespace shardlm {
namespace {

// A member that only knows who it is.
class RecordedMember : public Communicator {
 public:
  explicit RecordedMember(GroupMember m) : m_(std::move(m)) {}
  int rank() const override { return m_.rank; }
  int size() const override { return m_.size; }
  const std::string& name() const override { return m_.group; }
  absl::Status AllReduce(const Tensor&, Tensor&, ReduceOp) override {
    return absl::UnimplementedError("recorded member");
  }
  absl::Status AllGather(const Tensor&, Tensor&) override {
    return absl::UnimplementedError("recorded member");
  }
  absl::Status Broadcast(Tensor&, int) override {
    return absl::UnimplementedError("recorded member");
  }
  absl::Status Send(const Tensor&, int) override {
    return absl::UnimplementedError("recorded member");
  }
  absl::Status Recv(Tensor&, int) override {
    return absl::UnimplementedError("recorded member");
  }
  absl::Status Barrier() override {
    return absl::UnimplementedError("recorded member");
  }
  const GroupMember& member() const { return m_; }

 private:
  GroupMember m_;
};

// As NCCL's init: a member is made only when all of its group has asked
// (or DeadlineExceeded after 5 s, so that a sequential orchestration fails
// instead of hanging). Records each call's thread.
class Rendezvous {
 public:
  absl::StatusOr<std::unique_ptr<Communicator>> Join(const GroupMember& m) {
    absl::MutexLock lock(&mu_);
    calls_.push_back({m, std::this_thread::get_id()});
    ++arrived_[m.group];
    const auto all_here = [&] { return arrived_[m.group] == m.size; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&all_here), absl::Seconds(5))) {
      return absl::DeadlineExceededError("the rest of the group never came");
    }
    return std::make_unique<RecordedMember>(m);
  }
  struct Call {
    GroupMember member;
    std::thread::id thread;
  };
  std::vector<Call> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, int> arrived_;
  std::vector<Call> calls_;
};

TEST(MakeGroupCommsTest, EveryRankJoinsItsTpGroupThenItsPpChainOnItsThread) {
  const int tp = 2, pp = 3;
  Rendezvous rv;
  ASSERT_OK_AND_ASSIGN(
      InProcessComms comms,
      MakeGroupComms(tp, pp, [&](const GroupMember& m) { return rv.Join(m); }));
  ASSERT_EQ(comms.per_rank.size(), 6u);
  EXPECT_EQ(comms.owned.size(), 12u);  // Two groups per rank.
  for (int r = 0; r < tp * pp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const int p = r / tp, t = r % tp;
    auto* tp_comm = dynamic_cast<RecordedMember*>(comms.per_rank[r].tp);
    auto* pp_comm = dynamic_cast<RecordedMember*>(comms.per_rank[r].pp);
    ASSERT_NE(tp_comm, nullptr);
    ASSERT_NE(pp_comm, nullptr);
    EXPECT_EQ(tp_comm->name(), "tp group of stage " + std::to_string(p));
    EXPECT_EQ(tp_comm->rank(), t);
    EXPECT_EQ(tp_comm->size(), tp);
    EXPECT_EQ(pp_comm->name(), "pp chain of tp " + std::to_string(t));
    EXPECT_EQ(pp_comm->rank(), p);
    EXPECT_EQ(pp_comm->size(), pp);
    EXPECT_EQ(tp_comm->member().cluster_rank, r);
    EXPECT_EQ(pp_comm->member().cluster_rank, r);
  }
  // Each rank asked on one thread of its own, TP first.
  std::map<int, std::vector<Rendezvous::Call>> by_rank;
  for (const auto& c : rv.calls()) by_rank[c.member.cluster_rank].push_back(c);
  std::set<std::thread::id> threads;
  for (const auto& [r, calls] : by_rank) {
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_EQ(calls[0].thread, calls[1].thread) << "rank " << r;
    EXPECT_EQ(calls[0].member.group.rfind("tp group", 0), 0u) << "rank " << r;
    threads.insert(calls[0].thread);
  }
  EXPECT_EQ(threads.size(), 6u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

TEST(MakeGroupCommsTest, GroupsOfOneAreNotMade) {
  Rendezvous rv;
  ASSERT_OK_AND_ASSIGN(
      InProcessComms tp_only,
      MakeGroupComms(4, 1, [&](const GroupMember& m) { return rv.Join(m); }));
  EXPECT_EQ(tp_only.owned.size(), 4u);
  for (const ShardComms& c : tp_only.per_rank) {
    EXPECT_NE(c.tp, nullptr);
    EXPECT_EQ(c.pp, nullptr);
  }
  ASSERT_OK_AND_ASSIGN(
      InProcessComms none,
      MakeGroupComms(1, 1, [&](const GroupMember& m) { return rv.Join(m); }));
  EXPECT_TRUE(none.owned.empty());
  ASSERT_EQ(none.per_rank.size(), 1u);
  EXPECT_EQ(none.per_rank[0].tp, nullptr);
}

TEST(MakeGroupCommsTest, AnErrorNamesItsGroupAndRankAndEveryThreadEnds) {
  Rendezvous rv;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<InProcessComms> comms = MakeGroupComms(
      2, 2,
      [&](const GroupMember& m)
          -> absl::StatusOr<std::unique_ptr<Communicator>> {
        // Rank 1 of stage 1's TP group fails to join (a bad device, say):
        // its peer waits for it until its own deadline.
        if (m.group == "tp group of stage 1" && m.rank == 1) {
          return absl::FailedPreconditionError("cuda device 3 is busy");
        }
        return rv.Join(m);
      });
  ASSERT_FALSE(comms.ok());
  const std::string message(comms.status().message());
  EXPECT_NE(message.find("tp group of stage 1, rank"), std::string::npos)
      << message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

}  // namespace
}  // namespace shardlm
