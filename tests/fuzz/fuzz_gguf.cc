// GGUF bytes -> header, metadata, tensor table, model config and the
// tokenizer built from its metadata, which then encodes and decodes a
// string. Hostile files must give errors, never memory errors.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "model/bpe_tokenizer.h"
#include "model/gguf.h"
#include "model/tokenizer_loaders.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  auto gguf = GgufFile::Parse(absl::MakeConstSpan(data, size), "fuzz.gguf");
  if (!gguf.ok()) return 0;
  (void)ModelConfigFromGguf(**gguf);
  absl::StatusOr<BpeConfig> config = BpeConfigFromGguf(**gguf);
  if (!config.ok()) return 0;
  auto tokenizer = BpeTokenizer::Create(*std::move(config));
  if (!tokenizer.ok()) return 0;
  const std::vector<int32_t> ids =
      (*tokenizer)->Encode("Hello, world! 123 \xc3\xa9t\xc3\xa9 <|im_end|>");
  (void)(*tokenizer)->Decode(ids);
  return 0;
}
