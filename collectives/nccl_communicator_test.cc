// NcclCommunicator on every visible GPU, one thread per GPU: the exact
// results of fake_communicator_test.cc on device buffers. Skips, saying
// why, where there is no CUDA device.
#include "collectives/nccl_communicator.h"

#include <cuda_runtime.h>

#include <functional>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

using ::testing::HasSubstr;

// Number of CUDA devices, or 0 with `why` set.
int DeviceCount(std::string& why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0) why = "cudaGetDeviceCount returned 0";
  return n;
}

#define SKIP_WITHOUT_GPU(n)       \
  std::string why;                \
  const int n = DeviceCount(why); \
  if (n == 0) GTEST_SKIP() << "no CUDA device: " << why

// Move-only cudaMalloc'd f32 array of `n` elements on the current device.
class DeviceF32 {
 public:
  explicit DeviceF32(int64_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&ptr_, n * sizeof(float)), cudaSuccess);
  }
  DeviceF32(const DeviceF32&) = delete;
  DeviceF32& operator=(const DeviceF32&) = delete;
  ~DeviceF32() { cudaFree(ptr_); }

  Tensor tensor(int64_t begin = 0, int64_t count = -1) const {
    if (count < 0) count = n_ - begin;
    return Tensor::View(DType::kF32, {count}, ptr_ + begin, MemoryType::kDevice)
        .value();
  }
  void Upload(const std::vector<float>& v, int64_t begin = 0) {
    EXPECT_EQ(cudaMemcpy(ptr_ + begin, v.data(), v.size() * sizeof(float),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<float> Download() const {
    std::vector<float> v(n_);
    EXPECT_EQ(
        cudaMemcpy(v.data(), ptr_, n_ * sizeof(float), cudaMemcpyDeviceToHost),
        cudaSuccess);
    return v;
  }

 private:
  float* ptr_ = nullptr;
  int64_t n_;
};

float Input(int rank, int64_t i) { return static_cast<float>(rank * 1000 + i); }

std::vector<float> Inputs(int rank, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = Input(rank, i);
  return v;
}

// Creates a group over devices 0..n-1 and runs fn(comm) on one thread each.
void RunOnAllGpus(int n, CommOptions options,
                  const std::function<void(NcclCommunicator&)>& fn) {
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<std::thread> threads;
  for (int d = 0; d < n; ++d) {
    threads.emplace_back([&, d] {
      auto comm = NcclCommunicator::Create({.unique_id = *id,
                                            .rank = d,
                                            .size = n,
                                            .device = d,
                                            .name = "gpu group",
                                            .options = options});
      ASSERT_TRUE(comm.ok()) << comm.status();
      fn(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(NcclCommunicatorTest, ExactResultsOnAllGpus) {
  SKIP_WITHOUT_GPU(n);
  RunOnAllGpus(n, {}, [n](NcclCommunicator& c) {
    const int r = c.rank();
    for (int64_t len : {1, 7, 4097}) {
      SCOPED_TRACE("rank " + std::to_string(r) + " n=" + std::to_string(len));
      for (bool in_place : {false, true}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          DeviceF32 send(len), recv(len);
          send.Upload(Inputs(r, len));
          Tensor out = in_place ? send.tensor() : recv.tensor();
          ASSERT_TRUE(c.AllReduce(send.tensor(), out, op).ok());
          const auto got = in_place ? send.Download() : recv.Download();
          for (int64_t i = 0; i < len; ++i) {
            const float want = op == ReduceOp::kSum
                                   ? 1000.0f * n * (n - 1) / 2 + n * i
                                   : Input(n - 1, i);
            ASSERT_EQ(got[i], want) << "i " << i;
          }
        }
      }
      DeviceF32 send(len), all(n * len);
      send.Upload(Inputs(r, len));
      Tensor all_t = all.tensor();
      ASSERT_TRUE(c.AllGather(send.tensor(), all_t).ok());
      auto got = all.Download();
      for (int s = 0; s < n; ++s) {
        for (int64_t i = 0; i < len; ++i)
          ASSERT_EQ(got[s * len + i], Input(s, i));
      }
      DeviceF32 all2(n * len);  // In place.
      all2.Upload(Inputs(r, len), r * len);
      Tensor all2_t = all2.tensor();
      ASSERT_TRUE(c.AllGather(all2.tensor(r * len, len), all2_t).ok());
      got = all2.Download();
      for (int s = 0; s < n; ++s) ASSERT_EQ(got[s * len], Input(s, 0));

      for (int root = 0; root < n; ++root) {
        DeviceF32 data(len);
        data.Upload(Inputs(r, len));
        Tensor t = data.tensor();
        ASSERT_TRUE(c.Broadcast(t, root).ok());
        got = data.Download();
        for (int64_t i = 0; i < len; ++i) ASSERT_EQ(got[i], Input(root, i));
      }
      if (n > 1) {
        const int next = (r + 1) % n, prev = (r + n - 1) % n;
        DeviceF32 out(len), in(len);
        out.Upload(Inputs(r, len));
        Tensor in_t = in.tensor();
        if (r == 0) {
          ASSERT_TRUE(c.Send(out.tensor(), next).ok());
          ASSERT_TRUE(c.Recv(in_t, prev).ok());
        } else {
          ASSERT_TRUE(c.Recv(in_t, prev).ok());
          ASSERT_TRUE(c.Send(out.tensor(), next).ok());
        }
        got = in.Download();
        for (int64_t i = 0; i < len; ++i) ASSERT_EQ(got[i], Input(prev, i));
      }
      ASSERT_TRUE(c.Barrier().ok());
    }
  });
}

TEST(NcclCommunicatorTest, HostMemoryIsInvalidArgument) {
  SKIP_WITHOUT_GPU(n);
  RunOnAllGpus(1, {}, [](NcclCommunicator& c) {
    Tensor host = Tensor::Host(DType::kF32, {4}).value();
    absl::Status s = c.AllReduce(host, host, ReduceOp::kSum);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("host memory"));
    EXPECT_TRUE(c.Barrier().ok());
  });
}

// Needs one GPU: rank 1 of the group never joins.
TEST(NcclCommunicatorTest, InitTimeoutNamesGroup) {
  SKIP_WITHOUT_GPU(n);
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto comm =
      NcclCommunicator::Create({.unique_id = *id,
                                .rank = 0,
                                .size = 2,
                                .device = 0,
                                .name = "tp group of stage 0",
                                .options = {.timeout = absl::Seconds(2)}});
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded)
      << comm.status();
  EXPECT_THAT(std::string(comm.status().message()),
              HasSubstr("tp group of stage 0: rank 0 on device 0: NCCL init "
                        "timed out"));
}

TEST(NcclCommunicatorTest, BadConfigIsInvalidArgumentWithoutAGpu) {
  auto comm = NcclCommunicator::Create(
      {.unique_id = "short", .rank = 0, .size = 1, .name = "g"});
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
  comm = NcclCommunicator::Create(
      {.unique_id = std::string(128, '\0'), .rank = 2, .size = 2, .name = "g"});
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardlm
