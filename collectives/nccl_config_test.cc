// NcclCommunicator's configuration checks, which fail before any CUDA or
// NCCL call: a unit binary that runs (and never skips) on every machine
// that builds NCCL, GPU or not. The collectives themselves are
// nccl_communicator_test.cc (GPU only).
#include <string>

#include "collectives/nccl_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

using ::testing::HasSubstr;

TEST(NcclConfigTest, BadConfigIsInvalidArgumentWithoutAGpu) {
  auto comm = NcclCommunicator::Create(
      {.unique_id = "short", .rank = 0, .size = 1, .name = "g"});
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(comm.status().message()),
              HasSubstr("g: NCCL unique id has 5 bytes"));
  comm = NcclCommunicator::Create(
      {.unique_id = std::string(128, '\0'), .rank = 2, .size = 2, .name = "g"});
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(comm.status().message()),
              HasSubstr("g: rank 2 of a group of 2"));
}

}  // namespace
}  // namespace shardlm
