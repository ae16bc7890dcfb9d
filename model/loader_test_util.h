// Shared helpers of the loader hostile-input tests (gguf_loader_test.cc,
// safetensors_loader_test.cc).
//
// Each loader gets a tiny valid model built in the test (so the byte layout
// is known exactly), then variants with one thing broken. Every variant
// must give a non-OK status whose message names the problem; none may
// crash (the ASan build, -DSHARDLM_ASAN=ON, checks the "never crash" part).
#ifndef SHARDLM_MODEL_LOADER_TEST_UTIL_H_
#define SHARDLM_MODEL_LOADER_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "model/weight_source.h"

namespace shardlm {
namespace {

using ::testing::HasSubstr;

// A fresh directory per test, under the test temp dir.
inline std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "shardlm_loader_test" /
      absl::StrCat(info->test_suite_name(), ".", info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

inline absl::Span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

inline void PutU32(std::string& b, size_t pos, uint32_t v) {
  ASSERT_LE(pos + 4, b.size());
  std::memcpy(b.data() + pos, &v, 4);  // The test host is little-endian.
}
inline void PutU64(std::string& b, size_t pos, uint64_t v) {
  ASSERT_LE(pos + 8, b.size());
  std::memcpy(b.data() + pos, &v, 8);
}

// A deterministic byte pattern, different per tensor.
inline std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed * 31 + i * 7);
  return s;
}

// Tiny Llama: hidden 32 (4 heads of 8, 2 KV heads), FFN 64, vocab 40.
constexpr int64_t kHidden = 32, kFfn = 64, kVocab = 40, kLayers = 2;
constexpr int64_t kHeads = 4, kKvHeads = 2, kHeadDim = 8;

}  // namespace
}  // namespace shardlm

#endif  // SHARDLM_MODEL_LOADER_TEST_UTIL_H_
