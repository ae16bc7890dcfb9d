#include "model/pretokenizer.h"

#include "model/unicode_tables.h"

namespace shardlm {
namespace {

struct CodePoint {
  size_t offset;  // Byte offset in the text.
  CharClass cls;
  bool is_space_char;  // U+0020 itself, the optional prefix " ?" of the regex.
};

CharClass Classify(uint32_t cp) {
  if (cp < 0x80) {
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CharClass::kSpace;
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    return CharClass::kOther;
  }
  return ClassifyCodePoint(cp);
}

bool IsContractionAt(const std::vector<CodePoint>& cps, std::string_view text,
                     size_t i, size_t end, size_t* len) {
  if (text[cps[i].offset] != '\'' || i + 1 >= end) return false;
  const char c1 = text[cps[i + 1].offset];
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
    *len = 2;
    return true;
  }
  if (i + 2 >= end) return false;
  const char c2 = text[cps[i + 2].offset];
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||
      (c1 == 'l' && c2 == 'l')) {
    *len = 3;
    return true;
  }
  return false;
}

// The GPT-2 regex over code points [begin, end) of `cps`. Alternatives are
// tried in regex order at each position, as a backtracking engine would.
void SplitGpt2(const std::vector<CodePoint>& cps, std::string_view text,
               size_t begin, size_t end,
               std::vector<std::string_view>* pieces) {
  auto emit = [&](size_t from, size_t to) {
    const size_t b = cps[from].offset;
    const size_t e = to < cps.size() ? cps[to].offset : text.size();
    pieces->push_back(text.substr(b, e - b));
  };
  size_t i = begin;
  while (i < end) {
    size_t len = 0;
    // 's|'t|'re|'ve|'m|'ll|'d
    if (IsContractionAt(cps, text, i, end, &len)) {
      emit(i, i + len);
      i += len;
      continue;
    }
    // ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+': a run of one class, with one
    // optional U+0020 in front.
    size_t j = i;
    if (cps[i].is_space_char && i + 1 < end &&
        cps[i + 1].cls != CharClass::kSpace) {
      j = i + 1;
    }
    if (cps[j].cls != CharClass::kSpace) {
      const CharClass cls = cps[j].cls;
      size_t k = j + 1;
      while (k < end && cps[k].cls == cls) ++k;
      emit(i, k);
      i = k;
      continue;
    }
    // '\s+(?!\S)|\s+': the whole whitespace run at the end of the text;
    // otherwise all of it but the last one, which may prefix the next word;
    // a single whitespace before a non-space stands alone.
    size_t r = i + 1;
    while (r < end && cps[r].cls == CharClass::kSpace) ++r;
    size_t stop = r;
    if (r < end && r - i >= 2) stop = r - 1;
    emit(i, stop);
    i = stop;
  }
}

}  // namespace

const char* PreTokenizerName(PreTokenizerKind kind) {
  switch (kind) {
    case PreTokenizerKind::kGpt2:
      return "gpt2";
    case PreTokenizerKind::kSmollm:
      return "smollm";
  }
  return "?";
}

uint32_t NextCodePoint(std::string_view text, size_t* pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  const size_t i = *pos;
  const unsigned char b0 = s[i];
  if (b0 < 0x80) {
    *pos = i + 1;
    return b0;
  }
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // Allowed range of the second byte.
  uint32_t cp = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  }
  bool ok = len != 0 && i + len <= n;
  for (size_t k = 1; ok && k < len; ++k) {
    const unsigned char b = s[i + k];
    const unsigned char min = k == 1 ? lo : 0x80;
    const unsigned char max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) ok = false;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (!ok) {
    *pos = i + 1;
    return kInvalidCodePointBase + b0;
  }
  *pos = i + len;
  return cp;
}

void PreTokenize(std::string_view text, PreTokenizerKind kind,
                 std::vector<std::string_view>* pieces) {
  std::vector<CodePoint> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t offset = pos;
    const uint32_t cp = NextCodePoint(text, &pos);
    cps.push_back({offset, Classify(cp), cp == ' '});
  }
  if (kind == PreTokenizerKind::kGpt2) {
    SplitGpt2(cps, text, 0, cps.size(), pieces);
    return;
  }
  // smollm: each number code point is a piece of its own; the regex runs
  // on the stretches between them.
  size_t begin = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (cps[i].cls != CharClass::kNumber) continue;
    SplitGpt2(cps, text, begin, i, pieces);
    SplitGpt2(cps, text, i, i + 1, pieces);
    begin = i + 1;
  }
  SplitGpt2(cps, text, begin, cps.size(), pieces);
}

}  // namespace shardlm
