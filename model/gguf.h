// GGUF v2/v3 reader: metadata and tensor directory of a memory-mapped file.
//
// Everything is bounds-checked while parsing: a truncated, corrupt or
// hostile file gives InvalidArgument naming the byte offset and the field,
// never a crash or an allocation sized by untrusted counts.
#ifndef SHARDLM_MODEL_GGUF_H_
#define SHARDLM_MODEL_GGUF_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/mapped_file.h"
#include "model/weight_source.h"

namespace shardlm {

// GGUF metadata value types, numbered as in the file format.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// A scalar metadata value. Strings point into the mapped file.
using GgufScalar =
    std::variant<uint64_t, int64_t, double, bool, std::string_view>;

struct GgufValue {
  GgufType type;                  // kArray for arrays.
  GgufType element_type;          // Arrays only.
  GgufScalar scalar;              // Scalars only.
  std::vector<GgufScalar> array;  // Arrays only.
};

class GgufFile {
 public:
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(
      const std::string& path);
  // Parses bytes owned by the caller (they must outlive the result).
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(
      absl::Span<const uint8_t> bytes, std::string name);

  uint32_t version() const { return version_; }
  const std::string& name() const { return name_; }
  absl::Span<const uint8_t> bytes() const { return bytes_; }
  const std::map<std::string, GgufValue, std::less<>>& metadata() const {
    return metadata_;
  }
  // Tensors with canonical names, row-major shapes and absolute offsets.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  const GgufValue* Find(std::string_view key) const;
  // Typed accessors: NotFound when absent, InvalidArgument when the value
  // has another type. Integers of any width convert when in range.
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::vector<std::string_view>> GetStringArray(
      std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;

 private:
  GgufFile() = default;
  absl::Status ParseAll();

  std::unique_ptr<MappedFile> file_;  // Null when parsing caller bytes.
  absl::Span<const uint8_t> bytes_;
  std::string name_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<TensorInfo> tensors_;
};

// Reads a Llama-family ModelConfig from GGUF metadata ("llama.*" keys).
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& gguf);

// A WeightSource over a GGUF file.
absl::StatusOr<std::unique_ptr<WeightSource>> OpenGgufWeights(
    const std::string& path);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_GGUF_H_
