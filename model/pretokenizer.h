// Pre-tokenizers for byte-level BPE: split text into the pieces that BPE
// merges never cross. Hand-written equivalents of the Hugging Face
// pre-tokenizers, over decoded code points (no regex library).
#ifndef SHARDLM_MODEL_PRETOKENIZER_H_
#define SHARDLM_MODEL_PRETOKENIZER_H_

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace shardlm {

enum class PreTokenizerKind {
  // GPT-2 regex (HF ByteLevel(add_prefix_space=false, use_regex=true)):
  //   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
  //   \s+(?!\S)|\s+
  kGpt2,
  // llama.cpp "smollm": every \p{N} code point split off on its own
  // (HF Digits(individual_digits=true)), then the GPT-2 regex on the rest.
  kSmollm,
  // Llama 3 (llama.cpp "llama-bpe"; HF Split(Regex, Isolated) then
  // ByteLevel(use_regex=false)):
  //   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  //    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // Qwen2 / Qwen2.5 (llama.cpp "qwen2"): the Llama 3 regex with \p{N}
  // (single numbers) in place of \p{N}{1,3}.
  kQwen2,
  // o200k (tiktoken's o200k_base and o200k_harmony: GPT-4o, gpt-oss;
  // llama.cpp "gpt-4o"): words split where lower case turns to upper, with
  // the contraction kept on the word, and '/' after punctuation:
  //   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*
  //     [\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
  //   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+
  //     [\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
  //   \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kGpt4o,
};

inline constexpr uint32_t kInvalidCodePointBase = 0x110000;

const char* PreTokenizerName(PreTokenizerKind kind);

// Decodes one UTF-8 code point starting at text[*pos] and advances *pos.
// A byte that does not start a well-formed sequence decodes as
// kInvalidCodePointBase + byte (above U+10FFFF, so it classifies as kOther)
// and advances by one byte.
// Requires *pos < text.size().
uint32_t NextCodePoint(std::string_view text, size_t* pos);

// Calls `piece` with each piece of `text` in order: views into `text` that
// concatenate back to it. Code points are decoded as they are looked at,
// so this costs no memory beyond the callback's (issue 39: a 1 MiB word
// must not cost tens of bytes per byte). Thread-safe.
void ForEachPiece(std::string_view text, PreTokenizerKind kind,
                  const std::function<void(std::string_view)>& piece);

// Appends the pieces of `text` to *pieces (ForEachPiece). Thread-safe.
void PreTokenize(std::string_view text, PreTokenizerKind kind,
                 std::vector<std::string_view>* pieces);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_PRETOKENIZER_H_
