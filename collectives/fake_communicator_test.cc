// Exact-result tests of the in-process group, nccl-tests style: rank r's
// element i is r * 1000 + i (plus a per-iteration offset), so every sum,
// max, gather and broadcast is known exactly in float.
#include "collectives/fake_communicator.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <latch>
#include <random>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

using ::testing::HasSubstr;

// Runs fn(comm) on one thread per rank and joins them.
void RunGroup(std::vector<std::unique_ptr<Communicator>>& comms,
              const std::function<void(Communicator&)>& fn) {
  std::vector<std::thread> threads;
  for (auto& c : comms) threads.emplace_back([&fn, &c] { fn(*c); });
  for (auto& t : threads) t.join();
}

Tensor F32(int64_t n) { return Tensor::Host(DType::kF32, {n}).value(); }

float Input(int rank, int64_t i, int iter = 0) {
  return static_cast<float>(rank * 1000 + i + iter * 7);
}

void Fill(Tensor& t, int rank, int iter = 0) {
  auto v = t.f32();
  for (size_t i = 0; i < v.size(); ++i) v[i] = Input(rank, i, iter);
}

class FakeCollectiveTest
    : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(FakeCollectiveTest, AllReduceSumAndMaxExact) {
  const int size = std::get<0>(GetParam());
  const int64_t n = std::get<1>(GetParam());
  auto comms = MakeFakeGroup(size, "test group");
  RunGroup(comms, [&](Communicator& c) {
    const int r = c.rank();
    for (bool in_place : {false, true}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        Tensor send = F32(n);
        Fill(send, r);
        Tensor recv = in_place ? send : F32(n);
        ASSERT_TRUE(c.AllReduce(send, recv, op).ok());
        for (int64_t i = 0; i < n; ++i) {
          float want = 0;
          if (op == ReduceOp::kSum) {
            want = 1000.0f * size * (size - 1) / 2 + size * i;
          } else {
            want = Input(size - 1, i);
          }
          ASSERT_EQ(recv.f32()[i], want)
              << "rank " << r << " i " << i << " in_place " << in_place;
        }
        if (!in_place) {
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(send.f32()[i], Input(r, i));
        }
      }
    }
  });
}

TEST_P(FakeCollectiveTest, AllGatherExact) {
  const int size = std::get<0>(GetParam());
  const int64_t n = std::get<1>(GetParam());
  auto comms = MakeFakeGroup(size, "test group");
  RunGroup(comms, [&](Communicator& c) {
    Tensor send = F32(n);
    Fill(send, c.rank());
    Tensor recv = F32(size * n);
    ASSERT_TRUE(c.AllGather(send, recv).ok());
    for (int s = 0; s < size; ++s) {
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(recv.f32()[s * n + i], Input(s, i));
      }
    }
    // In place: send is this rank's slice of recv.
    Tensor all = F32(size * n);
    Tensor mine = all.Rows(c.rank() * n, (c.rank() + 1) * n).value();
    Fill(mine, c.rank());
    ASSERT_TRUE(c.AllGather(mine, all).ok());
    for (int s = 0; s < size; ++s) {
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(all.f32()[s * n + i], Input(s, i));
      }
    }
  });
}

TEST_P(FakeCollectiveTest, BroadcastFromEveryRoot) {
  const int size = std::get<0>(GetParam());
  const int64_t n = std::get<1>(GetParam());
  auto comms = MakeFakeGroup(size, "test group");
  RunGroup(comms, [&](Communicator& c) {
    for (int root = 0; root < size; ++root) {
      Tensor data = F32(n);
      Fill(data, c.rank());
      ASSERT_TRUE(c.Broadcast(data, root).ok());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(data.f32()[i], Input(root, i));
    }
  });
}

