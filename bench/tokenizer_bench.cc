// What literal (special / added) tokens cost the tokenizers (a benchmark,
// not a test):
//   tokenizer_bench --model GGUF [--unused 6300] [--kb 100] [--repeat 5]
//                   [--json out.json]
// The model's byte-level BPE vocabulary, and a SentencePiece vocabulary made
// of the same pieces ("Ġ" read back as "▁", scores by id, <0xXX> byte
// tokens), each built twice: as it is and with `--unused` extra control
// tokens <unused0>, <unused1>, ... (Gemma 3's vocabulary has about 6,300
// literal pieces, nearly all starting with '<'). Each encodes `--kb` KiB of
// HTML-like, C++-like and prose text; reports the best MB/s of `--repeat`
// runs. Exits 1 when the extra tokens change any text's ids (none of them
// is written in it), or a text that writes a few of them does not get
// exactly their ids.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/cpu_name.h"
#include "core/status.h"
#include "launch/flags.h"
#include "model/bpe_tokenizer.h"
#include "model/gguf.h"
#include "model/spm_tokenizer.h"
#include "model/tokenizer_loaders.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

// Deterministic texts of about `bytes` bytes.
std::string Html(size_t bytes) {
  std::string s;
  for (int i = 0; s.size() < bytes; ++i) {
    absl::StrAppend(&s, "<div class=\"row\" id=\"r", i,
                    "\">\n  <span><a href=\"/item/", i * 7,
                    "\">Item</a></span> <b>bold</b><br/>\n"
                    "  <ul><li>one</li><li>two &lt;3</li></ul>\n</div>\n");
  }
  return s;
}

std::string Code(size_t bytes) {
  std::string s;
  for (int i = 0; s.size() < bytes; ++i) {
    absl::StrAppend(&s, "template <typename T>\nstd::vector<T> F", i,
                    "(const std::vector<T>& v) {\n  if (v.size() < ", i,
                    " && v[0] <= v[1]) return {};\n  return v;  // <ok>\n}\n");
  }
  return s;
}

std::string Prose(size_t bytes) {
  std::string s;
  for (int i = 0; s.size() < bytes; ++i) {
    absl::StrAppend(&s, "The quick brown fox ", i,
                    " jumps over the lazy dog, and the rest of the story is "
                    "told once more in plain words.\n");
  }
  return s;
}

// SentencePiece pieces from byte-level BPE tokens: "Ġthe" -> "▁the".
absl::StatusOr<SpmConfig> SpmFromBpe(const BpeConfig& bpe) {
  SpmConfig c;
  for (int b = 0; b < 256; ++b) {
    char piece[8];
    std::snprintf(piece, sizeof(piece), "<0x%02X>", b);
    c.pieces.push_back(piece);
    c.types.push_back(SpmTokenType::kByte);
  }
  for (const std::string& t : bpe.tokens) {
    std::optional<std::string> raw = ByteLevelDecode(t);
    if (!raw.has_value() || raw->empty()) continue;
    std::string piece;
    for (char ch : *raw) {
      if (ch == ' ') {
        piece += "\xe2\x96\x81";
      } else {
        piece += ch;
      }
    }
    c.pieces.push_back(std::move(piece));
    c.types.push_back(SpmTokenType::kNormal);
  }
  for (size_t i = 0; i < c.pieces.size(); ++i) {
    c.scores.push_back(-static_cast<float>(i));
  }
  c.add_bos = false;
  return c;
}

struct Case {
  std::string vocab, text;
  double mbps_plain = 0, mbps_unused = 0;
  size_t tokens = 0;
};

