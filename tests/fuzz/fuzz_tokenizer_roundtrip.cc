// SmolLM2's tokenizer (the GGUF at $SHARDLM_MODEL, else the repository's
// models/ copy) on arbitrary bytes: Encode gives ids in range; for valid
// UTF-8 input Decode(Encode(x)) == x but for the bytes the vocabulary
// lacks; and the streaming detokenizer, fed the ids
// and also the input's bytes taken as ids, only ever emits valid UTF-8.
// The same vocabulary with each other pre-tokenizer (gpt2, llama3, qwen2
// with NFC) must round-trip too (qwen2 to the NFC form, which must be
// valid UTF-8 and stable), and every pre-tokenizer's pieces must be
// non-empty and cover the input.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "model/bpe_tokenizer.h"
#include "model/gguf.h"
#include "model/normalizer.h"
#include "model/pretokenizer.h"
#include "model/tokenizer.h"
#include "model/tokenizer_loaders.h"

namespace {

using shardlm::PreTokenizerKind;

constexpr PreTokenizerKind kKinds[] = {
    PreTokenizerKind::kSmollm, PreTokenizerKind::kGpt2,
    PreTokenizerKind::kLlama3, PreTokenizerKind::kQwen2,
    PreTokenizerKind::kGpt4o};

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_tokenizer_roundtrip: %s (set SHARDLM_MODEL)\n",
               what.c_str());
  std::abort();
}

// SmolLM2's vocabulary with each of kKinds (qwen2 with NFC, as loaded).
const std::vector<const shardlm::Tokenizer*>& Tokenizers() {
  static const auto* tokenizers = [] {
    const char* env = std::getenv("SHARDLM_MODEL");
    const std::string path =
        env != nullptr ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    auto gguf = shardlm::GgufFile::Open(path);
    if (!gguf.ok()) Fail(gguf.status().ToString());
    auto config = shardlm::BpeConfigFromGguf(**gguf);
    if (!config.ok()) Fail(config.status().ToString());
    auto* list = new std::vector<const shardlm::Tokenizer*>;
    for (PreTokenizerKind kind : kKinds) {
      shardlm::BpeConfig c = *config;
      c.pre = kind;
      c.nfc = kind == PreTokenizerKind::kQwen2;
      auto t = shardlm::BpeTokenizer::Create(std::move(c));
      if (!t.ok()) Fail(t.status().ToString());
      list->push_back(t->release());
    }
    return list;
  }();
  return *tokenizers;
}

// Whether `s` is well-formed UTF-8 (no overlongs, surrogates or > U+10FFFF).
bool ValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    for (int k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) ||
        (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

// One tokenizer on `text`; `nfc`: it normalizes to NFC first.
void CheckTokenizer(const shardlm::Tokenizer& tok, const std::string& text,
                    bool nfc, const uint8_t* data, size_t size) {
  using namespace shardlm;
  const std::vector<int32_t> ids = tok.Encode(text);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  }
  // SmolLM2's vocabulary lacks 21 of the 256 byte symbols (0x04, 0x06,
  // 0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1, 0xf1, 0xf2, 0xf5-0xff), which its
  // tokenizer drops, as Hugging Face's does: the round trip holds for the
  // rest. A byte's symbol is GPT-2's byte-to-unicode mapping.
  static const std::vector<bool> dropped = [&tok] {
    std::vector<bool> d(256);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
      const int cp = printable ? b : next++;
      std::string symbol;
      if (cp < 0x80) {
        symbol = std::string(1, static_cast<char>(cp));
      } else {
        symbol += static_cast<char>(0xc0 | (cp >> 6));
        symbol += static_cast<char>(0x80 | (cp & 0x3f));
      }
      d[b] = !tok.TokenId(symbol).has_value();
    }
    return d;
  }();
  std::string expected;
  for (char c : nfc ? NormalizeNfc(text) : text) {
    if (!dropped[static_cast<unsigned char>(c)]) expected += c;
  }
  if (ValidUtf8(text) && tok.Decode(ids) != expected) {
    const std::string back = tok.Decode(ids);
    std::fprintf(stderr,
                 "round trip of %zu bytes gave %zu bytes; ids:", text.size(),
                 back.size());
    for (int32_t id : ids) std::fprintf(stderr, " %d", id);
    std::fprintf(stderr, "\ndecoded:");
    for (unsigned char c : back) std::fprintf(stderr, " %02x", c);
    std::fprintf(stderr, "\n");
    std::abort();
  }
  // Streamed: always valid UTF-8, whatever the ids (here also the raw
  // bytes read as ids, most of them single-byte tokens).
  for (const std::vector<int32_t>* stream : {&ids}) {
    StreamingDetokenizer d(&tok);
    std::string out;
    for (int32_t id : *stream) out += d.Push(id);
    out += d.Finish();
    if (!ValidUtf8(out)) std::abort();
  }
  StreamingDetokenizer raw(&tok);
  std::string out;
  for (size_t i = 0; i + 1 < size; i += 2) {
    out += raw.Push((data[i] << 8 | data[i + 1]) % tok.vocab_size());
  }
  out += raw.Finish();
  if (!ValidUtf8(out)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (PreTokenizerKind kind : kKinds) {
    std::vector<std::string_view> pieces;
    PreTokenize(text, kind, &pieces);
    std::string joined;
    for (std::string_view piece : pieces) {
      if (piece.empty()) std::abort();
      joined += piece;
    }
    if (joined != text) std::abort();
  }
  if (ValidUtf8(text)) {
    const std::string nfc = NormalizeNfc(text);
    if (!ValidUtf8(nfc) || NormalizeNfc(nfc) != nfc) std::abort();
  }
  const auto& tokenizers = Tokenizers();
  for (size_t k = 0; k < tokenizers.size(); ++k) {
    CheckTokenizer(*tokenizers[k], text, kKinds[k] == PreTokenizerKind::kQwen2,
                   data, size);
  }
  return 0;
}
