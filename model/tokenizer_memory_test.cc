// What tokenizing costs in memory (issue 39): a 1 MiB single word used to
// cost ~58 MiB while it was tokenized (16 bytes per byte of decoded code
// points, then the BPE merge state of the whole word). Every allocation of
// this binary is counted (operator new and delete are replaced, the
// nothrow and aligned forms too), and the peak during Encode must stay a
// few times the input.
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <string>

#include "gtest/gtest.h"
#include "model/bpe_tokenizer.h"

namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void* Counted(void* p) {
  if (p == nullptr) return p;
  const int64_t now =
      g_live.fetch_add(static_cast<int64_t>(malloc_usable_size(p))) +
      static_cast<int64_t>(malloc_usable_size(p));
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void Uncount(void* p) {
  if (p == nullptr) return;
  g_live.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)));
  std::free(p);
}

void* Allocate(size_t n) {
  void* p = Counted(std::malloc(n == 0 ? 1 : n));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* AllocateAligned(size_t n, std::align_val_t a) {
  const size_t align = static_cast<size_t>(a);
  void* p = Counted(std::aligned_alloc(
      align, std::max(align, (n + align - 1) / align * align)));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(size_t n) { return Allocate(n); }
void* operator new[](size_t n) { return Allocate(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  return Counted(std::malloc(n == 0 ? 1 : n));
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  return Counted(std::malloc(n == 0 ? 1 : n));
}
void* operator new(size_t n, std::align_val_t a) {
  return AllocateAligned(n, a);
}
void* operator new[](size_t n, std::align_val_t a) {
  return AllocateAligned(n, a);
}
void* operator new(size_t n, std::align_val_t a,
                   const std::nothrow_t&) noexcept {
  try {
    return AllocateAligned(n, a);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t n, std::align_val_t a,
                     const std::nothrow_t&) noexcept {
  try {
    return AllocateAligned(n, a);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { Uncount(p); }
void operator delete[](void* p) noexcept { Uncount(p); }
void operator delete(void* p, size_t) noexcept { Uncount(p); }
void operator delete[](void* p, size_t) noexcept { Uncount(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { Uncount(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { Uncount(p); }
void operator delete(void* p, std::align_val_t) noexcept { Uncount(p); }
void operator delete[](void* p, std::align_val_t) noexcept { Uncount(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { Uncount(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  Uncount(p);
}
void operator delete(void* p, std::align_val_t,
                     const std::nothrow_t&) noexcept {
  Uncount(p);
}
void operator delete[](void* p, std::align_val_t,
                       const std::nothrow_t&) noexcept {
  Uncount(p);
}

namespace shardlm {
namespace {

// Byte tokens for a, b, c and the space, and merges that build runs of
// "a" up to 1024 long and "abc" words: a 1 MiB "aaaa..." merges all the way
// up (the heap's worst case), "abcabc..." once.
std::unique_ptr<BpeTokenizer> Tokenizer() {
  BpeConfig config;
  config.tokens = {"a", "b", "c", "\xC4\xA0", "ab", "abc"};
  config.merges = {{"a", "b"}, {"ab", "c"}};
  std::string run = "a";
  for (int i = 0; i < 10; ++i) {
    config.tokens.push_back(run + run);
    config.merges.push_back({run, run});
    run += run;
  }
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> tok =
      BpeTokenizer::Create(std::move(config));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

struct Cost {
  int64_t peak_bytes;  // Above what was live before Encode.
  double seconds;
  size_t tokens;
};

Cost Encode(const BpeTokenizer& tok, const std::string& text) {
  const int64_t before = g_live.load();
  g_peak.store(before);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok.Encode(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return {g_peak.load() - before, seconds, ids.size()};
}

// A few times the input: the token ids are up to 4 bytes per byte of text
// (one token per byte), and up to twice that while their vector grows; the
// merge state of one 16 KiB cut is under 1 MiB. InferenceService charges
// the memory budget 10 bytes per byte of text for tokenizing.
constexpr int64_t kBytesPerInputByte = 8;
constexpr int64_t kCutScratchBytes = 1 << 20;

TEST(TokenizerMemoryTest, AOneMebibyteWordCostsAFewTimesItsSize) {
  const std::unique_ptr<BpeTokenizer> tok = Tokenizer();
  // "a": 1024 tokens; "abc": one per 3 bytes; "ba": one per byte, the most
  // ids there can be.
  for (const std::string& unit :
       {std::string("a"), std::string("abc"), std::string("ba")}) {
    std::string word;
    while (word.size() < (1 << 20)) word += unit;
    const Cost cost = Encode(*tok, word);
    std::printf("1 MiB word of \"%s\": peak %.2f MiB, %zu tokens, %.3f s\n",
                unit.c_str(), cost.peak_bytes / 1048576.0, cost.tokens,
                cost.seconds);
    EXPECT_LE(cost.peak_bytes,
              kBytesPerInputByte * static_cast<int64_t>(word.size()) +
                  kCutScratchBytes)
        << unit;
    EXPECT_GT(cost.tokens, 0u);
  }
}

TEST(TokenizerMemoryTest, ManyShortWordsCostAFewTimesTheirSize) {
  const std::unique_ptr<BpeTokenizer> tok = Tokenizer();
  std::string text;
  while (text.size() < (1 << 20)) text += "abc a ";
  const Cost cost = Encode(*tok, text);
  std::printf("1 MiB of short words: peak %.2f MiB, %zu tokens\n",
              cost.peak_bytes / 1048576.0, cost.tokens);
  EXPECT_LE(cost.peak_bytes,
            kBytesPerInputByte * static_cast<int64_t>(text.size()) +
                kCutScratchBytes);
}

// Time linear in the word's length: 4 times the bytes may take at most 8
// times as long (a quadratic merge would take 16), best of three each.
TEST(TokenizerMemoryTest, ALongWordTakesLinearTime) {
  const std::unique_ptr<BpeTokenizer> tok = Tokenizer();
  const auto best = [&](size_t n) {
    const std::string word(n, 'a');
    double s = 1e9;
    for (int i = 0; i < 3; ++i) s = std::min(s, Encode(*tok, word).seconds);
    return s;
  };
  const double small = best(256 << 10), large = best(1 << 20);
  std::printf("256 KiB: %.4f s, 1 MiB: %.4f s\n", small, large);
  EXPECT_LT(large, 8 * small + 0.01);
}

// Pieces up to the cut are merged whole: a 16 KiB run of "a" is sixteen
// 1024-a tokens, exactly as without cuts; a longer one is cut at 16 KiB.
TEST(TokenizerMemoryTest, PiecesUpToTheBoundAreMergedWhole) {
  const std::unique_ptr<BpeTokenizer> tok = Tokenizer();
  const std::vector<int32_t> whole =
      tok->Encode(std::string(BpeTokenizer::kMaxMergedPieceBytes, 'a'));
  EXPECT_EQ(whole.size(), BpeTokenizer::kMaxMergedPieceBytes / 1024);
  const std::vector<int32_t> longer =
      tok->Encode(std::string(BpeTokenizer::kMaxMergedPieceBytes + 1, 'a'));
  EXPECT_EQ(longer.size(), whole.size() + 1);
}

}  // namespace
}  // namespace shardlm