TEST_P(FakeCollectiveTest, SendRecvRing) {
  const int size = std::get<0>(GetParam());
  const int64_t n = std::get<1>(GetParam());
  auto comms = MakeFakeGroup(size, "test group");
  if (size == 1) {
    // No peer in a group of one: sending to or receiving from oneself is
    // refused, not a hang.
    Tensor t = F32(n);
    EXPECT_EQ(comms[0]->Send(t, 0).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(comms[0]->Recv(t, 0).code(), absl::StatusCode::kInvalidArgument);
    return;
  }
  RunGroup(comms, [&](Communicator& c) {
    const int r = c.rank();
    const int next = (r + 1) % size, prev = (r + size - 1) % size;
    Tensor out = F32(n), in = F32(n);
    Fill(out, r);
    // Send is a rendezvous: rank 0 sends first, the others receive first.
    if (r == 0) {
      ASSERT_TRUE(c.Send(out, next).ok());
      ASSERT_TRUE(c.Recv(in, prev).ok());
    } else {
      ASSERT_TRUE(c.Recv(in, prev).ok());
      ASSERT_TRUE(c.Send(out, next).ok());
    }
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(in.f32()[i], Input(prev, i));
  });
}

TEST_P(FakeCollectiveTest, BackToBackRoundsDoNotMix) {
  const int size = std::get<0>(GetParam());
  const int64_t n = std::get<1>(GetParam());
  auto comms = MakeFakeGroup(size, "test group");
  RunGroup(comms, [&](Communicator& c) {
    const int r = c.rank();
    for (int iter = 0; iter < 40; ++iter) {
      Tensor t = F32(n);
      Fill(t, r, iter);
      switch (iter % 4) {
        case 0: {
          ASSERT_TRUE(c.AllReduce(t, t, ReduceOp::kSum).ok());
          for (int64_t i = 0; i < n; ++i) {
            float want = 0;
            for (int s = 0; s < size; ++s) want += Input(s, i, iter);
            ASSERT_EQ(t.f32()[i], want) << "iter " << iter;
          }
          break;
        }
        case 1: {
          Tensor all = F32(size * n);
          ASSERT_TRUE(c.AllGather(t, all).ok());
          for (int s = 0; s < size; ++s) {
            ASSERT_EQ(all.f32()[s * n + n - 1], Input(s, n - 1, iter));
          }
          break;
        }
        case 2: {
          const int root = iter % size;
          ASSERT_TRUE(c.Broadcast(t, root).ok());
          ASSERT_EQ(t.f32()[n - 1], Input(root, n - 1, iter));
          break;
        }
        case 3:
          ASSERT_TRUE(c.Barrier().ok());
          break;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, FakeCollectiveTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values<int64_t>(1, 7, 4097)),
    [](const auto& info) {
      return "group" + std::to_string(std::get<0>(info.param)) + "_n" +
             std::to_string(std::get<1>(info.param));
    });

TEST(FakeCommunicatorTest, CountsBytesSentPerKindOfCall) {
  // CP's attention-output gather at CP 3 for SmolLM2 (9 heads of 64): 5
  // rows of 576 floats, 11,520 bytes, go to each of the 2 peers: 23,040
  // bytes per rank. Its lse (5 x 9 floats, 180 bytes): 360 more.
  auto comms = MakeFakeGroup(3, "cp group");
  RunGroup(comms, [&](Communicator& c) {
    Tensor out = F32(5 * 576), all = F32(3 * 5 * 576);
    ASSERT_TRUE(c.AllGather(out, all).ok());
    EXPECT_EQ(c.bytes_sent().all_gather, 23040);
    Tensor lse = F32(5 * 9), lse_all = F32(3 * 5 * 9);
    ASSERT_TRUE(c.AllGather(lse, lse_all).ok());
    EXPECT_EQ(c.bytes_sent().all_gather, 23400);
    Tensor rows = F32(576);  // The logit-row sum: 2,304 bytes to 2 peers.
    ASSERT_TRUE(c.AllReduce(rows, rows, ReduceOp::kSum).ok());
    EXPECT_EQ(c.bytes_sent().all_reduce, 4608);
    Tensor data = F32(10);  // Only the root sends a broadcast.
    ASSERT_TRUE(c.Broadcast(data, 1).ok());
    EXPECT_EQ(c.bytes_sent().broadcast, c.rank() == 1 ? 80 : 0);
    EXPECT_EQ(c.bytes_sent().send, 0);
    EXPECT_EQ(c.bytes_sent().total(), 23400 + 4608 + (c.rank() == 1 ? 80 : 0));
  });
  // A failed call counts nothing.
  auto pair = MakeFakeGroup(2, "pair");
  Tensor a = F32(4), wrong = F32(7);
  EXPECT_FALSE(pair[0]->AllGather(a, wrong).ok());
  EXPECT_EQ(pair[0]->bytes_sent().total(), 0);
}

TEST(FakeCommunicatorTest, SumIsBitIdenticalOnEveryRankAndInRankOrder) {
  constexpr int kSize = 4;
  constexpr int64_t kN = 1031;
  // Values of mixed magnitude, so that the order of additions matters.
  std::vector<std::vector<float>> inputs(kSize, std::vector<float>(kN));
  std::mt19937 rng(123);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : inputs) {
    for (float& x : v) x = u(rng) * std::pow(10.0f, u(rng) * 6);
  }
  std::vector<float> want(kN);
  for (int64_t i = 0; i < kN; ++i) {
    float s = inputs[0][i];
    for (int r = 1; r < kSize; ++r) s += inputs[r][i];
    want[i] = s;
  }
  auto comms = MakeFakeGroup(kSize, "test group");
  RunGroup(comms, [&](Communicator& c) {
    Tensor t = F32(kN);
    std::memcpy(t.raw(), inputs[c.rank()].data(), t.bytes());
    ASSERT_TRUE(c.AllReduce(t, t, ReduceOp::kSum).ok());
    EXPECT_EQ(std::memcmp(t.raw(), want.data(), t.bytes()), 0);
  });
}

TEST(FakeCommunicatorTest, AllReduceI32AndSendRecvOfOtherDtypes) {
  auto comms = MakeFakeGroup(2, "test group");
  RunGroup(comms, [&](Communicator& c) {
    Tensor t = Tensor::Host(DType::kI32, {3}).value();
    for (int i = 0; i < 3; ++i) t.data<int32_t>()[i] = c.rank() * 10 + i;
    ASSERT_TRUE(c.AllReduce(t, t, ReduceOp::kSum).ok());
    EXPECT_EQ(t.data<int32_t>()[2], 14);
    // Q8_0 moves by bytes: one block of 34 bytes.
    Tensor q = Tensor::Host(DType::kQ8_0, {32}).value();
    if (c.rank() == 0) {
      std::memset(q.raw(), 0x5a, q.bytes());
      ASSERT_TRUE(c.Send(q, 1).ok());
    } else {
      ASSERT_TRUE(c.Recv(q, 0).ok());
      EXPECT_EQ(static_cast<unsigned char*>(q.raw())[33], 0x5a);
    }
  });
}

TEST(FakeCommunicatorTest, TimeoutNamesMissingRankAndBreaksTheGroup) {
  const absl::Duration timeout = absl::Milliseconds(300);
  auto comms = MakeFakeGroup(3, "tp group of stage 0", {.timeout = timeout});
  std::latch present(2);  // Ranks 0 and 1 call together, however late.
  RunGroup(comms, [&](Communicator& c) {
    if (c.rank() == 2) return;  // Never arrives.
    present.arrive_and_wait();
    Tensor t = F32(7);
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = c.AllReduce(t, t, ReduceOp::kSum);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("tp group of stage 0"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("AllReduce"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("waiting for rank 2"));
    EXPECT_GE(secs, 0.29);
    // It ends (no hang); how soon after the timeout depends on the load of
    // the machine, so the bound is generous (issue #18 item 8).
    EXPECT_LT(secs, 10.0);
    s = c.Barrier();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  });
  // The late rank finds the group unusable instead of hanging.
  Tensor t = F32(7);
  EXPECT_EQ(comms[2]->AllReduce(t, t, ReduceOp::kSum).code(),
            absl::StatusCode::kUnavailable);
}

TEST(FakeCommunicatorTest, RecvTimeoutNamesPeer) {
  auto comms =
      MakeFakeGroup(2, "pp chain 0", {.timeout = absl::Milliseconds(50)});
  Tensor t = F32(4);
  absl::Status s = comms[1]->Recv(t, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("pp chain 0: Recv on rank 1"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("waiting for rank 0"));
  auto comms2 =
      MakeFakeGroup(2, "pp chain 1", {.timeout = absl::Milliseconds(50)});
  s = comms2[0]->Send(t, 1);  // No matching Recv.
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("waiting for rank 1"));
  EXPECT_EQ(comms2[0]->Send(t, 1).code(), absl::StatusCode::kUnavailable);
}

TEST(FakeCommunicatorTest, BadArgumentsAreInvalidArgument) {
  auto comms = MakeFakeGroup(2, "g");
  Communicator& c = *comms[0];
  Tensor a = F32(4), b = F32(5), all = F32(7);
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(c.AllReduce(a, b, ReduceOp::kSum).code(), kInvalid);
  Tensor h = Tensor::Host(DType::kF16, {4}).value();
  EXPECT_EQ(c.AllReduce(a, h, ReduceOp::kSum).code(), kInvalid);
  absl::Status s = c.AllReduce(h, h, ReduceOp::kSum);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_THAT(std::string(s.message()), HasSubstr("F16"));
  EXPECT_EQ(c.AllGather(a, all).code(), kInvalid);
  EXPECT_EQ(c.Broadcast(a, 2).code(), kInvalid);
  EXPECT_EQ(c.Broadcast(a, -1).code(), kInvalid);
  EXPECT_EQ(c.Send(a, 0).code(), kInvalid);  // Self.
  EXPECT_EQ(c.Recv(a, 5).code(), kInvalid);
  float x[4];
  Tensor dev = Tensor::View(DType::kF32, {4}, x, MemoryType::kDevice).value();
  s = c.AllReduce(dev, dev, ReduceOp::kSum);
  EXPECT_EQ(s.code(), kInvalid);
  EXPECT_THAT(std::string(s.message()), HasSubstr("device memory"));
  Tensor empty;
  EXPECT_EQ(c.Broadcast(empty, 0).code(), kInvalid);
}

TEST(FakeCommunicatorTest, MismatchAcrossRanksIsInvalidArgumentOnAll) {
  auto comms = MakeFakeGroup(2, "g");
  RunGroup(comms, [&](Communicator& c) {
    Tensor t = F32(c.rank() == 0 ? 4 : 5);
    absl::Status s = c.AllReduce(t, t, ReduceOp::kSum);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("differ across ranks"));
    // The group stays usable.
    EXPECT_TRUE(c.Barrier().ok());
  });
  RunGroup(comms, [&](Communicator& c) {
    Tensor t = F32(4);
    absl::Status s = c.rank() == 0 ? c.Send(t, 1) : c.Recv(t = F32(3), 0);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("sent 16 bytes"));
  });
}

}  // namespace
}  // namespace shardlm
