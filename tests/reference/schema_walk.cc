// schema_walk: random walks of constrained decoding over a model's real
// vocabulary, for the property test of structured outputs
// (tests/reference/check_schema_walk.py, issue 38).
//
// Reads one JSON object per stdin line, {"schema": {...}, "walks": K,
// "seed": S, "max_tokens": M}; compiles the schema as a request's
// response_format would be (CompileJsonSchema, the model's VocabTrie) and
// runs K walks: from the empty output, a token drawn uniformly from the
// constraint's mask (the model's EOS among them once the output is
// complete) until EOS or M tokens. Writes one JSON object per walk:
// {"schema": i, "text_hex": ..., "complete": bool, "error": "..."} where
// `error` is set when the constraint refused a token its own mask allowed,
// or its mask was empty while the output was incomplete. A uniform walk
// reaches tokens that no model would pick, which is the point: every token
// the mask allows must keep the output a valid prefix, and the test
// validates each complete output against the schema with `jsonschema`.
//
//   schema_walk --model MODEL.gguf < schemas.jsonl > walks.jsonl
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

struct Walk {
  std::string text;
  bool complete = false;
  std::string error;
};

Walk RunWalk(std::shared_ptr<const CompiledGrammar> grammar, int32_t eos,
             int32_t vocab, const VocabTrie& trie, std::mt19937_64& rng,
             int max_tokens) {
  Walk w;
  GrammarConstraint c(std::move(grammar), {eos});
  std::vector<uint64_t> mask;
  std::vector<int32_t> allowed;
  for (int step = 0; step < max_tokens; ++step) {
    c.Allowed(vocab, mask);
    allowed.clear();
    for (int32_t t = 0; t < vocab; ++t) {
      if (mask[t / 64] >> (t % 64) & 1) allowed.push_back(t);
    }
    if (allowed.empty()) {
      w.error = "empty mask after " + std::to_string(step) + " tokens";
      return w;
    }
    const int32_t t = allowed[std::uniform_int_distribution<size_t>(
        0, allowed.size() - 1)(rng)];
    if (t == eos) {
      if (!c.complete()) w.error = "EOS allowed before the output was complete";
      w.complete = c.complete();
      return w;
    }
    if (absl::Status s = c.Accept(t); !s.ok()) {
      w.error = "token " + std::to_string(t) +
                " allowed, then refused: " + std::string(s.message());
      return w;
    }
    w.text += trie.bytes(t);
  }
  return w;  // Cut at max_tokens.
}

int Main(int argc, char** argv) {
  std::string model;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--model") model = argv[i + 1];
  }
  if (model.empty()) {
    std::fprintf(stderr, "usage: schema_walk --model MODEL < schemas.jsonl\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizer(model);
  if (!tok.ok()) {
    std::fprintf(stderr, "schema_walk: %s\n",
                 std::string(tok.status().message()).c_str());
    return 1;
  }
  const auto trie = std::make_shared<const VocabTrie>(**tok);
  const int32_t eos = (*tok)->eos_id(), vocab = (*tok)->vocab_size();
  std::string line;
  for (int index = 0; std::getline(std::cin, line); ++index) {
    const nlohmann::json in = nlohmann::json::parse(line);
    absl::StatusOr<Grammar> g = CompileJsonSchema(in.at("schema").dump());
    if (!g.ok()) {
      std::cout << nlohmann::json{{"schema", index},
                                  {"refused",
                                   std::string(g.status().message())}}
                       .dump()
                << "\n";
      continue;
    }
    const auto compiled =
        std::make_shared<const CompiledGrammar>(*std::move(g), trie);
    std::mt19937_64 rng(in.value("seed", uint64_t{1}));
    for (int k = 0; k < in.value("walks", 1); ++k) {
      const Walk w = RunWalk(compiled, eos, vocab, *trie, rng,
                             in.value("max_tokens", 256));
      std::cout << nlohmann::json{{"schema", index},
                                  {"text_hex", absl::BytesToHexString(w.text)},
                                  {"complete", w.complete},
                                  {"error", w.error}}
                       .dump()
                << "\n";
    }
  }
  return 0;
}

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) { return shardlm::Main(argc, argv); }
