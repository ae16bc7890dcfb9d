// Prints what our tokenizer does with each input, for check_tokenizer.py.
//
//   tokenize_dump --model PATH < lines
//   tokenize_dump --nfc < lines
//
// Each stdin line is a JSON string; each stdout line is
//   {"ids": Encode(text), "prompt_ids": EncodePrompt(text),
//    "decoded": Decode(ids), "streamed": StreamingDetokenizer output of the
//    same ids}
// or, with --nfc, {"nfc": NormalizeNfc(text)} (invalid UTF-8 in the text
// fields is written as U+FFFD). The tokenizer's Summary() and the encode
// throughput go to stderr.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "model/normalizer.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

using Json = nlohmann::json;

int DumpNfc() {
  std::string line;
  while (std::getline(std::cin, line)) {
    const Json in = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!in.is_string()) {
      std::fprintf(stderr, "input line is not a JSON string: %s\n",
                   line.c_str());
      return 1;
    }
    Json out;
    out["nfc"] = shardlm::NormalizeNfc(in.get<std::string>());
    std::cout << out.dump(-1, ' ', false, Json::error_handler_t::replace)
              << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (arg == "--nfc" && argc == 2) {
      return DumpNfc();
    } else {
      std::fprintf(stderr, "usage: %s --model PATH | --nfc < json_lines\n",
                   argv[0]);
      return 2;
    }
  }
  if (model.empty()) {
    std::fprintf(stderr, "--model is required\n");
    return 2;
  }
  auto tok = shardlm::LoadTokenizer(model);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "%s\n", (*tok)->Summary().c_str());

  double encode_seconds = 0;
  size_t bytes = 0, tokens = 0;
  std::string line;
  while (std::getline(std::cin, line)) {
    const Json in = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!in.is_string()) {
      std::fprintf(stderr, "input line is not a JSON string: %s\n",
                   line.c_str());
      return 1;
    }
    const std::string text = in.get<std::string>();
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = (*tok)->Encode(text);
    encode_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    bytes += text.size();
    tokens += ids.size();

    shardlm::StreamingDetokenizer stream(tok->get());
    std::string streamed;
    for (int32_t id : ids) streamed += stream.Push(id);
    streamed += stream.Finish();

    Json out;
    out["ids"] = ids;
    out["prompt_ids"] = (*tok)->EncodePrompt(text);
    out["decoded"] = (*tok)->Decode(ids);
    out["streamed"] = streamed;
    std::cout << out.dump(-1, ' ', false, Json::error_handler_t::replace)
              << "\n";
  }
  std::fprintf(stderr,
               "encoded %zu bytes into %zu tokens in %.3f ms (%.2f MB/s)\n",
               bytes, tokens, encode_seconds * 1e3,
               encode_seconds > 0 ? bytes / encode_seconds / 1e6 : 0.0);
  return 0;
}
