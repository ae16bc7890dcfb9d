// Shared by backend_test.cc and cuda_backend_test.cc.
#ifndef SHARDLM_BACKEND_ROUND_TRIP_TEST_UTIL_H_
#define SHARDLM_BACKEND_ROUND_TRIP_TEST_UTIL_H_

#include <cstring>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "gtest/gtest.h"

namespace shardlm::testing_util {

inline std::vector<float> Iota(int n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 1.0f);
  return v;
}

// Host -> m1 -> m2 -> host round trip through `b`, on `stream` if given.
inline void RoundTrip(Backend& b, MemoryType m1, MemoryType m2,
                      Stream* stream) {
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

}  // namespace shardlm::testing_util

#endif  // SHARDLM_BACKEND_ROUND_TRIP_TEST_UTIL_H_
