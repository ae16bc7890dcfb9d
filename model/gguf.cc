#include "model/gguf.h"

#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace shardlm {
namespace {

constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS.
constexpr int64_t kMaxElements = int64_t{1} << 40;
// Metadata arrays are held decoded (24 bytes an element); the largest real
// ones are vocabularies of a few hundred thousand entries.
constexpr uint64_t kMaxArrayLength = uint64_t{1} << 24;

// Bounds-checked little-endian reader over the file bytes. Every error
// names the offset and the field being read.
class Reader {
 public:
  Reader(absl::Span<const uint8_t> bytes, const std::string& name)
      : bytes_(bytes), name_(name) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

  absl::Status Error(std::string_view field, std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": GGUF ", Sv(field), " at offset ", pos_, ": ", Sv(what)));
  }

  template <typename T>
  absl::StatusOr<T> Read(std::string_view field) {
    if (remaining() < sizeof(T)) {
      return Error(field, absl::StrCat("file ends (", remaining(),
                                       " bytes left, need ", sizeof(T), ")"));
    }
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<std::string_view> ReadString(std::string_view field) {
    ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(field));
    if (len > remaining()) {
      pos_ -= sizeof(uint64_t);
      return Error(field, absl::StrCat("string length ", len, " exceeds the ",
                                       remaining(), " bytes left"));
    }
    std::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_),
                       len);
    pos_ += len;
    return s;
  }

 private:
  absl::Span<const uint8_t> bytes_;
  const std::string& name_;
  size_t pos_ = 0;
};

absl::StatusOr<GgufScalar> ReadScalar(Reader& r, GgufType type,
                                      std::string_view field) {
  switch (type) {
    case GgufType::kUint8: {
      ASSIGN_OR_RETURN(uint8_t v, r.Read<uint8_t>(field));
      return GgufScalar(uint64_t{v});
    }
    case GgufType::kInt8: {
      ASSIGN_OR_RETURN(int8_t v, r.Read<int8_t>(field));
      return GgufScalar(int64_t{v});
    }
    case GgufType::kUint16: {
      ASSIGN_OR_RETURN(uint16_t v, r.Read<uint16_t>(field));
      return GgufScalar(uint64_t{v});
    }
    case GgufType::kInt16: {
      ASSIGN_OR_RETURN(int16_t v, r.Read<int16_t>(field));
      return GgufScalar(int64_t{v});
    }
    case GgufType::kUint32: {
      ASSIGN_OR_RETURN(uint32_t v, r.Read<uint32_t>(field));
      return GgufScalar(uint64_t{v});
    }
    case GgufType::kInt32: {
      ASSIGN_OR_RETURN(int32_t v, r.Read<int32_t>(field));
      return GgufScalar(int64_t{v});
    }
    case GgufType::kUint64: {
      ASSIGN_OR_RETURN(uint64_t v, r.Read<uint64_t>(field));
      return GgufScalar(v);
    }
    case GgufType::kInt64: {
      ASSIGN_OR_RETURN(int64_t v, r.Read<int64_t>(field));
      return GgufScalar(v);
    }
    case GgufType::kFloat32: {
      ASSIGN_OR_RETURN(float v, r.Read<float>(field));
      return GgufScalar(double{v});
    }
    case GgufType::kFloat64: {
      ASSIGN_OR_RETURN(double v, r.Read<double>(field));
      return GgufScalar(v);
    }
    case GgufType::kBool: {
      ASSIGN_OR_RETURN(uint8_t v, r.Read<uint8_t>(field));
      if (v > 1) return r.Error(field, absl::StrCat("bool value ", v));
      return GgufScalar(v == 1);
    }
    case GgufType::kString: {
      ASSIGN_OR_RETURN(std::string_view v, r.ReadString(field));
      return GgufScalar(v);
    }
    case GgufType::kArray:
      return r.Error(field, "nested arrays are not supported");
  }
  return r.Error(
      field, absl::StrCat("unknown value type ", static_cast<uint32_t>(type)));
}

// Smallest encoding of one value of `type`, to reject absurd array counts
// before looping over them.
size_t MinEncodedSize(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    default:
      return 8;
  }
}

absl::StatusOr<GgufValue> ReadValue(Reader& r, const std::string& key) {
  const std::string field = absl::StrCat("value of '", key, "'");
  ASSIGN_OR_RETURN(uint32_t raw_type, r.Read<uint32_t>(field));
  if (raw_type > static_cast<uint32_t>(GgufType::kFloat64)) {
    return r.Error(field, absl::StrCat("unknown value type ", raw_type));
  }
  GgufValue value{.type = static_cast<GgufType>(raw_type),
                  .element_type = GgufType::kUint8,
                  .scalar = GgufScalar(uint64_t{0}),
                  .array = {}};
  if (value.type != GgufType::kArray) {
    ASSIGN_OR_RETURN(value.scalar, ReadScalar(r, value.type, field));
    return value;
  }
  ASSIGN_OR_RETURN(uint32_t elem, r.Read<uint32_t>(field));
  if (elem > static_cast<uint32_t>(GgufType::kFloat64)) {
    return r.Error(field, absl::StrCat("unknown array element type ", elem));
  }
  value.element_type = static_cast<GgufType>(elem);
  ASSIGN_OR_RETURN(uint64_t count, r.Read<uint64_t>(field));
  if (count > kMaxArrayLength ||
      count > r.remaining() / MinEncodedSize(value.element_type)) {
    return r.Error(
        field, absl::StrCat("array of ", count, " elements cannot fit in the ",
                            r.remaining(), " bytes left"));
  }
  value.array.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(GgufScalar s, ReadScalar(r, value.element_type, field));
    value.array.push_back(s);
  }
  return value;
}

