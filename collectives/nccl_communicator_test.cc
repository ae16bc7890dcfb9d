// NcclCommunicator on every visible GPU, one thread per GPU: the exact
// results of fake_communicator_test.cc on device buffers. Skips, saying
// why, where there is no CUDA device.
#include "collectives/nccl_communicator.h"

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "absl/time/clock.h"
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

// A group of one rank makes every collective the identity, which proves
// nothing about NCCL between ranks: on one GPU these cases skip, and
// tests/gpu/session.sh reports them as "multi-rank cases not run: one GPU".
#define SKIP_WITHOUT_TWO_GPUS(n) \
  SKIP_WITHOUT_GPU(n);           \
  if (n < 2)                     \
  GTEST_SKIP() << "multi-rank case: needs 2 GPUs, this machine has " << n

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
  // Complete on return: a pageable cudaMemcpy may still be copying when
  // it returns, and the communicators' streams do not wait for it.
  void Upload(const std::vector<float>& v, int64_t begin = 0) {
    EXPECT_EQ(cudaMemcpy(ptr_ + begin, v.data(), v.size() * sizeof(float),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
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
                  const std::function<void(NcclCommunicator&)>& fn,
                  bool asynchronous = false) {
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
                                            .options = options,
                                            .asynchronous = asynchronous});
      ASSERT_TRUE(comm.ok()) << comm.status();
      ASSERT_EQ((*comm)->asynchronous(), asynchronous);
      fn(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

// Every group size from 2 to the number of GPUs, as the fake (1..4
// threads) and MPI (2..4 ranks) suites do; in the asynchronous mode each
// result is read after Synchronize (a no-op in the synchronous one).
void ExactResultsOnEveryGroupSize(int gpus, bool asynchronous) {
  std::printf("nccl: group sizes 2..%d tested (%s)\n", gpus,
              asynchronous ? "asynchronous" : "synchronous");
  for (int n = 2; n <= gpus; ++n) {
    SCOPED_TRACE("group of " + std::to_string(n));
    RunOnAllGpus(
        n, {},
        [n](NcclCommunicator& c) {
          const int r = c.rank();
          for (int64_t len : {1, 7, 4097}) {
            SCOPED_TRACE("rank " + std::to_string(r) +
                         " n=" + std::to_string(len));
            for (bool in_place : {false, true}) {
              for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
                DeviceF32 send(len), recv(len);
                send.Upload(Inputs(r, len));
                Tensor out = in_place ? send.tensor() : recv.tensor();
                ASSERT_TRUE(c.AllReduce(send.tensor(), out, op).ok());
                ASSERT_TRUE(c.Synchronize().ok());
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
            ASSERT_TRUE(c.Synchronize().ok());
            auto got = all.Download();
            for (int s = 0; s < n; ++s) {
              for (int64_t i = 0; i < len; ++i)
                ASSERT_EQ(got[s * len + i], Input(s, i));
            }
            DeviceF32 all2(n * len);  // In place.
            all2.Upload(Inputs(r, len), r * len);
            Tensor all2_t = all2.tensor();
            ASSERT_TRUE(c.AllGather(all2.tensor(r * len, len), all2_t).ok());
            ASSERT_TRUE(c.Synchronize().ok());
            got = all2.Download();
            for (int s = 0; s < n; ++s) ASSERT_EQ(got[s * len], Input(s, 0));

            for (int root = 0; root < n; ++root) {
              DeviceF32 data(len);
              data.Upload(Inputs(r, len));
              Tensor t = data.tensor();
              ASSERT_TRUE(c.Broadcast(t, root).ok());
              ASSERT_TRUE(c.Synchronize().ok());
              got = data.Download();
              for (int64_t i = 0; i < len; ++i)
                ASSERT_EQ(got[i], Input(root, i));
            }
            {
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
              ASSERT_TRUE(c.Synchronize().ok());
              got = in.Download();
              for (int64_t i = 0; i < len; ++i)
                ASSERT_EQ(got[i], Input(prev, i));
            }
            ASSERT_TRUE(c.Barrier().ok());
          }
        },
        asynchronous);
  }
}

TEST(NcclCommunicatorTest, ExactResultsOnEveryGroupSize) {
  SKIP_WITHOUT_TWO_GPUS(gpus);
  ExactResultsOnEveryGroupSize(gpus, /*asynchronous=*/false);
}

TEST(NcclCommunicatorTest, AsyncExactResultsOnEveryGroupSize) {
  SKIP_WITHOUT_TWO_GPUS(gpus);
  ExactResultsOnEveryGroupSize(gpus, /*asynchronous=*/true);
}

// Mixed collectives back to back on one communicator (fake suite's
// BackToBackRoundsDoNotMix): results must not bleed between rounds.
void BackToBackRoundsDoNotMix(int n, bool asynchronous) {
  const int64_t len = 4097;
  RunOnAllGpus(
      n, {},
      [n, len](NcclCommunicator& c) {
        const int r = c.rank();
        for (int iter = 0; iter < 40; ++iter) {
          std::vector<float> in(len);
          for (int64_t i = 0; i < len; ++i) in[i] = Input(r, i) + iter;
          DeviceF32 t(len);
          t.Upload(in);
          Tensor tt = t.tensor();
          switch (iter % 4) {
            case 0: {
              ASSERT_TRUE(c.AllReduce(tt, tt, ReduceOp::kSum).ok());
              ASSERT_TRUE(c.Synchronize().ok());
              const auto got = t.Download();
              for (int64_t i = 0; i < len; ++i) {
                float want = 0;
                for (int s = 0; s < n; ++s) want += Input(s, i) + iter;
                ASSERT_EQ(got[i], want) << "iter " << iter;
              }
              break;
            }
            case 1: {
              DeviceF32 all(n * len);
              Tensor all_t = all.tensor();
              ASSERT_TRUE(c.AllGather(tt, all_t).ok());
              ASSERT_TRUE(c.Synchronize().ok());
              const auto got = all.Download();
              for (int s = 0; s < n; ++s) {
                ASSERT_EQ(got[s * len + len - 1], Input(s, len - 1) + iter);
              }
              break;
            }
            case 2: {
              const int root = iter % n;
              ASSERT_TRUE(c.Broadcast(tt, root).ok());
              ASSERT_TRUE(c.Synchronize().ok());
              ASSERT_EQ(t.Download()[len - 1], Input(root, len - 1) + iter);
              break;
            }
            case 3:
              ASSERT_TRUE(c.Barrier().ok());
              break;
          }
        }
      },
      asynchronous);
}

TEST(NcclCommunicatorTest, BackToBackRoundsDoNotMix) {
  SKIP_WITHOUT_TWO_GPUS(n);
  BackToBackRoundsDoNotMix(n, /*asynchronous=*/false);
}

TEST(NcclCommunicatorTest, AsyncBackToBackRoundsDoNotMix) {
  SKIP_WITHOUT_TWO_GPUS(n);
  BackToBackRoundsDoNotMix(n, /*asynchronous=*/true);
}

// I32 and BF16 reductions, and Send/Recv of a quantized dtype (bytes).
TEST(NcclCommunicatorTest, AllReduceI32Bf16AndSendRecvOfOtherDtypes) {
  SKIP_WITHOUT_TWO_GPUS(n);
  RunOnAllGpus(n, {}, [n](NcclCommunicator& c) {
    const int r = c.rank();
    int32_t* ip = nullptr;
    ASSERT_EQ(cudaMalloc(&ip, 3 * sizeof(int32_t)), cudaSuccess);
    const int32_t ih[3] = {r * 10, r * 10 + 1, r * 10 + 2};
    ASSERT_EQ(cudaMemcpy(ip, ih, sizeof(ih), cudaMemcpyHostToDevice),
              cudaSuccess);
    Tensor it = Tensor::View(DType::kI32, {3}, ip, MemoryType::kDevice).value();
    ASSERT_TRUE(c.AllReduce(it, it, ReduceOp::kSum).ok());
    int32_t got[3];
    ASSERT_EQ(cudaMemcpy(got, ip, sizeof(got), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(got[2], 10 * n * (n - 1) / 2 + 2 * n);
    cudaFree(ip);

    // bf16 1.0 (0x3f80) summed over n ranks is exactly n for n <= 256.
    uint16_t* bp = nullptr;
    ASSERT_EQ(cudaMalloc(&bp, 8 * sizeof(uint16_t)), cudaSuccess);
    std::vector<uint16_t> ones(8, 0x3f80);
    ASSERT_EQ(cudaMemcpy(bp, ones.data(), 16, cudaMemcpyHostToDevice),
              cudaSuccess);
    Tensor bt =
        Tensor::View(DType::kBF16, {8}, bp, MemoryType::kDevice).value();
    ASSERT_TRUE(c.AllReduce(bt, bt, ReduceOp::kSum).ok());
    uint16_t bh[8];
    ASSERT_EQ(cudaMemcpy(bh, bp, 16, cudaMemcpyDeviceToHost), cudaSuccess);
    uint32_t bits = static_cast<uint32_t>(bh[7]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    EXPECT_EQ(f, static_cast<float>(n));
    cudaFree(bp);

    {  // Q8_0 moves by bytes: one block of 34 bytes.
      void* qp = nullptr;
      ASSERT_EQ(cudaMalloc(&qp, 34), cudaSuccess);
      Tensor q =
          Tensor::View(DType::kQ8_0, {32}, qp, MemoryType::kDevice).value();
      if (r == 0) {
        ASSERT_EQ(cudaMemset(qp, 0x5a, 34), cudaSuccess);
        ASSERT_TRUE(c.Send(q, 1).ok());
      } else if (r == 1) {
        ASSERT_TRUE(c.Recv(q, 0).ok());
        unsigned char last = 0;
        ASSERT_EQ(cudaMemcpy(&last, static_cast<char*>(qp) + 33, 1,
                             cudaMemcpyDeviceToHost),
                  cudaSuccess);
        EXPECT_EQ(last, 0x5a);
      }
      cudaFree(qp);
    }
    ASSERT_TRUE(c.Barrier().ok());
  });
}

// The argument checks every Communicator shares (fake and MPI suites'
// BadArgumentsAreInvalidArgument), on device buffers.
TEST(NcclCommunicatorTest, BadArgumentsAreInvalidArgument) {
  SKIP_WITHOUT_GPU(n);
  RunOnAllGpus(1, {}, [](NcclCommunicator& c) {
    DeviceF32 buf(16);
    Tensor a = buf.tensor(0, 4), b = buf.tensor(0, 5), all = buf.tensor(0, 7);
    const auto kInvalid = absl::StatusCode::kInvalidArgument;
    EXPECT_EQ(c.AllReduce(a, b, ReduceOp::kSum).code(), kInvalid);
    EXPECT_EQ(c.AllGather(a, all).code(), kInvalid);
    EXPECT_EQ(c.Broadcast(a, 1).code(), kInvalid);
    EXPECT_EQ(c.Broadcast(a, -1).code(), kInvalid);
    EXPECT_EQ(c.Send(a, 0).code(), kInvalid);  // Self.
    EXPECT_EQ(c.Recv(a, 5).code(), kInvalid);
    Tensor empty;
    EXPECT_EQ(c.Broadcast(empty, 0).code(), kInvalid);
    // The communicator stays usable.
    EXPECT_TRUE(c.Barrier().ok());
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

// On the caller's stream (as a GPU worker's runner gives it its compute
// stream): the collective is ordered after the kernels queued before it,
// with no synchronization in between, and the call returns when it is
// done. The input is written by an async copy queued on that stream just
// before: a collective on another stream could read it early.
TEST(NcclCommunicatorTest, CollectivesRunOnTheCallersStream) {
  SKIP_WITHOUT_GPU(gpus);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  {
    auto comm = NcclCommunicator::Create({.unique_id = *id,
                                          .rank = 0,
                                          .size = 1,
                                          .device = 0,
                                          .name = "on the caller's stream",
                                          .stream = stream});
    ASSERT_TRUE(comm.ok()) << comm.status();
    constexpr int64_t kN = 1 << 22;  // 16 MiB: the copy takes a while.
    DeviceF32 a(kN), b(kN);
    std::vector<float> want = Inputs(3, kN);
    float* pinned = nullptr;
    ASSERT_EQ(cudaMallocHost(&pinned, kN * sizeof(float)), cudaSuccess);
    std::memcpy(pinned, want.data(), kN * sizeof(float));
    ASSERT_EQ(cudaMemcpyAsync(a.tensor().raw(), pinned, kN * sizeof(float),
                              cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    Tensor in = a.tensor(), out = b.tensor();
    ASSERT_TRUE((*comm)->AllReduce(in, out, ReduceOp::kSum).ok());
    EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess);  // Drained on return.
    EXPECT_EQ(b.Download(), want);
    cudaFreeHost(pinned);
  }
  // The communicator does not own (or destroy) the caller's stream.
  EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
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

// The asynchronous mode's use: many calls queued with no host wait, one
// Synchronize, then every result exact (by hand, as above). On every GPU
// there is: a group of one on a single GPU (each call the identity, so
// this checks the events, the watchdog's release of every one and the
// buffers' ordering, not NCCL between ranks).
TEST(NcclCommunicatorTest, AsyncManyCallsOneSynchronize) {
  SKIP_WITHOUT_GPU(n);
  std::printf("nccl: asynchronous group of %d\n", n);
  static constexpr int kCalls = 30;
  static constexpr int64_t kLen = 1031;
  RunOnAllGpus(
      n, {},
      [n](NcclCommunicator& c) {
        const int r = c.rank();
        std::vector<std::unique_ptr<DeviceF32>> in, out;
        for (int i = 0; i < kCalls; ++i) {
          std::vector<float> v = Inputs(r, kLen);
          for (float& x : v) x += i;
          in.push_back(std::make_unique<DeviceF32>(kLen));
          in.back()->Upload(v);
          out.push_back(
              std::make_unique<DeviceF32>(i % 3 == 1 ? n * kLen : kLen));
        }
        for (int i = 0; i < kCalls; ++i) {
          Tensor o = out[i]->tensor();
          Tensor t = in[i]->tensor();
          switch (i % 3) {
            case 0:
              ASSERT_TRUE(c.AllReduce(in[i]->tensor(), o, ReduceOp::kSum).ok());
              break;
            case 1:
              ASSERT_TRUE(c.AllGather(in[i]->tensor(), o).ok());
              break;
            case 2:
              ASSERT_TRUE(c.Broadcast(t, i % n).ok());
              break;
          }
        }
        ASSERT_TRUE(c.Synchronize().ok());
        for (int i = 0; i < kCalls; ++i) {
          SCOPED_TRACE("call " + std::to_string(i));
          const auto got = i % 3 == 2 ? in[i]->Download() : out[i]->Download();
          for (int64_t j = 0; j < kLen; ++j) {
            switch (i % 3) {
              case 0: {
                float want = 0;
                for (int s = 0; s < n; ++s) want += Input(s, j) + i;
                ASSERT_EQ(got[j], want) << "j " << j;
                break;
              }
              case 1:
                for (int s = 0; s < n; ++s) {
                  ASSERT_EQ(got[s * kLen + j], Input(s, j) + i) << "j " << j;
                }
                break;
              case 2:
                ASSERT_EQ(got[j], Input(i % n, j) + i) << "j " << j;
                break;
            }
          }
        }
      },
      /*asynchronous=*/true);
}

// Both modes on the caller's stream, behind an async copy of their input:
// the synchronous call returns with the stream drained, the asynchronous
// one's result is there after Synchronize, which drains the stream too.
TEST(NcclCommunicatorTest, AsyncCollectivesRunOnTheCallersStream) {
  SKIP_WITHOUT_GPU(gpus);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  {
    auto comm =
        NcclCommunicator::Create({.unique_id = *id,
                                  .rank = 0,
                                  .size = 1,
                                  .device = 0,
                                  .name = "async on the caller's stream",
                                  .stream = stream,
                                  .asynchronous = true});
    ASSERT_TRUE(comm.ok()) << comm.status();
    ASSERT_TRUE((*comm)->asynchronous());
    constexpr int64_t kN = 1 << 22;
    DeviceF32 a(kN), b(kN);
    std::vector<float> want = Inputs(5, kN);
    float* pinned = nullptr;
    ASSERT_EQ(cudaMallocHost(&pinned, kN * sizeof(float)), cudaSuccess);
    std::memcpy(pinned, want.data(), kN * sizeof(float));
    ASSERT_EQ(cudaMemcpyAsync(a.tensor().raw(), pinned, kN * sizeof(float),
                              cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    Tensor in = a.tensor(), out = b.tensor();
    ASSERT_TRUE((*comm)->AllReduce(in, out, ReduceOp::kSum).ok());
    ASSERT_TRUE((*comm)->Synchronize().ok());
    EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess);
    EXPECT_EQ(b.Download(), want);
    cudaFreeHost(pinned);
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// What a CUDA graph that holds a collective needs: during capture the call
// records no event (capturing() says so, Synchronize refuses), and the
// replay, tracked after cudaGraphLaunch, gives the collective's result.
// A group of one: its all-reduce is a copy, which the graph must hold.
TEST(NcclCommunicatorTest, AsyncCollectiveCapturedInACudaGraph) {
  SKIP_WITHOUT_GPU(gpus);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  {
    auto created = NcclCommunicator::Create({.unique_id = *id,
                                             .rank = 0,
                                             .size = 1,
                                             .device = 0,
                                             .name = "graph group",
                                             .stream = stream,
                                             .asynchronous = true});
    ASSERT_TRUE(created.ok()) << created.status();
    NcclCommunicator& c = **created;
    constexpr int64_t kN = 4099;
    DeviceF32 a(kN), b(kN);
    Tensor in = a.tensor(), out = b.tensor();
    ASSERT_EQ(c.capturing().value_or(true), false);
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
              cudaSuccess);
    EXPECT_EQ(c.capturing().value_or(false), true);
    const absl::Status queued = c.AllReduce(in, out, ReduceOp::kSum);
    const absl::Status sync = c.Synchronize();
    const absl::Status tracked = c.Track("inside the capture");
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(queued.ok()) << queued;
    EXPECT_EQ(sync.code(), absl::StatusCode::kFailedPrecondition) << sync;
    EXPECT_TRUE(tracked.ok()) << tracked;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);
    for (int replay = 0; replay < 3; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      std::vector<float> want = Inputs(replay + 1, kN);
      a.Upload(want);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_TRUE(c.Track("graph replay").ok());
      ASSERT_TRUE(c.Synchronize().ok());
      EXPECT_EQ(b.Download(), want);
    }
    cudaGraphExecDestroy(exec);
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Work on the stream that never finishes within the timeout (a host
// function that blocks until the test lets it go): the watchdog aborts the
// group at the deadline, Synchronize returns DeadlineExceeded naming the
// group and the work, and the next call Unavailable. Runs on one GPU.
std::atomic<bool> host_function_released{false};
void CUDART_CB BlockUntilReleased(void*) {
  while (!host_function_released.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(NcclCommunicatorTest, AsyncWatchdogAbortsWorkPastItsDeadline) {
  SKIP_WITHOUT_GPU(gpus);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  host_function_released.store(false);
  {
    auto created =
        NcclCommunicator::Create({.unique_id = *id,
                                  .rank = 0,
                                  .size = 1,
                                  .device = 0,
                                  .name = "tp group of stage 0",
                                  .options = {.timeout = absl::Seconds(1)},
                                  .stream = stream,
                                  .asynchronous = true});
    ASSERT_TRUE(created.ok()) << created.status();
    NcclCommunicator& c = **created;
    // Released by the test (or its end), or after 15 s should the abort
    // hang on it (then `took` fails the test rather than the run hanging).
    struct Releaser {
      std::thread thread{[] {
        const absl::Time limit = absl::Now() + absl::Seconds(15);
        while (!host_function_released.load() && absl::Now() < limit) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        host_function_released.store(true);
      }};
      ~Releaser() {
        host_function_released.store(true);
        thread.join();
      }
    } releaser;
    ASSERT_EQ(cudaLaunchHostFunc(stream, BlockUntilReleased, nullptr),
              cudaSuccess);
    const absl::Time start = absl::Now();
    ASSERT_TRUE(c.Track("a stuck host function").ok());
    const absl::Status s = c.Synchronize();
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("tp group of stage 0: a stuck host function on rank "
                          "0 (device 0): not done within 1s"));
    EXPECT_GE(took, absl::Seconds(1));
    EXPECT_LT(took, absl::Seconds(11));
    DeviceF32 a(4);
    Tensor t = a.tensor();
    const absl::Status after = c.AllReduce(t, t, ReduceOp::kSum);
    EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable) << after;
    EXPECT_THAT(std::string(after.message()),
                HasSubstr("a stuck host function"));
    host_function_released.store(true);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// A peer that stops taking part (rank 1 is alive but never posts its
// send): rank 0's Recv is queued and returns, the watchdog aborts it at
// the deadline, and rank 0's next call names the peer.
TEST(NcclCommunicatorTest, AsyncPeerThatNeverArrivesIsAbortedByTheWatchdog) {
  SKIP_WITHOUT_TWO_GPUS(gpus);
  const absl::Duration timeout = absl::Seconds(3);
  std::atomic<bool> rank0_done{false};
  RunOnAllGpus(
      2, {.timeout = timeout},
      [&](NcclCommunicator& c) {
        DeviceF32 buf(1024);
        Tensor t = buf.tensor();
        // One transfer that works first: the connection exists, so the
        // second Recv is queued rather than stuck connecting.
        if (c.rank() == 1) {
          ASSERT_TRUE(c.Send(t, 0).ok());
          ASSERT_TRUE(c.Synchronize().ok());
          const absl::Time limit = absl::Now() + absl::Seconds(60);
          while (!rank0_done.load() && absl::Now() < limit) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
          return;  // Its destructor's flush is bounded by the timeout.
        }
        ASSERT_TRUE(c.Recv(t, 1).ok());
        ASSERT_TRUE(c.Synchronize().ok());
        const absl::Time start = absl::Now();
        const absl::Status queued = c.Recv(t, 1);
        const absl::Status s = queued.ok() ? c.Synchronize() : queued;
        const absl::Duration took = absl::Now() - start;
        std::printf("nccl: the stuck Recv %s\n",
                    queued.ok() ? "was queued; the watchdog ended it"
                                : "failed in its own call");
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
        EXPECT_THAT(std::string(s.message()),
                    HasSubstr("gpu group: Recv on rank 0 (device 0)"));
        EXPECT_THAT(std::string(s.message()), HasSubstr("waiting for rank 1"));
        EXPECT_GE(took, timeout);
        EXPECT_LT(took, timeout + absl::Seconds(10));
        const absl::Status next = c.Barrier();
        EXPECT_EQ(next.code(), absl::StatusCode::kUnavailable) << next;
        EXPECT_THAT(std::string(next.message()), HasSubstr("rank 1"));
        rank0_done.store(true);
      },
      /*asynchronous=*/true);
}

}  // namespace
}  // namespace shardlm
