// The streaming pre-tokenizer (model/pretokenizer.cc, which decodes code
// points as it looks at them) against the one it replaced (kept here
// verbatim as the reference: it decoded the whole text into a vector of
// code points first), on random texts built from the characters every
// branch of the regexes turns on.
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "model/pretokenizer.h"
#include "model/unicode_tables.h"

namespace shardlm {
namespace {

struct CodePoint {
  size_t offset;  // Byte offset in the text.
  uint32_t cp;    // kInvalidCodePointBase + byte for an invalid byte.
  CharClass cls;
};

bool IsNewline(const CodePoint& c) { return c.cp == '\r' || c.cp == '\n'; }

CharClass Classify(uint32_t cp) {
  if (cp < 0x80) {
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CharClass::kSpace;
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    return CharClass::kOther;
  }
  return ClassifyCodePoint(cp);
}

// ASCII `cp` as it is, or when `ignore_case` folded to lower case as the
// regex engine's (?i:) folds the contractions' letters: A-Z, and U+017F
// LATIN SMALL LETTER LONG S to 's' (Hugging Face's Oniguruma matches "'ſ";
// llama.cpp's adapted "'[sS]" does not). 0 for other non-ASCII.
uint32_t FoldContractionLetter(uint32_t cp, bool ignore_case) {
  if (cp >= 0x80) return ignore_case && cp == 0x17F ? 's' : 0;
  return ignore_case && cp >= 'A' && cp <= 'Z' ? (cp | 0x20) : cp;
}

// 's|'t|'re|'ve|'m|'ll|'d at cps[i], case-insensitively when `ignore_case`;
// *len is the match length in code points.
bool IsContractionAt(const std::vector<CodePoint>& cps, size_t i, size_t end,
                     bool ignore_case, size_t* len) {
  if (cps[i].cp != '\'' || i + 1 >= end) return false;
  const uint32_t c1 = FoldContractionLetter(cps[i + 1].cp, ignore_case);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
    *len = 2;
    return true;
  }
  if (i + 2 >= end) return false;
  const uint32_t c2 = FoldContractionLetter(cps[i + 2].cp, ignore_case);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||
      (c1 == 'l' && c2 == 'l')) {
    *len = 3;
    return true;
  }
  return false;
}

// Appends text[cps[from].offset, cps[to].offset) to *pieces.
void Emit(const std::vector<CodePoint>& cps, std::string_view text, size_t from,
          size_t to, std::vector<std::string_view>* pieces) {
  const size_t b = cps[from].offset;
  const size_t e = to < cps.size() ? cps[to].offset : text.size();
  pieces->push_back(text.substr(b, e - b));
}

