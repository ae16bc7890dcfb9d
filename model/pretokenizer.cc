#include "model/pretokenizer.h"

#include "model/unicode_tables.h"

namespace shardlm {
namespace {

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

// The text's code points, decoded where they are looked at: positions are
// byte offsets, so going back to one is free and nothing is kept (a 1 MiB
// word costs no memory here; each code point is decoded a few times, as
// the splitters look ahead by at most two).
class Cursor {
 public:
  // With `stop_at_numbers`, the splitter's text ends before the next \p{N}
  // (smollm runs the GPT-2 regex on the stretches between numbers).
  Cursor(std::string_view text, bool stop_at_numbers)
      : text_(text), stop_at_numbers_(stop_at_numbers) {}

  // Whether a code point starts at `pos` inside the splitter's text.
  bool In(size_t pos) const {
    return pos < text_.size() &&
           !(stop_at_numbers_ && Class(pos) == CharClass::kNumber);
  }
  uint32_t Cp(size_t pos) const {
    size_t p = pos;
    return NextCodePoint(text_, &p);
  }
  CharClass Class(size_t pos) const { return Classify(Cp(pos)); }
  // The offset after the code point at `pos`.
  size_t Next(size_t pos) const {
    NextCodePoint(text_, &pos);
    return pos;
  }
  bool IsNewline(size_t pos) const {
    const uint32_t cp = Cp(pos);
    return cp == '\r' || cp == '\n';
  }
  std::string_view text() const { return text_; }