absl::StatusOr<int64_t> ScalarToInt(const GgufScalar& s) {
  if (const auto* u = std::get_if<uint64_t>(&s)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::OutOfRangeError(absl::StrCat(*u, " does not fit int64"));
    }
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&s)) return *i;
  return absl::InvalidArgumentError("not an integer");
}

std::string_view TypeName(GgufType t) {
  static constexpr std::string_view kNames[] = {
      "uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
      "bool",  "string", "array",  "uint64", "int64",  "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(
    const std::string& path) {
  ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  std::unique_ptr<GgufFile> gguf(new GgufFile());
  gguf->bytes_ = file->bytes();
  gguf->name_ = path;
  gguf->file_ = std::move(file);
  RETURN_IF_ERROR(gguf->ParseAll());
  return gguf;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(
    absl::Span<const uint8_t> bytes, std::string name) {
  std::unique_ptr<GgufFile> gguf(new GgufFile());
  gguf->bytes_ = bytes;
  gguf->name_ = std::move(name);
  RETURN_IF_ERROR(gguf->ParseAll());
  return gguf;
}

absl::Status GgufFile::ParseAll() {
  Reader r(bytes_, name_);
  ASSIGN_OR_RETURN(uint32_t magic, r.Read<uint32_t>("magic"));
  if (magic != 0x46554747) {  // "GGUF" little-endian.
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": not a GGUF file (magic is 0x", absl::Hex(magic),
                     ", expected \"GGUF\")"));
  }
  ASSIGN_OR_RETURN(version_, r.Read<uint32_t>("version"));
  if (version_ != 2 && version_ != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": GGUF version ", version_, " is not supported (2 and 3 are)"));
  }
  ASSIGN_OR_RETURN(uint64_t n_tensors, r.Read<uint64_t>("tensor_count"));
  ASSIGN_OR_RETURN(uint64_t n_kv, r.Read<uint64_t>("kv_count"));
  // A KV needs at least 8 (key length) + 4 (type) + 1 bytes; a tensor info
  // at least 8 + 4 + 4 + 8.
  if (n_kv > r.remaining() / 13 || n_tensors > r.remaining() / 24) {
    return r.Error("counts", absl::StrCat(n_kv, " KVs and ", n_tensors,
                                          " tensors cannot fit in the file"));
  }

  for (uint64_t i = 0; i < n_kv; ++i) {
    ASSIGN_OR_RETURN(std::string_view key,
                     r.ReadString(absl::StrCat("key of KV #", i)));
    std::string k(key);
    if (metadata_.contains(k)) {
      return r.Error("metadata", absl::StrCat("duplicate key '", k, "'"));
    }
    ASSIGN_OR_RETURN(GgufValue value, ReadValue(r, k));
    metadata_.emplace(std::move(k), std::move(value));
  }

  uint64_t alignment = 32;
  if (Find("general.alignment") != nullptr) {
    ASSIGN_OR_RETURN(int64_t a, GetInt("general.alignment"));
    if (a <= 0 || a > (1 << 20) || (a & (a - 1)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name_, ": general.alignment ", a, " is not a power of two"));
    }
    alignment = static_cast<uint64_t>(a);
  }

  struct Pending {
    TensorInfo info;
    uint64_t relative_offset;
    size_t info_pos;
  };
  std::vector<Pending> pending;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const size_t info_pos = r.pos();
    const std::string field = absl::StrCat("tensor info #", i);
    ASSIGN_OR_RETURN(std::string_view name, r.ReadString(field));
    ASSIGN_OR_RETURN(uint32_t n_dims, r.Read<uint32_t>(field));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return r.Error(field, absl::StrCat("tensor '", Sv(name), "' has ", n_dims,
                                         " dimensions (1 to 4 allowed)"));
    }
    Shape shape(n_dims);
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      ASSIGN_OR_RETURN(uint64_t dim, r.Read<uint64_t>(field));
      if (dim == 0 || dim > static_cast<uint64_t>(kMaxElements) ||
          numel > kMaxElements / static_cast<int64_t>(dim)) {
        return r.Error(field, absl::StrCat("tensor '", Sv(name),
                                           "' has an absurd dimension ", dim));
      }
      numel *= static_cast<int64_t>(dim);
      // GGUF lists the fastest-varying dimension first.
      shape[n_dims - 1 - d] = static_cast<int64_t>(dim);
    }
    ASSIGN_OR_RETURN(uint32_t ggml_type, r.Read<uint32_t>(field));
    auto dtype = DTypeFromGgml(ggml_type);
    if (!dtype.ok()) {
      return r.Error(field, absl::StrCat("tensor '", Sv(name),
                                         "': ", dtype.status().message()));
    }
    if (shape.back() % BlockElems(*dtype) != 0) {
      return r.Error(
          field, absl::StrCat("tensor '", Sv(name), "' rows of ", shape.back(),
                              " are not whole ", DTypeName(*dtype), " blocks"));
    }
    ASSIGN_OR_RETURN(uint64_t offset, r.Read<uint64_t>(field));
    ASSIGN_OR_RETURN(int64_t bytes, BytesFor(*dtype, numel));
    pending.push_back(
        Pending{.info = TensorInfo{.name = std::string(name),
                                   .dtype = *dtype,
                                   .shape = std::move(shape),
                                   .bytes = static_cast<uint64_t>(bytes)},
                .relative_offset = offset,
                .info_pos = info_pos});
  }

  const uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;
  tensors_.reserve(pending.size());
  std::set<std::string> names;
  for (Pending& p : pending) {
    TensorInfo& t = p.info;
    const auto fail = [&](std::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": GGUF tensor info at offset ", p.info_pos,
                       ": tensor '", t.name, "' ", Sv(what)));
    };
    if (p.relative_offset % alignment != 0) {
      return fail(absl::StrCat("data offset ", p.relative_offset,
                               " is not aligned to ", alignment));
    }
    if (data_start > bytes_.size() ||
        p.relative_offset > bytes_.size() - data_start ||
        t.bytes > bytes_.size() - data_start - p.relative_offset) {
      return fail(absl::StrCat("data [", data_start + p.relative_offset, ", +",
                               t.bytes, ") lies beyond the end of the file (",
                               bytes_.size(), " bytes)"));
    }
    t.offset = data_start + p.relative_offset;
    if (!names.insert(t.name).second) return fail("is listed twice");
    tensors_.push_back(std::move(t));
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {

absl::Status WrongType(const std::string& file, std::string_view key,
                       const GgufValue& v, std::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat(file, ": GGUF key '", Sv(key), "' is ", Sv(TypeName(v.type)),
                   v.type == GgufType::kArray
                       ? absl::StrCat(" of ", Sv(TypeName(v.element_type)))
                       : "",
                   ", expected ", Sv(want)));
}

}  // namespace