// The GPT-2 regex over code points [begin, end) of `cps`. Alternatives are
// tried in regex order at each position, as a backtracking engine would.
void SplitGpt2(const std::vector<CodePoint>& cps, std::string_view text,
               size_t begin, size_t end,
               std::vector<std::string_view>* pieces) {
  auto emit = [&](size_t from, size_t to) {
    Emit(cps, text, from, to, pieces);
  };
  size_t i = begin;
  while (i < end) {
    size_t len = 0;
    // 's|'t|'re|'ve|'m|'ll|'d
    if (IsContractionAt(cps, i, end, /*ignore_case=*/false, &len)) {
      emit(i, i + len);
      i += len;
      continue;
    }
    // ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+': a run of one class, with one
    // optional U+0020 in front.
    size_t j = i;
    if (cps[i].cp == ' ' && i + 1 < end &&
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

// The Llama 3 regex (Qwen2's when max_digits is 1) over all of `cps`:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Alternatives are tried in regex order at each position; each branch
// below is what the first matching alternative takes there.
void SplitLlama3(const std::vector<CodePoint>& cps, std::string_view text,
                 size_t max_digits, std::vector<std::string_view>* pieces) {
  const size_t end = cps.size();
  size_t i = 0;
  while (i < end) {
    const CharClass cls = cps[i].cls;
    size_t len = 0;
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (IsContractionAt(cps, i, end, /*ignore_case=*/true, &len)) {
      Emit(cps, text, i, i + len, pieces);
      i += len;
      continue;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+: a letter run, with one code point in front
    // that is neither a letter, a number nor CR/LF (a space, a tab,
    // punctuation...).
    size_t j = i;
    if (cls != CharClass::kLetter && cls != CharClass::kNumber &&
        !IsNewline(cps[i]) && i + 1 < end &&
        cps[i + 1].cls == CharClass::kLetter) {
      j = i + 1;
    }
    if (cps[j].cls == CharClass::kLetter) {
      size_t k = j + 1;
      while (k < end && cps[k].cls == CharClass::kLetter) ++k;
      Emit(cps, text, i, k, pieces);
      i = k;
      continue;
    }
    // \p{N}{1,3}
    if (cls == CharClass::kNumber) {
      size_t k = i + 1;
      while (k < end && k - i < max_digits &&
             cps[k].cls == CharClass::kNumber) {
        ++k;
      }
      Emit(cps, text, i, k, pieces);
      i = k;
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*': a run of other code points, with one
    // optional U+0020 in front and the CR/LF run after it.
    j = i;
    if (cps[i].cp == ' ' && i + 1 < end &&
        cps[i + 1].cls == CharClass::kOther) {
      j = i + 1;
    }
    if (cps[j].cls == CharClass::kOther) {
      size_t k = j + 1;
      while (k < end && cps[k].cls == CharClass::kOther) ++k;
      while (k < end && IsNewline(cps[k])) ++k;
      Emit(cps, text, i, k, pieces);
      i = k;
      continue;
    }
    // cps[i] is whitespace; [i, r) is its run.
    size_t r = i + 1;
    while (r < end && cps[r].cls == CharClass::kSpace) ++r;
    // \s*[\r\n]+: \s* backs off from the end of the run until [\r\n]+
    // matches, so the piece ends just after the run's last CR/LF.
    size_t last_newline = r;
    for (size_t k = r; k > i; --k) {
      if (IsNewline(cps[k - 1])) {
        last_newline = k - 1;
        break;
      }
    }
    if (last_newline < r) {
      Emit(cps, text, i, last_newline + 1, pieces);
      i = last_newline + 1;
      continue;
    }
    // \s+(?!\S)|\s+: as in GPT-2's regex.
    size_t stop = r;
    if (r < end && r - i >= 2) stop = r - 1;
    Emit(cps, text, i, stop, pieces);
    i = stop;
  }
}

void OldPreTokenize(std::string_view text, PreTokenizerKind kind,
                    std::vector<std::string_view>* pieces) {
  std::vector<CodePoint> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t offset = pos;
    const uint32_t cp = NextCodePoint(text, &pos);
    cps.push_back({offset, cp, Classify(cp)});
  }
  switch (kind) {
    case PreTokenizerKind::kGpt2:
      SplitGpt2(cps, text, 0, cps.size(), pieces);
      return;
    case PreTokenizerKind::kLlama3:
      SplitLlama3(cps, text, /*max_digits=*/3, pieces);
      return;
    case PreTokenizerKind::kQwen2:
      SplitLlama3(cps, text, /*max_digits=*/1, pieces);
      return;
    case PreTokenizerKind::kGpt4o:  // Written streaming from the start.
      ADD_FAILURE() << "no whole-text implementation of gpt-4o";
      return;
    case PreTokenizerKind::kSmollm:
      break;
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

TEST(PreTokenizerStreamTest, SamePiecesAsTheWholeTextImplementation) {
  // Letters, numbers, spaces, CR/LF, tabs, apostrophes with contraction
  // letters (and U+017F), punctuation, multi-byte letters and numbers,
  // and invalid bytes.
  const std::vector<std::string> atoms = {"a",
                                          "Z",
                                          "s",
                                          "t",
                                          "r",
                                          "e",
                                          "v",
                                          "l",
                                          "m",
                                          "d",
                                          "S",
                                          "L",
                                          "E",
                                          "1",
                                          "9",
                                          " ",
                                          " ",
                                          " ",
                                          "  ",
                                          "\t",
                                          "\n",
                                          "\r",
                                          "\r\n",
                                          "'",
                                          "'",
                                          "!",
                                          ".",
                                          "?",
                                          "-",
                                          "\xC3\xA9",
                                          "\xC5\xBF",
                                          "\xC2\xB2",
                                          "\xE2\x80\x83",
                                          "\xE4\xB8\xAD",
                                          "\xF0\x9F\x98\x80",
                                          "\xFF",
                                          "\xC3",
                                          "\xE2\x82"};
  std::mt19937 rng(39);
  for (const PreTokenizerKind kind :
       {PreTokenizerKind::kGpt2, PreTokenizerKind::kSmollm,
        PreTokenizerKind::kLlama3, PreTokenizerKind::kQwen2}) {
    for (int n = 0; n < 4000; ++n) {
      std::string text;
      const int len = static_cast<int>(rng() % 24);
      for (int i = 0; i < len; ++i) text += atoms[rng() % atoms.size()];
      std::vector<std::string_view> want, got;
      OldPreTokenize(text, kind, &want);
      PreTokenize(text, kind, &got);
      ASSERT_EQ(got, want) << PreTokenizerName(kind) << " on \"" << text
                           << "\"";
    }
  }
}

}  // namespace
}  // namespace shardlm
