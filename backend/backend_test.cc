// Backend contract on every backend: allocation by memory type, copies in
// every direction, streams and events. CUDA cases skip, saying why, where
// there is no GPU.
#include "backend/backend.h"

#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#ifdef SHARDLM_HAVE_CUDA
#include "backend/cuda_backend.h"
#endif

namespace shardlm {
namespace {

std::vector<float> Iota(int n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 1.0f);
  return v;
}

// Host -> m1 -> m2 -> host round trip through `b`, on `stream` if given.
void RoundTrip(Backend& b, MemoryType m1, MemoryType m2, Stream* stream) {
  const int n = 1027;
  Tensor src = *Tensor::Host(DType::kF32, {n});
  const auto want = Iota(n);
  std::memcpy(src.raw(), want.data(), n * sizeof(float));
  auto t1 = b.Allocate(DType::kF32, {n}, m1);
  ASSERT_TRUE(t1.ok()) << t1.status();
  auto t2 = b.Allocate(DType::kF32, {n}, m2);
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_EQ(t1->memory(), m1);
  Tensor back = *Tensor::Host(DType::kF32, {n});
  ASSERT_TRUE(b.Copy(src, *t1, stream).ok());
  ASSERT_TRUE(b.Copy(*t1, *t2, stream).ok());
  ASSERT_TRUE(b.Copy(*t2, back, stream).ok());
  if (stream != nullptr) {
    ASSERT_TRUE(stream->Synchronize().ok());
  }
  EXPECT_EQ(std::memcmp(back.raw(), want.data(), n * sizeof(float)), 0);
}

TEST(CpuBackendTest, HostOnly) {
  auto b = NewCpuBackend();
  EXPECT_EQ(b->name(), "cpu");
  RoundTrip(*b, MemoryType::kHost, MemoryType::kHost, nullptr);
  auto s = b->CreateStream();
  ASSERT_TRUE(s.ok());
  RoundTrip(*b, MemoryType::kHost, MemoryType::kHost, s->get());
  auto d = b->Allocate(DType::kF32, {4}, MemoryType::kDevice);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  auto e = b->CreateEvent();
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE((*e)->Record(**s).ok());
  EXPECT_TRUE(*(*e)->Done());
}

TEST(CpuBackendTest, CopyChecksSizes) {
  auto b = NewCpuBackend();
  Tensor a = *Tensor::Host(DType::kF32, {4});
  Tensor c = *Tensor::Host(DType::kF32, {5});
  Tensor i = *Tensor::Host(DType::kI32, {4});
  EXPECT_EQ(b->Copy(a, c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->Copy(a, i).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorTest, OwningKeepsOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(8, 2.0f);
  std::weak_ptr<std::vector<float>> weak = owner;
  {
    auto t = Tensor::Owning(DType::kF32, {8}, owner->data(), MemoryType::kHost,
                            owner);
    ASSERT_TRUE(t.ok());
    owner.reset();
    Tensor copy = *t;
    EXPECT_FALSE(weak.expired());
    EXPECT_EQ(copy.f32()[7], 2.0f);
  }
  EXPECT_TRUE(weak.expired());
}

#ifdef SHARDLM_HAVE_CUDA
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
#endif  // SHARDLM_HAVE_CUDA

}  // namespace
}  // namespace shardlm