 private:
  std::string_view text_;
  bool stop_at_numbers_;
};

// 's|'t|'re|'ve|'m|'ll|'d at `i`, case-insensitively when `ignore_case`;
// the offset after the match, or 0 when there is none.
size_t ContractionEnd(const Cursor& c, size_t i, bool ignore_case) {
  if (c.Cp(i) != '\'') return 0;
  const size_t i1 = c.Next(i);
  if (!c.In(i1)) return 0;
  const uint32_t c1 = FoldContractionLetter(c.Cp(i1), ignore_case);
  const size_t i2 = c.Next(i1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i2;
  if (!c.In(i2)) return 0;
  const uint32_t c2 = FoldContractionLetter(c.Cp(i2), ignore_case);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||
      (c1 == 'l' && c2 == 'l')) {
    return c.Next(i2);
  }
  return 0;
}

// One piece of the GPT-2 regex at `i` (In(i)); the offset where it ends.
// Alternatives are tried in regex order, as a backtracking engine would.
size_t Gpt2PieceEnd(const Cursor& c, size_t i) {
  // 's|'t|'re|'ve|'m|'ll|'d
  if (const size_t end = ContractionEnd(c, i, /*ignore_case=*/false)) {
    return end;
  }
  // ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+': a run of one class, with one
  // optional U+0020 in front.
  size_t j = i;
  const size_t i1 = c.Next(i);
  if (c.Cp(i) == ' ' && c.In(i1) && c.Class(i1) != CharClass::kSpace) j = i1;
  const CharClass cls = c.Class(j);
  if (cls != CharClass::kSpace) {
    size_t k = c.Next(j);
    while (c.In(k) && c.Class(k) == cls) k = c.Next(k);
    return k;
  }
  // '\s+(?!\S)|\s+': the whole whitespace run at the end of the text;
  // otherwise all of it but the last one, which may prefix the next word;
  // a single whitespace before a non-space stands alone.
  size_t last = i;  // The run's last code point.
  size_t r = i1;
  while (c.In(r) && c.Class(r) == CharClass::kSpace) {
    last = r;
    r = c.Next(r);
  }
  if (c.In(r) && last != i) return last;
  return r;
}

// \s*[\r\n]+|\s+(?!\S)|\s+ at whitespace `i`, the end of the Llama 3 and
// o200k regexes.
size_t WhitespacePieceEnd(const Cursor& c, size_t i) {
  // [i, r) is the run, `last` its last code point. \s*[\r\n]+: \s* backs
  // off from the end of the run until [\r\n]+ matches, so the piece ends
  // just after the run's last CR/LF.
  const size_t i1 = c.Next(i);
  size_t last = i;
  size_t after_newline = c.IsNewline(i) ? i1 : 0;
  size_t r = i1;
  while (c.In(r) && c.Class(r) == CharClass::kSpace) {
    last = r;
    r = c.Next(r);
    if (c.IsNewline(last)) after_newline = r;
  }
  if (after_newline != 0) return after_newline;
  // \s+(?!\S)|\s+: as in GPT-2's regex.
  if (c.In(r) && last != i) return last;
  return r;
}

// One piece of the Llama 3 regex (Qwen2's when max_digits is 1) at `i`:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Alternatives are tried in regex order; each branch below is what the
// first matching alternative takes there.
size_t Llama3PieceEnd(const Cursor& c, size_t i, size_t max_digits) {
  const CharClass cls = c.Class(i);
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (const size_t end = ContractionEnd(c, i, /*ignore_case=*/true)) {
    return end;
  }
  const size_t i1 = c.Next(i);
  // [^\r\n\p{L}\p{N}]?\p{L}+: a letter run, with one code point in front
  // that is neither a letter, a number nor CR/LF (a space, a tab,
  // punctuation...).
  size_t j = i;
  if (cls != CharClass::kLetter && cls != CharClass::kNumber &&
      !c.IsNewline(i) && c.In(i1) && c.Class(i1) == CharClass::kLetter) {
    j = i1;
  }
  if (c.Class(j) == CharClass::kLetter) {
    size_t k = c.Next(j);
    while (c.In(k) && c.Class(k) == CharClass::kLetter) k = c.Next(k);
    return k;
  }
  // \p{N}{1,3}
  if (cls == CharClass::kNumber) {
    size_t k = i1;
    for (size_t n = 1;
         n < max_digits && c.In(k) && c.Class(k) == CharClass::kNumber; ++n) {
      k = c.Next(k);
    }
    return k;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*': a run of other code points, with one
  // optional U+0020 in front and the CR/LF run after it.
  j = i;
  if (c.Cp(i) == ' ' && c.In(i1) && c.Class(i1) == CharClass::kOther) j = i1;
  if (c.Class(j) == CharClass::kOther) {
    size_t k = c.Next(j);
    while (c.In(k) && c.Class(k) == CharClass::kOther) k = c.Next(k);
    while (c.In(k) && c.IsNewline(k)) k = c.Next(k);
    return k;
  }
  return WhitespacePieceEnd(c, i);
}

// The o200k regex's two letter sets are Upper, [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}],
// and Lower, [\p{Ll}\p{Lm}\p{Lo}\p{M}]: caseless letters and marks are in
// both.
LetterCase CaseOf(uint32_t cp) {
  if (cp < 0x80) {
    if (cp >= 'A' && cp <= 'Z') return LetterCase::kUpper;
    if (cp >= 'a' && cp <= 'z') return LetterCase::kLower;
    return LetterCase::kNone;
  }
  return LetterCaseOf(cp);
}
bool InUpperSet(const Cursor& c, size_t pos) {
  if (!c.In(pos)) return false;
  const LetterCase k = CaseOf(c.Cp(pos));
  return k != LetterCase::kNone && k != LetterCase::kLower;
}
bool InLowerSet(const Cursor& c, size_t pos) {
  if (!c.In(pos)) return false;
  const LetterCase k = CaseOf(c.Cp(pos));
  return k != LetterCase::kNone && k != LetterCase::kUpper;
}

// `end` extended by (?i:'s|'t|'re|'ve|'m|'ll|'d)? (greedy: taken when it
// matches).
size_t WithContraction(const Cursor& c, size_t end) {
  if (!c.In(end)) return end;
  const size_t after = ContractionEnd(c, end, /*ignore_case=*/true);
  return after != 0 ? after : end;
}

// The o200k regex's first word alternative at `s`, Upper*Lower+ and the
// contraction; 0 when it does not match. Upper* is greedy and backs off one
// code point at a time until Lower+ matches: after the longest Upper run
// comes a lower-case letter (Lower+ runs on from there), or Lower+ is the
// run's last code point that is also in Lower (a caseless letter or a mark)
// and stops there, since what follows it in the run is upper case.
size_t O200kUpperLowerEnd(const Cursor& c, size_t s) {
  size_t a = s;
  size_t after_last_lower = 0;
  while (InUpperSet(c, a)) {
    const size_t next = c.Next(a);
    if (InLowerSet(c, a)) after_last_lower = next;
    a = next;
  }
  size_t end = after_last_lower;
  if (InLowerSet(c, a)) {
    end = c.Next(a);
    while (InLowerSet(c, end)) end = c.Next(end);
  }
  return end == 0 ? 0 : WithContraction(c, end);
}

// The second word alternative at `s`, Upper+Lower* and the contraction; 0
// when it does not match.
size_t O200kUpperEnd(const Cursor& c, size_t s) {
  if (!InUpperSet(c, s)) return 0;
  size_t end = c.Next(s);
  while (InUpperSet(c, end)) end = c.Next(end);
  while (InLowerSet(c, end)) end = c.Next(end);
  return WithContraction(c, end);
}

// One piece of the o200k regex (PreTokenizerKind::kGpt4o) at `i`.
// Alternatives are tried in regex order, and within the word alternatives
// the optional prefix is tried taken, then not: a mark is both a possible
// prefix and a letter of the word.
size_t Gpt4oPieceEnd(const Cursor& c, size_t i) {
  const CharClass cls = c.Class(i);
  const size_t i1 = c.Next(i);
  // [^\r\n\p{L}\p{N}]? in front of either word alternative.
  const bool prefix = cls != CharClass::kLetter && cls != CharClass::kNumber &&
                      !c.IsNewline(i) && c.In(i1);
  if (prefix) {
    if (const size_t end = O200kUpperLowerEnd(c, i1)) return end;
  }
  if (const size_t end = O200kUpperLowerEnd(c, i)) return end;
  if (prefix) {
    if (const size_t end = O200kUpperEnd(c, i1)) return end;
  }
  if (const size_t end = O200kUpperEnd(c, i)) return end;
  // \p{N}{1,3}
  if (cls == CharClass::kNumber) {
    size_t k = i1;
    for (int n = 1; n < 3 && c.In(k) && c.Class(k) == CharClass::kNumber; ++n) {
      k = c.Next(k);
    }
    return k;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n/]*': as Llama 3's, with '/' among what
  // may follow the run.
  size_t j = i;
  if (c.Cp(i) == ' ' && c.In(i1) && c.Class(i1) == CharClass::kOther) j = i1;
  if (c.Class(j) == CharClass::kOther) {
    size_t k = c.Next(j);
    while (c.In(k) && c.Class(k) == CharClass::kOther) k = c.Next(k);
    while (c.In(k) && (c.IsNewline(k) || c.Cp(k) == '/')) k = c.Next(k);
    return k;
  }
  // \s*[\r\n]+|\s+(?!\S)|\s+: as Llama 3's.
  return WhitespacePieceEnd(c, i);
}

}  // namespace

const char* PreTokenizerName(PreTokenizerKind kind) {
  switch (kind) {
    case PreTokenizerKind::kGpt2:
      return "gpt2";
    case PreTokenizerKind::kSmollm:
      return "smollm";
    case PreTokenizerKind::kLlama3:
      return "llama3";
    case PreTokenizerKind::kQwen2:
      return "qwen2";
    case PreTokenizerKind::kGpt4o:
      return "gpt-4o";
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

void ForEachPiece(std::string_view text, PreTokenizerKind kind,
                  const std::function<void(std::string_view)>& piece) {
  const bool smollm = kind == PreTokenizerKind::kSmollm;
  const Cursor cursor(text, /*stop_at_numbers=*/smollm);
  size_t i = 0;
  while (i < text.size()) {
    size_t end;
    switch (kind) {
      case PreTokenizerKind::kLlama3:
        end = Llama3PieceEnd(cursor, i, /*max_digits=*/3);
        break;
      case PreTokenizerKind::kQwen2:
        end = Llama3PieceEnd(cursor, i, /*max_digits=*/1);
        break;
      case PreTokenizerKind::kGpt4o:
        end = Gpt4oPieceEnd(cursor, i);
        break;
      case PreTokenizerKind::kSmollm:
        // Each number code point is a piece of its own; the GPT-2 regex
        // runs on the stretches between them.
        end = cursor.Class(i) == CharClass::kNumber ? cursor.Next(i)
                                                    : Gpt2PieceEnd(cursor, i);
        break;
      case PreTokenizerKind::kGpt2:
      default:
        end = Gpt2PieceEnd(cursor, i);
        break;
    }
    piece(text.substr(i, end - i));
    i = end;
  }
}

void PreTokenize(std::string_view text, PreTokenizerKind kind,
                 std::vector<std::string_view>* pieces) {
  ForEachPiece(text, kind,
               [pieces](std::string_view p) { pieces->push_back(p); });
}

}  // namespace shardlm
