// PLACEHOLDER: being written; replaced before this work is called done.
#include "model/tokenizer.h"

namespace shardlm {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(
    const std::string& path) {
  return absl::UnimplementedError("tokenizer not written yet");
}

}  // namespace shardlm