double BestMbps(const Tokenizer& tok, const std::string& text, int64_t repeat,
                std::vector<int32_t>* ids) {
  double best = 1e30;
  for (int64_t r = 0; r < repeat; ++r) {
    const auto t0 = Clock::now();
    *ids = tok.Encode(text);
    best = std::min(best,
                    std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return static_cast<double>(text.size()) / 1e6 / best;
}

int Main(int argc, char** argv) {
  std::string model, json_path;
  int64_t unused = 6300, kb = 100, repeat = 5;
  FlagSet flags("usage: tokenizer_bench --model GGUF [flags]");
  flags.Add("model", &model, "GGUF with a byte-level BPE tokenizer");
  flags.Add("unused", &unused, "extra <unusedN> control tokens");
  flags.Add("kb", &kb, "KiB of each text");
  flags.Add("repeat", &repeat, "timed encodes per case (the best counts)");
  flags.Add("json", &json_path, "also write results here");
  if (absl::Status s = flags.Parse(argc, argv, 1);
      !s.ok() || model.empty() || unused < 1 || kb < 1 || repeat < 1) {
    std::fprintf(stderr, "%s\n%s", s.ToString().c_str(), flags.Usage().c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<GgufFile>> gguf = GgufFile::Open(model);
  absl::StatusOr<BpeConfig> bpe =
      gguf.ok() ? BpeConfigFromGguf(**gguf) : gguf.status();
  absl::StatusOr<SpmConfig> spm = bpe.ok() ? SpmFromBpe(*bpe) : bpe.status();
  if (!spm.ok()) {
    std::fprintf(stderr, "%s: %s\n", model.c_str(),
                 spm.status().ToString().c_str());
    return 1;
  }

  // The same vocabularies with the <unusedN> tokens (ids after the rest).
  BpeConfig bpe_unused = *bpe;
  int32_t next = static_cast<int32_t>(bpe->tokens.size());
  for (const AddedToken& a : bpe->added_tokens) next = std::max(next, a.id + 1);
  const int32_t bpe_first_unused = next;
  for (int64_t i = 0; i < unused; ++i) {
    bpe_unused.added_tokens.push_back(
        {.id = next++, .content = absl::StrCat("<unused", i, ">")});
  }
  SpmConfig spm_unused = *spm;
  const int32_t spm_first_unused = static_cast<int32_t>(spm->pieces.size());
  for (int64_t i = 0; i < unused; ++i) {
    spm_unused.pieces.push_back(absl::StrCat("<unused", i, ">"));
    spm_unused.scores.push_back(0);
    spm_unused.types.push_back(SpmTokenType::kControl);
  }
  struct Pair {
    std::string name;
    std::unique_ptr<Tokenizer> plain, with_unused;
    int32_t first_unused;
  };
  std::vector<Pair> vocabs;
  {
    auto a = BpeTokenizer::Create(*bpe);
    auto b = BpeTokenizer::Create(std::move(bpe_unused));
    auto c = SpmTokenizer::Create(*spm);
    auto d = SpmTokenizer::Create(std::move(spm_unused));
    for (const absl::Status& s :
         {a.status(), b.status(), c.status(), d.status()}) {
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
    }
    vocabs.push_back({"bpe", *std::move(a), *std::move(b), bpe_first_unused});
    vocabs.push_back({"spm", *std::move(c), *std::move(d), spm_first_unused});
  }

  const size_t bytes = static_cast<size_t>(kb) * 1024;
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"html", Html(bytes)}, {"code", Code(bytes)}, {"prose", Prose(bytes)}};
  bool ok = true;
  std::vector<Case> cases;
  for (const Pair& v : vocabs) {
    for (const auto& [name, text] : texts) {
      Case c{.vocab = v.name, .text = name};
      std::vector<int32_t> plain_ids, unused_ids;
      c.mbps_plain = BestMbps(*v.plain, text, repeat, &plain_ids);
      c.mbps_unused = BestMbps(*v.with_unused, text, repeat, &unused_ids);
      c.tokens = plain_ids.size();
      if (plain_ids != unused_ids) {
        std::fprintf(stderr, "%s %s: the <unusedN> tokens changed the ids\n",
                     v.name.c_str(), name.c_str());
        ok = false;
      }
      cases.push_back(c);
    }
    // Written literally, each is its own token (longest match: <unused12>
    // and not <unused1>).
    const int64_t last = unused - 1;
    const std::string text =
        absl::StrCat("<unused0><unused", last, "><unused", last / 2, ">");
    const std::vector<int32_t> ids = v.with_unused->Encode(text);
    const std::vector<int32_t> want = {
        v.first_unused, v.first_unused + static_cast<int32_t>(last),
        v.first_unused + static_cast<int32_t>(last / 2)};
    if (ids != want) {
      std::fprintf(stderr, "%s: \"%s\" did not encode to its three tokens\n",
                   v.name.c_str(), text.c_str());
      ok = false;
    }
  }

  std::printf("CPU: %s\n", CpuName().c_str());
  std::printf(
      "%s; %lld extra <unusedN> control tokens; %lld KiB texts; "
      "best of %lld\n",
      model.c_str(), static_cast<long long>(unused), static_cast<long long>(kb),
      static_cast<long long>(repeat));
  std::printf("%-6s %-6s %9s %12s %14s %8s\n", "vocab", "text", "tokens",
              "MB/s plain", "MB/s +unused", "ratio");
  nlohmann::json out = {{"cpu", CpuName()},
                        {"model", model},
                        {"unused", unused},
                        {"kb", kb},
                        {"repeat", repeat}};
  for (const Case& c : cases) {
    std::printf("%-6s %-6s %9zu %12.2f %14.2f %8.2f\n", c.vocab.c_str(),
                c.text.c_str(), c.tokens, c.mbps_plain, c.mbps_unused,
                c.mbps_plain / c.mbps_unused);
    out["cases"].push_back({{"vocab", c.vocab},
                            {"text", c.text},
                            {"tokens", c.tokens},
                            {"mbps_plain", c.mbps_plain},
                            {"mbps_unused", c.mbps_unused}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) { return shardlm::Main(argc, argv); }