#define SHARDLM_GGUF_FIND_(key)                                             \
  const GgufValue* v = Find(key);                                           \
  if (v == nullptr) {                                                       \
    return absl::NotFoundError(                                             \
        absl::StrCat(name_, ": GGUF metadata has no key '", Sv(key), "'")); \
  }

absl::StatusOr<std::string_view> GgufFile::GetString(
    std::string_view key) const {
  SHARDLM_GGUF_FIND_(key);
  if (v->type != GgufType::kString) return WrongType(name_, key, *v, "string");
  return std::get<std::string_view>(v->scalar);
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  SHARDLM_GGUF_FIND_(key);
  auto i = ScalarToInt(v->scalar);
  if (v->type == GgufType::kArray || !i.ok()) {
    return WrongType(name_, key, *v, "an integer");
  }
  return *i;
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  SHARDLM_GGUF_FIND_(key);
  if (v->type == GgufType::kFloat32 || v->type == GgufType::kFloat64) {
    return std::get<double>(v->scalar);
  }
  return WrongType(name_, key, *v, "a float");
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  SHARDLM_GGUF_FIND_(key);
  if (v->type != GgufType::kBool) return WrongType(name_, key, *v, "bool");
  return std::get<bool>(v->scalar);
}

absl::StatusOr<std::vector<std::string_view>> GgufFile::GetStringArray(
    std::string_view key) const {
  SHARDLM_GGUF_FIND_(key);
  if (v->type != GgufType::kArray || v->element_type != GgufType::kString) {
    return WrongType(name_, key, *v, "array of string");
  }
  std::vector<std::string_view> out;
  out.reserve(v->array.size());
  for (const GgufScalar& s : v->array) {
    out.push_back(std::get<std::string_view>(s));
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(
    std::string_view key) const {
  SHARDLM_GGUF_FIND_(key);
  if (v->type != GgufType::kArray) {
    return WrongType(name_, key, *v, "array of integers");
  }
  std::vector<int64_t> out;
  out.reserve(v->array.size());
  for (const GgufScalar& s : v->array) {
    auto i = ScalarToInt(s);
    if (!i.ok()) return WrongType(name_, key, *v, "array of integers");
    out.push_back(*i);
  }
  return out;
}

#undef SHARDLM_GGUF_FIND_

}  // namespace shardlm
