// Backend contract on the CPU backend: allocation by memory type, copies,
// streams and events; the Tensor owner contract. The CUDA backend's cases
// are in cuda_backend_test.cc (a GPU-only binary, so that this one never
// skips).
#include "backend/backend.h"

#include <memory>
#include <vector>

#include "backend/round_trip_test_util.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

using testing_util::RoundTrip;

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

}  // namespace
}  // namespace shardlm
