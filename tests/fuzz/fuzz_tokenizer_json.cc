// tokenizer.json bytes -> BPE configuration -> tokenizer, which then
// encodes and decodes a string.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/bpe_tokenizer.h"
#include "model/tokenizer_loaders.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  absl::StatusOr<BpeConfig> config = BpeConfigFromTokenizerJson(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!config.ok()) return 0;
  auto tokenizer = BpeTokenizer::Create(*std::move(config));
  if (!tokenizer.ok()) return 0;
  const std::vector<int32_t> ids =
      (*tokenizer)->Encode("Hello, world! 123 \xc3\xa9t\xc3\xa9 don't");
  (void)(*tokenizer)->Decode(ids);
  return 0;
}
