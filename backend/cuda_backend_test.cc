// Backend contract on the CUDA backend: allocation by memory type, copies in
// every direction, streams and events. Needs a GPU: every case skips,
// saying why, where there is none (the binary is labelled gpu only).
#include "backend/cuda_backend.h"

#include <cstdint>

#include "backend/round_trip_test_util.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

using testing_util::RoundTrip;

#define SKIP_WITHOUT_GPU() \
  if (auto n = CudaDeviceCount(); !n.ok()) GTEST_SKIP() << n.status().message()

TEST(CudaBackendTest, EveryDirection) {
  SKIP_WITHOUT_GPU();
  auto b = NewCudaBackend(0);
  ASSERT_TRUE(b.ok()) << b.status();
  auto s = (*b)->CreateStream();
  ASSERT_TRUE(s.ok()) << s.status();
  for (MemoryType m1 : {MemoryType::kHostPinned, MemoryType::kDevice}) {
    for (MemoryType m2 : {MemoryType::kHostPinned, MemoryType::kDevice}) {
      RoundTrip(**b, m1, m2, nullptr);
      RoundTrip(**b, m1, m2, s->get());
    }
  }
}

// s1 overwrites a device buffer with junk several times, then with the
// data; an event recorded after that makes s2 wait before copying the
// buffer out. Without the wait s2's copy would run beside s1's (another
// copy engine) and bring back junk. Every host buffer is pinned: a copy
// from pageable memory blocks the host until it is done, which would order
// the streams by itself and hide a missing wait. The whole buffer is
// checked, not one element.
TEST(CudaBackendTest, EventsOrderStreams) {
  SKIP_WITHOUT_GPU();
  auto b = NewCudaBackend(0);
  ASSERT_TRUE(b.ok()) << b.status();
  auto s1 = (*b)->CreateStream();
  auto s2 = (*b)->CreateStream();
  auto e = (*b)->CreateEvent();
  ASSERT_TRUE(s1.ok() && s2.ok() && e.ok());
  const int n = 1 << 24;  // 64 MiB: each copy takes a while.
  const auto pinned = [&] {
    return *(*b)->Allocate(DType::kF32, {n}, MemoryType::kHostPinned);
  };
  Tensor want = pinned(), junk = pinned(), out = pinned();
  for (int i = 0; i < n; ++i) {
    static_cast<float*>(want.raw())[i] = static_cast<float>(i);  // Exact.
    static_cast<float*>(junk.raw())[i] = -1.0f;
    static_cast<float*>(out.raw())[i] = -2.0f;
  }
  Tensor dev = *(*b)->Allocate(DType::kF32, {n}, MemoryType::kDevice);
  ASSERT_TRUE((*b)->Copy(junk, dev).ok());
  for (int k = 0; k < 8; ++k) {
    ASSERT_TRUE((*b)->Copy(junk, dev, s1->get()).ok());
  }
  ASSERT_TRUE((*b)->Copy(want, dev, s1->get()).ok());
  ASSERT_TRUE((*e)->Record(**s1).ok());
  ASSERT_TRUE((*e)->Wait(**s2).ok());
  ASSERT_TRUE((*b)->Copy(dev, out, s2->get()).ok());
  ASSERT_TRUE((*s2)->Synchronize().ok());
  EXPECT_TRUE(*(*e)->Done());
  const float* got = static_cast<const float*>(out.raw());
  int64_t wrong = 0, first = -1;
  for (int i = 0; i < n; ++i) {
    if (got[i] != static_cast<float>(i)) {
      if (first < 0) first = i;
      ++wrong;
    }
  }
  EXPECT_EQ(wrong, 0) << "first at " << first << ": "
                      << (first >= 0 ? got[first] : 0.0f);
  ASSERT_TRUE((*s1)->Synchronize().ok());
}

TEST(CudaBackendTest, HugeAllocationIsResourceExhausted) {
  SKIP_WITHOUT_GPU();
  auto b = NewCudaBackend(0);
  ASSERT_TRUE(b.ok()) << b.status();
  auto t = (*b)->Allocate(DType::kF32, {int64_t{1} << 46}, MemoryType::kDevice);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted)
      << t.status();
}

TEST(CudaBackendTest, BadDeviceIsAnError) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(NewCudaBackend(1000).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardlm
