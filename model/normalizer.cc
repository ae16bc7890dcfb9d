#include "model/normalizer.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/pretokenizer.h"
#include "model/unicode_tables.h"

namespace shardlm {
namespace {

// Hangul syllables (Unicode 3.12, "Conjoining Jamo Behavior").
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161,
                   kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

struct Mark {
  uint32_t cp;  // kInvalidCodePointBase + byte for an invalid byte.
  uint8_t ccc;
};

void Decompose(uint32_t cp, std::vector<Mark>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back({kLBase + s / kNCount, 0});
    out->push_back({kVBase + (s % kNCount) / kTCount, 0});
    if (s % kTCount != 0) out->push_back({kTBase + s % kTCount, 0});
    return;
  }
  uint32_t first = 0, second = 0;
  if (cp < kInvalidCodePointBase &&
      CanonicalDecomposition(cp, &first, &second)) {
    Decompose(first, out);
    if (second != 0) Decompose(second, out);
    return;
  }
  out->push_back({cp, cp < kInvalidCodePointBase ? CombiningClass(cp)
                                                 : static_cast<uint8_t>(0)});
}

uint32_t Compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase &&
      b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 &&
      b > kTBase && b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  if (a >= kInvalidCodePointBase || b >= kInvalidCodePointBase) return 0;
  return ComposePair(a, b);
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp >= kInvalidCodePointBase) {
    out->push_back(static_cast<char>(cp - kInvalidCodePointBase));
  } else if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

std::string NormalizeNfc(std::string_view text) {
  // ASCII is its own NFC, and the common case.
  if (std::all_of(text.begin(), text.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x80;
      })) {
    return std::string(text);
  }
  std::vector<Mark> marks;
  marks.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    Decompose(NextCodePoint(text, &pos), &marks);
  }
  // Canonical ordering: each run of non-starters sorted by class, stably.
  for (size_t i = 0; i < marks.size();) {
    if (marks[i].ccc == 0) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < marks.size() && marks[j].ccc != 0) ++j;
    std::stable_sort(
        marks.begin() + i, marks.begin() + j,
        [](const Mark& x, const Mark& y) { return x.ccc < y.ccc; });
    i = j;
  }
  // Canonical composition: a mark joins the last starter unless blocked:
  // something in between (canonically ordered, so out.back() has the
  // highest class there) has the same or a higher class, or is a starter.
  std::vector<Mark> out;
  out.reserve(marks.size());
  size_t starter = SIZE_MAX;  // Index in `out` of the last starter.
  for (const Mark& m : marks) {
    // out.back() has class 0 only when it is the starter itself.
    if (starter != SIZE_MAX &&
        (out.back().ccc == 0 || out.back().ccc < m.ccc)) {
      if (const uint32_t c = Compose(out[starter].cp, m.cp); c != 0) {
        out[starter].cp = c;
        continue;
      }
    }
    if (m.ccc == 0) starter = out.size();
    out.push_back(m);
  }
  std::string result;
  result.reserve(text.size());
  for (const Mark& m : out) AppendUtf8(m.cp, &result);
  return result;
}

}  // namespace shardlm
