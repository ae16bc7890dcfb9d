// The exact-result checks every host Communicator passes (fake, MPI,
// Gloo): AllReduce sum and max, AllGather (also in place), Broadcast from
// every root and a Send/Recv ring, at sizes 1, 7 and 4097, and the bytes
// each rank counts as sent for them (CommBytes). Every rank of the group
// calls CheckExactResults at once.
#ifndef SHARDLM_COLLECTIVES_COLLECTIVE_CHECKS_H_
#define SHARDLM_COLLECTIVES_COLLECTIVE_CHECKS_H_

#include <cstdint>
#include <string>

#include "collectives/communicator.h"
#include "gtest/gtest.h"

namespace shardlm {

inline Tensor F32(int64_t n) { return Tensor::Host(DType::kF32, {n}).value(); }

inline float Input(int rank, int64_t i) {
  return static_cast<float>(rank * 1000 + i);
}

inline void Fill(Tensor& t, int rank) {
  auto v = t.f32();
  for (size_t i = 0; i < v.size(); ++i) v[i] = Input(rank, i);
}

// The checks of fake_communicator_test.cc on one group.
inline void CheckExactResults(Communicator& c) {
  const int size = c.size(), r = c.rank();
  SCOPED_TRACE(c.name() + " rank " + std::to_string(r));
  const CommBytes before = c.bytes_sent();
  CommBytes want = before;
  for (int64_t n : {1, 7, 4097}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    for (bool in_place : {false, true}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        Tensor send = F32(n);
        Fill(send, r);
        Tensor recv = in_place ? send : F32(n);
        ASSERT_TRUE(c.AllReduce(send, recv, op).ok());
        for (int64_t i = 0; i < n; ++i) {
          const float want = op == ReduceOp::kSum
                                 ? 1000.0f * size * (size - 1) / 2 + size * i
                                 : Input(size - 1, i);
          ASSERT_EQ(recv.f32()[i], want)
              << "i " << i << " in_place " << in_place;
        }
      }
    }
    Tensor send = F32(n), all = F32(size * n);
    Fill(send, r);
    ASSERT_TRUE(c.AllGather(send, all).ok());
    for (int s = 0; s < size; ++s) {
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(all.f32()[s * n + i], Input(s, i));
      }
    }
    all = F32(size * n);  // In place: send is this rank's slice of recv.
    Tensor mine = all.Rows(r * n, (r + 1) * n).value();
    Fill(mine, r);
    ASSERT_TRUE(c.AllGather(mine, all).ok());
    for (int s = 0; s < size; ++s) ASSERT_EQ(all.f32()[s * n], Input(s, 0));

    for (int root = 0; root < size; ++root) {
      Tensor data = F32(n);
      Fill(data, r);
      ASSERT_TRUE(c.Broadcast(data, root).ok());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(data.f32()[i], Input(root, i));
    }

    if (size > 1) {
      const int next = (r + 1) % size, prev = (r + size - 1) % size;
      Tensor out = F32(n), in = F32(n);
      Fill(out, r);
      // Large messages are rendezvous in MPI too: break the ring's cycle.
      if (r == 0) {
        ASSERT_TRUE(c.Send(out, next).ok());
        ASSERT_TRUE(c.Recv(in, prev).ok());
      } else {
        ASSERT_TRUE(c.Recv(in, prev).ok());
        ASSERT_TRUE(c.Send(out, next).ok());
      }
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(in.f32()[i], Input(prev, i));
    }
    ASSERT_TRUE(c.Barrier().ok());
    // Each peer gets this rank's buffer of 4n bytes once per call: four
    // all-reduces, two all-gathers, the broadcast this rank roots, one send.
    const int64_t to_peers = (size - 1) * n * 4;
    want.all_reduce += 4 * to_peers;
    want.all_gather += 2 * to_peers;
    want.broadcast += to_peers;
    if (size > 1) want.send += n * 4;
  }
  EXPECT_EQ(c.bytes_sent().all_reduce, want.all_reduce);
  EXPECT_EQ(c.bytes_sent().all_gather, want.all_gather);
  EXPECT_EQ(c.bytes_sent().broadcast, want.broadcast);
  EXPECT_EQ(c.bytes_sent().send, want.send);
}

}  // namespace shardlm

#endif  // SHARDLM_COLLECTIVES_COLLECTIVE_CHECKS_H_
