// Unicode normalization for the tokenizer (Hugging Face normalizers).
#ifndef SHARDLM_MODEL_NORMALIZER_H_
#define SHARDLM_MODEL_NORMALIZER_H_

#include <string>
#include <string_view>

namespace shardlm {

// Normalization Form C (UAX #15): canonical decomposition, canonical
// ordering of combining marks, canonical composition, with the Unicode
// version of unicode_nfc_tables.cc. Bytes that are not well-formed UTF-8
// pass through unchanged and, like any starter, block composition across
// them. Thread-safe.
std::string NormalizeNfc(std::string_view text);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_NORMALIZER_H_
