// For tests: the path of the real SmolLM2-135M-Instruct GGUF that the
// model tests run on. ctest passes it as SHARDLM_TEST_MODEL (CMake's
// SHARDLM_MODEL); run by hand, the default is models/ of this checkout.
// A missing model is a failure with the command that fetches it, never a
// skip: the tests that need it would otherwise stop testing anything.
#ifndef SHARDLM_MODEL_SMOLLM2_TEST_MODEL_H_
#define SHARDLM_MODEL_SMOLLM2_TEST_MODEL_H_

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace shardlm::testing_util {

// The model's path, or "" after recording a failure. Use as
//   const std::string path = SmolLm2ModelPath();
//   ASSERT_FALSE(path.empty());
inline std::string SmolLm2ModelPath() {
  const char* env = std::getenv("SHARDLM_TEST_MODEL");
  const std::filesystem::path path =
      env != nullptr && *env != '\0'
          ? std::filesystem::path(env)
          : std::filesystem::path(__FILE__).parent_path().parent_path() /
                "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "the SmolLM2 GGUF is missing at " << path
                  << ": run `bash scripts/fetch-model.sh` (or set "
                     "SHARDLM_TEST_MODEL to its path)";
    return "";
  }
  return path.string();
}

}  // namespace shardlm::testing_util

#endif  // SHARDLM_MODEL_SMOLLM2_TEST_MODEL_H_
