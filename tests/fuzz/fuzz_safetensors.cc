// A safetensors file (8-byte header length, JSON header, data) beside a
// valid config.json, opened as a Hugging Face model directory: the header
// and every tensor entry are checked against the file, and each tensor the
// reader accepts is read once.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "model/dequantize.h"
#include "model/safetensors.h"

namespace {

const std::string& Dir() {
  static const std::string* dir = [] {
    char tmpl[] = "/tmp/shardlm-fuzz-safetensors-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) std::abort();
    auto* d = new std::string(tmpl);
    std::ofstream(*d + "/config.json")
        << R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 32,
               "intermediate_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 2, "num_key_value_heads": 1,
               "vocab_size": 67, "max_position_embeddings": 64,
               "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
               "tie_word_embeddings": true})";
    return d;
  }();
  return *dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  const std::string path = Dir() + "/model.safetensors";
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<long>(size));
  }
  auto source = OpenSafetensorsWeights(Dir());
  if (!source.ok()) return 0;
  for (const TensorInfo& t : (*source)->tensors()) {
    (void)DequantizeTensor(**source, t);
  }
  return 0;
}
