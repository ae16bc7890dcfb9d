// Hostile-input tests for the GGUF and safetensors loaders.
//
// Each loader gets a tiny valid model built in the test (so the byte layout
// is known exactly), then variants with one thing broken. Every variant
// must give a non-OK status whose message names the problem; none may
// crash (the ASan build, -DSHARDLM_ASAN=ON, checks the "never crash" part).
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "model/weight_source.h"

namespace shardlm {
namespace {

using ::testing::HasSubstr;

// A fresh directory per test, under the test temp dir.
std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "shardlm_loader_test" /
      absl::StrCat(info->test_suite_name(), ".", info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

absl::Span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

void PutU32(std::string& b, size_t pos, uint32_t v) {
  ASSERT_LE(pos + 4, b.size());
  std::memcpy(b.data() + pos, &v, 4);  // The test host is little-endian.
}
void PutU64(std::string& b, size_t pos, uint64_t v) {
  ASSERT_LE(pos + 8, b.size());
  std::memcpy(b.data() + pos, &v, 8);
}

// A deterministic byte pattern, different per tensor.
std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed * 31 + i * 7);
  return s;
}

// Tiny Llama: hidden 32 (4 heads of 8, 2 KV heads), FFN 64, vocab 40.
constexpr int64_t kHidden = 32, kFfn = 64, kVocab = 40, kLayers = 2;
constexpr int64_t kHeads = 4, kKvHeads = 2, kHeadDim = 8;

// ================================================================ GGUF ===

enum GgmlType : uint32_t { kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ8_0 = 8 };

// Writes GGUF files field by field and remembers where each field went, so
// that tests can patch single fields into hostile values.
class GgufBuilder {
 public:
  uint32_t version = 3;
  uint64_t alignment = 32;  // Data padding; KV written by SetAlignment.

  void Str(const std::string& key, std::string_view v) {
    std::string p;
    AppendStr(p, v);
    Kv(key, GgufType::kString, p);
  }
  void U32(const std::string& key, uint32_t v) {
    Kv(key, GgufType::kUint32, Raw(v));
  }
  void F32(const std::string& key, float v) {
    Kv(key, GgufType::kFloat32, Raw(v));
  }
  void StrArray(const std::string& key, const std::vector<std::string>& v) {
    std::string p = Raw(static_cast<uint32_t>(GgufType::kString)) +
                    Raw(static_cast<uint64_t>(v.size()));
    for (const std::string& s : v) AppendStr(p, s);
    Kv(key, GgufType::kArray, p);
  }
  void SetAlignment(uint32_t a) {
    alignment = a;
    U32("general.alignment", a);
  }
  // A KV with raw type and payload (the encoded value after the type).
  void Kv(const std::string& key, GgufType type, std::string payload) {
    kvs_.push_back({key, static_cast<uint32_t>(type), std::move(payload)});
  }

  // `dims` in GGUF order (fastest-varying first). The data goes at the next
  // aligned offset unless `offset` (relative to the data section) is given.
  void Tensor(const std::string& name, uint32_t type,
              std::vector<uint64_t> dims, std::string data,
              std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({name, type, std::move(dims), std::move(data), offset});
  }

  std::string Build() {
    std::string b = "GGUF";
    b += Raw(version);
    marks["tensor_count"] = b.size();
    b += Raw(static_cast<uint64_t>(tensors_.size()));
    marks["kv_count"] = b.size();
    b += Raw(static_cast<uint64_t>(kvs_.size()));
    for (const KvEntry& kv : kvs_) {
      marks["key_len:" + kv.key] = b.size();
      AppendStr(b, kv.key);
      marks["type:" + kv.key] = b.size();
      b += Raw(kv.type);
      marks["value:" + kv.key] = b.size();
      b += kv.payload;
    }
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const TensorEntry& t : tensors_) {
      const uint64_t off = t.offset.value_or(next);
      offsets.push_back(off);
      next = (std::max(next, off + t.data.size()) + alignment - 1) / alignment *
             alignment;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const TensorEntry& t = tensors_[i];
      const std::string m =
          ":" + t.name +
          (marked_.insert(t.name).second ? "" : absl::StrCat("#", i));
      marks["name_len" + m] = b.size();
      AppendStr(b, t.name);
      marks["n_dims" + m] = b.size();
      b += Raw(static_cast<uint32_t>(t.dims.size()));
      marks["dims" + m] = b.size();
      for (uint64_t d : t.dims) b += Raw(d);
      marks["ggml_type" + m] = b.size();
      b += Raw(t.type);
      marks["offset" + m] = b.size();
      b += Raw(offsets[i]);
    }
    header_end = b.size();
    b.resize((b.size() + alignment - 1) / alignment * alignment, '\0');
    data_start = b.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const std::string& d = tensors_[i].data;
      const size_t at = data_start + offsets[i];
      if (b.size() < at + d.size()) b.resize(at + d.size(), '\0');
      std::memcpy(b.data() + at, d.data(), d.size());
    }
    marked_.clear();
    return b;
  }

  std::map<std::string, size_t> marks;  // Field -> byte offset, by Build().
  size_t header_end = 0;                // End of the tensor infos.
  size_t data_start = 0;

 private:
  struct KvEntry {
    std::string key;
    uint32_t type;
    std::string payload;
  };
  struct TensorEntry {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> dims;
    std::string data;
    std::optional<uint64_t> offset;
  };
  template <typename T>
  static std::string Raw(T v) {
    std::string s(sizeof(T), '\0');
    std::memcpy(s.data(), &v, sizeof(T));
    return s;
  }
  static void AppendStr(std::string& b, std::string_view s) {
    b += Raw(static_cast<uint64_t>(s.size()));
    b += s;
  }
  std::vector<KvEntry> kvs_;
  std::vector<TensorEntry> tensors_;
  std::set<std::string> marked_;
};

size_t GgmlBytes(uint32_t type, uint64_t n) {
  switch (type) {
    case kGgmlF32:
      return n * 4;
    case kGgmlF16:
      return n * 2;
    case kGgmlQ8_0:
      return n / 32 * 34;
  }
  return 0;
}

// A valid tiny Llama GGUF, except that `string_key` (if any) holds its
// value as a string instead of a number.
GgufBuilder TinyGguf(std::string_view string_key = "") {
  GgufBuilder g;
  auto u32 = [&](const std::string& key, uint32_t v) {
    key == string_key ? g.Str(key, absl::StrCat(v)) : g.U32(key, v);
  };
  auto f32 = [&](const std::string& key, float v) {
    key == string_key ? g.Str(key, absl::StrCat(v)) : g.F32(key, v);
  };
  if (string_key == "general.architecture") {
    g.U32("general.architecture", 7);
  } else {
    g.Str("general.architecture", "llama");
  }
  g.Str("general.name", "tiny");
  u32("llama.block_count", kLayers);
  u32("llama.context_length", 128);
  u32("llama.embedding_length", kHidden);
  u32("llama.feed_forward_length", kFfn);
  u32("llama.attention.head_count", kHeads);
  u32("llama.attention.head_count_kv", kKvHeads);
  f32("llama.rope.freq_base", 100000.0f);
  f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  u32("llama.vocab_size", kVocab);
  std::vector<std::string> tokens;
  for (int i = 0; i < kVocab; ++i) tokens.push_back(absl::StrCat("t", i));
  g.StrArray("tokenizer.ggml.tokens", tokens);
  u32("tokenizer.ggml.bos_token_id", 1);
  u32("tokenizer.ggml.eos_token_id", 2);
  int seed = 0;
  auto add = [&](const std::string& name, uint32_t type,
                 std::vector<uint64_t> dims) {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    g.Tensor(name, type, dims, Pattern(GgmlBytes(type, n), ++seed));
  };
  add("token_embd.weight", kGgmlF32, {kHidden, kVocab});
  for (int l = 0; l < kLayers; ++l) {
    const std::string b = absl::StrCat("blk.", l, ".");
    add(b + "attn_norm.weight", kGgmlF32, {kHidden});
    add(b + "attn_q.weight", kGgmlF16, {kHidden, kHeads * kHeadDim});
    add(b + "attn_k.weight", kGgmlF16, {kHidden, kKvHeads * kHeadDim});
    add(b + "attn_v.weight", kGgmlF16, {kHidden, kKvHeads * kHeadDim});
    add(b + "attn_output.weight", kGgmlF16, {kHeads * kHeadDim, kHidden});
    add(b + "ffn_norm.weight", kGgmlF32, {kHidden});
    add(b + "ffn_gate.weight", kGgmlQ8_0, {kHidden, kFfn});
    add(b + "ffn_up.weight", kGgmlQ8_0, {kHidden, kFfn});
    add(b + "ffn_down.weight", kGgmlQ8_0, {kFfn, kHidden});
  }
  add("output_norm.weight", kGgmlF32, {kHidden});
  return g;
}

absl::StatusOr<std::unique_ptr<GgufFile>> ParseGguf(const std::string& b) {
  return GgufFile::Parse(AsBytes(b), "test.gguf");
}

// Expects parsing to fail with InvalidArgument mentioning every `needle`.
void ExpectGgufError(const std::string& bytes,
                     const std::vector<std::string>& needles) {
  auto g = ParseGguf(bytes);
  ASSERT_FALSE(g.ok()) << "hostile GGUF was accepted";
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument)
      << g.status();
  for (const std::string& n : needles) {
    EXPECT_THAT(g.status().message(), HasSubstr(n));
  }
}

TEST(GgufLoaderTest, ValidFileParses) {
  GgufBuilder b = TinyGguf();
  const std::string bytes = b.Build();
  const std::string path = TestDir() + "/tiny.gguf";
  WriteFile(path, bytes);

  auto source = OpenWeights(path);
  ASSERT_TRUE(source.ok()) << source.status();
  const WeightSource& w = **source;
  EXPECT_EQ(w.format(), "GGUF v3");
  const ModelConfig& c = w.config();
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.name, "tiny");
  EXPECT_EQ(c.n_layers, kLayers);
  EXPECT_EQ(c.hidden, kHidden);
  EXPECT_EQ(c.ffn_hidden, kFfn);
  EXPECT_EQ(c.n_heads, kHeads);
  EXPECT_EQ(c.n_kv_heads, kKvHeads);
  EXPECT_EQ(c.head_dim, kHeadDim);
  EXPECT_EQ(c.vocab_size, kVocab);
  EXPECT_EQ(c.context_length, 128);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_TRUE(c.tied_embeddings);  // No output.weight.
  EXPECT_EQ(c.rope_style, RopeStyle::kAdjacentPairs);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_id, 2);

  ASSERT_EQ(w.tensors().size(), 1 + 9 * kLayers + 1);
  // GGUF dims [in, out] are shape {out, in}.
  auto embd = w.Require("token_embd.weight", {kVocab, kHidden});
  ASSERT_TRUE(embd.ok()) << embd.status();
  EXPECT_EQ((*embd)->dtype, DType::kF32);
  EXPECT_EQ((*embd)->offset, b.data_start);  // First tensor, offset 0.
  EXPECT_EQ(w.Data(**embd), AsBytes(Pattern(kVocab * kHidden * 4, 1)));
  auto down = w.Require("blk.1.ffn_down.weight", {kHidden, kFfn});
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_EQ((*down)->dtype, DType::kQ8_0);
  EXPECT_EQ((*down)->bytes, kHidden * kFfn / 32 * 34);
  EXPECT_EQ((*down)->offset % 32, 0u);
  auto k = w.Require("blk.0.attn_k.weight", {kKvHeads * kHeadDim, kHidden});
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ((*k)->dtype, DType::kF16);
  EXPECT_EQ(w.Data(**k),
            AsBytes(Pattern(kKvHeads * kHeadDim * kHidden * 2, 4)));
  EXPECT_TRUE(w.Require("output_norm.weight", {kHidden}).ok());
  for (const TensorInfo& t : w.tensors()) {
    EXPECT_LE(t.offset + t.bytes, bytes.size()) << t.name;
  }

  // Metadata accessors.
  auto g = ParseGguf(bytes);
  ASSERT_TRUE(g.ok()) << g.status();
  auto tokens = (*g)->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), kVocab);
  EXPECT_EQ((*tokens)[39], "t39");
  EXPECT_EQ((*g)->GetInt("llama.block_count").value_or(-1), kLayers);
  EXPECT_EQ((*g)->GetString("llama.block_count").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*g)->GetInt("no.such.key").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(GgufLoaderTest, OutputWeightUntiesAndAlignmentIsHonoured) {
  GgufBuilder b = TinyGguf();
  b.SetAlignment(64);
  b.Tensor("output.weight", kGgmlF16, {kHidden, kVocab},
           Pattern(kHidden * kVocab * 2, 99));
  const std::string bytes = b.Build();
  auto g = ParseGguf(bytes);
  ASSERT_TRUE(g.ok()) << g.status();
  for (const TensorInfo& t : (*g)->tensors()) {
    EXPECT_EQ(t.offset % 64, 0u) << t.name;
  }
  auto c = ModelConfigFromGguf(**g);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->tied_embeddings);
}

TEST(GgufLoaderTest, RejectsWrongMagic) {
  std::string bytes = TinyGguf().Build();
  bytes[0] = 'X';
  ExpectGgufError(bytes, {"magic"});
  ExpectGgufError("GGU", {});
  ExpectGgufError("", {});
}

TEST(GgufLoaderTest, RejectsUnsupportedVersions) {
  for (uint32_t v : {0u, 1u, 4u, 0xffffffffu}) {
    GgufBuilder b = TinyGguf();
    b.version = v;
    ExpectGgufError(b.Build(), {"version", absl::StrCat(v)});
  }
}

TEST(GgufLoaderTest, RejectsEveryTruncation) {
  GgufBuilder b = TinyGguf();
  const std::string bytes = b.Build();
  // Every prefix that ends inside the header, then some inside the data.
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= b.data_start; ++n) lengths.push_back(n);
  for (size_t n : {b.data_start + 1, bytes.size() / 2, bytes.size() - 1}) {
    lengths.push_back(n);
  }
  for (size_t n : lengths) {
    // A copy of exactly n bytes, so that ASan sees any read past the end.
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + n);
    auto g = GgufFile::Parse(absl::MakeConstSpan(prefix), "cut.gguf");
    // Past the header, the tensors that run off the end must be caught.
    EXPECT_FALSE(g.ok()) << "prefix of " << n << " bytes was accepted";
  }
  EXPECT_TRUE(ParseGguf(bytes).ok());
}

TEST(GgufLoaderTest, RejectsAbsurdCounts) {
  GgufBuilder b = TinyGguf();
  const std::string good = b.Build();
  constexpr uint64_t k2to60 = uint64_t{1} << 60;
  {
    std::string bytes = good;
    PutU64(bytes, b.marks["tensor_count"], k2to60);
    ExpectGgufError(bytes, {absl::StrCat(k2to60)});
  }
  {
    std::string bytes = good;
    PutU64(bytes, b.marks["kv_count"], k2to60);
    ExpectGgufError(bytes, {absl::StrCat(k2to60)});
  }
  {
    std::string bytes = good;
    PutU64(bytes, b.marks["tensor_count"], ~uint64_t{0});
    ExpectGgufError(bytes, {});
  }
  {  // A key's string length.
    std::string bytes = good;
    PutU64(bytes, b.marks["key_len:general.name"], uint64_t{1} << 62);
    ExpectGgufError(bytes, {absl::StrCat(uint64_t{1} << 62)});
  }
  {  // A string value's length.
    std::string bytes = good;
    PutU64(bytes, b.marks["value:general.name"], uint64_t{1} << 62);
    ExpectGgufError(bytes, {absl::StrCat(uint64_t{1} << 62)});
  }
  {  // A tensor name's length.
    std::string bytes = good;
    PutU64(bytes, b.marks["name_len:blk.0.attn_q.weight"], ~uint64_t{0});
    ExpectGgufError(bytes, {});
  }
  {  // An array's length (after its u32 element type).
    std::string bytes = good;
    PutU64(bytes, b.marks["value:tokenizer.ggml.tokens"] + 4, k2to60);
    ExpectGgufError(bytes, {absl::StrCat(k2to60)});
  }
  {  // n_dims 9 (and 0).
    for (uint32_t n : {0u, 5u, 9u, 0xffffffffu}) {
      std::string bytes = good;
      PutU32(bytes, b.marks["n_dims:blk.0.attn_q.weight"], n);
      ExpectGgufError(bytes, {"blk.0.attn_q.weight"});
    }
  }
  {  // A dimension of 2^40, alone and multiplied with the other.
    for (size_t d : {0, 1}) {
      std::string bytes = good;
      PutU64(bytes, b.marks["dims:token_embd.weight"] + 8 * d,
             uint64_t{1} << 40);
      ExpectGgufError(bytes, {"token_embd.weight"});
    }
    std::string bytes = good;
    PutU64(bytes, b.marks["dims:output_norm.weight"], uint64_t{1} << 40);
    ExpectGgufError(bytes, {"output_norm.weight"});
    bytes = good;
    PutU64(bytes, b.marks["dims:output_norm.weight"], ~uint64_t{0});
    ExpectGgufError(bytes, {"output_norm.weight"});
  }
}

TEST(GgufLoaderTest, RejectsBadTensorData) {
  GgufBuilder b = TinyGguf();
  const std::string good = b.Build();
  const std::string name = "blk.1.attn_v.weight";
  {  // Offset far out of range (aligned, so only the range is wrong).
    std::string bytes = good;
    PutU64(bytes, b.marks["offset:" + name], uint64_t{1} << 40);
    ExpectGgufError(bytes, {name});
    PutU64(bytes, b.marks["offset:" + name], ~uint64_t{0} & ~uint64_t{31});
    ExpectGgufError(bytes, {name});
  }
  {  // Starts inside the file, ends beyond it.
    std::string bytes = good;
    const uint64_t rel_end = bytes.size() - b.data_start;
    PutU64(bytes, b.marks["offset:" + name], rel_end / 32 * 32);
    ExpectGgufError(bytes, {name});
  }
  {  // Unknown and unsupported tensor types.
    for (uint32_t t : {999u, 12u /* Q4_K */, 0xffffffffu}) {
      std::string bytes = good;
      PutU32(bytes, b.marks["ggml_type:" + name], t);
      ExpectGgufError(bytes, {name, absl::StrCat(t)});
    }
  }
  {  // Unaligned offset.
    std::string bytes = good;
    PutU64(bytes, b.marks["offset:" + name], 4);
    ExpectGgufError(bytes, {name, "align"});
  }
  {  // Quantized rows that are not whole blocks (Q8_0 rows of 16).
    GgufBuilder q = TinyGguf();
    q.Tensor("extra.weight", kGgmlQ8_0, {16, 2}, std::string(34, '\0'));
    ExpectGgufError(q.Build(), {"extra.weight"});
  }
}

TEST(GgufLoaderTest, RejectsDuplicatesAndBadMetadata) {
  {
    GgufBuilder b = TinyGguf();
    b.Tensor("blk.0.attn_norm.weight", kGgmlF32, {kHidden},
             Pattern(kHidden * 4, 7));
    ExpectGgufError(b.Build(), {"blk.0.attn_norm.weight"});
  }
  {
    GgufBuilder b = TinyGguf();
    b.U32("llama.block_count", 3);
    ExpectGgufError(b.Build(), {"llama.block_count"});
  }
  {  // Unknown value type.
    GgufBuilder b = TinyGguf();
    b.Kv("x.weird", static_cast<GgufType>(13), "abcd");
    ExpectGgufError(b.Build(), {"x.weird"});
  }
  {  // Unknown array element type.
    GgufBuilder b = TinyGguf();
    b.Kv("x.weird", GgufType::kArray,
         std::string("\x0d\0\0\0\1\0\0\0\0\0\0\0\0\0\0\0", 16));
    ExpectGgufError(b.Build(), {"x.weird"});
  }
  {  // A bool that is neither 0 nor 1.
    GgufBuilder b = TinyGguf();
    b.Kv("x.flag", GgufType::kBool, "\x07");
    ExpectGgufError(b.Build(), {"x.flag"});
  }
  for (uint32_t a : {0u, 3u, 48u}) {  // Alignment not a power of two.
    GgufBuilder b = TinyGguf();
    b.SetAlignment(a == 0 ? 32 : a);  // The builder itself needs a != 0.
    std::string bytes = b.Build();
    PutU32(bytes, b.marks["value:general.alignment"], a);
    ExpectGgufError(bytes, {"alignment"});
  }
}

TEST(GgufLoaderTest, RejectsWrongKeyTypesInConfig) {
  for (const std::string key :
       {"general.architecture", "llama.block_count", "llama.embedding_length",
        "llama.feed_forward_length", "llama.attention.head_count",
        "llama.attention.head_count_kv", "llama.context_length",
        "llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon",
        "llama.vocab_size", "tokenizer.ggml.eos_token_id"}) {
    SCOPED_TRACE(key);
    const std::string bytes = TinyGguf(key).Build();
    auto g = ParseGguf(bytes);
    ASSERT_TRUE(g.ok()) << g.status();
    auto c = ModelConfigFromGguf(**g);
    ASSERT_FALSE(c.ok()) << key << " of the wrong type was accepted";
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument)
        << c.status();
    EXPECT_THAT(c.status().message(), HasSubstr(key));
  }
}

TEST(GgufLoaderTest, RejectsAbsurdConfigValues) {
  for (auto [key, value] : std::vector<std::pair<std::string, uint32_t>>{
           {"llama.block_count", 1'000'000'000},
           {"llama.attention.head_count", 3},  // Does not divide 32.
           {"llama.attention.head_count_kv", 3},
           {"llama.vocab_size", 0xffffffff}}) {
    GgufBuilder b = TinyGguf();
    std::string bytes = b.Build();
    PutU32(bytes, b.marks["value:" + key], value);
    auto g = ParseGguf(bytes);
    ASSERT_TRUE(g.ok()) << g.status();
    auto c = ModelConfigFromGguf(**g);
    EXPECT_FALSE(c.ok()) << key << " = " << value << " was accepted";
  }
}

// Seeded random corruption of the header region: anything may happen
// except a crash or a tensor that points outside the file.
TEST(GgufLoaderTest, SurvivesRandomHeaderCorruption) {
  GgufBuilder b = TinyGguf();
  const std::string good = b.Build();
  std::mt19937_64 rng(1234);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bytes = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % b.header_end;
      if (rng() % 2 == 0 || pos + 8 > bytes.size()) {
        bytes[pos] = static_cast<char>(rng());
      } else {  // A random or extreme little-endian u64.
        const uint64_t extremes[] = {
            0, 1, ~uint64_t{0}, uint64_t{1} << 63, uint64_t{1} << 32, rng()};
        PutU64(bytes, pos, extremes[rng() % std::size(extremes)]);
      }
    }
    const std::vector<uint8_t> copy(bytes.begin(), bytes.end());
    auto g = GgufFile::Parse(absl::MakeConstSpan(copy), "fuzz.gguf");
    if (!g.ok()) continue;
    for (const TensorInfo& t : (*g)->tensors()) {
      ASSERT_LE(t.offset, copy.size()) << "iteration " << iter;
      ASSERT_LE(t.bytes, copy.size() - t.offset) << "iteration " << iter;
    }
    (void)ModelConfigFromGguf(**g);
  }
}

// ========================================================= safetensors ===

size_t ElemSize(std::string_view dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "I64" || dtype == "F64") return 8;
  return 1;
}

struct StTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  // Raw JSON for the whole entry, replacing the generated one.
  std::optional<std::string> raw_entry = std::nullopt;
  // Raw JSON for data_offsets, replacing the generated pair.
  std::optional<std::string> raw_offsets = std::nullopt;
};

// A safetensors file: tensors packed in order, data = Pattern(seed).
std::string SafetensorsBytes(const std::vector<StTensor>& tensors,
                             int seed = 0) {
  std::vector<std::string> entries = {R"("__metadata__":{"format":"pt"})"};
  std::string data;
  for (const StTensor& t : tensors) {
    size_t n = ElemSize(t.dtype);
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    const size_t begin = data.size();
    data += Pattern(n, ++seed);
    const std::string offsets =
        t.raw_offsets.value_or(absl::StrCat("[", begin, ",", data.size(), "]"));
    entries.push_back(
        absl::StrCat("\"", t.name, "\":",
                     t.raw_entry.value_or(absl::StrCat(
                         R"({"dtype":")", t.dtype, R"(","shape":[)",
                         absl::StrJoin(t.shape, ","), R"(],"data_offsets":)",
                         offsets, "}"))));
  }
  std::string header = "{" + absl::StrJoin(entries, ",") + "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

std::vector<StTensor> LayerTensors(int l) {
  const std::string p = absl::StrCat("model.layers.", l, ".");
  return {
      {p + "input_layernorm.weight", "F32", {kHidden}},
      {p + "self_attn.q_proj.weight", "BF16", {kHeads * kHeadDim, kHidden}},
      {p + "self_attn.k_proj.weight", "BF16", {kKvHeads * kHeadDim, kHidden}},
      {p + "self_attn.v_proj.weight", "BF16", {kKvHeads * kHeadDim, kHidden}},
      {p + "self_attn.o_proj.weight", "BF16", {kHidden, kHeads * kHeadDim}},
      {p + "self_attn.rotary_emb.inv_freq", "F32", {kHeadDim / 2}},
      {p + "post_attention_layernorm.weight", "F32", {kHidden}},
      {p + "mlp.gate_proj.weight", "F16", {kFfn, kHidden}},
      {p + "mlp.up_proj.weight", "F16", {kFfn, kHidden}},
      {p + "mlp.down_proj.weight", "F16", {kHidden, kFfn}},
  };
}

// config.json as key -> raw JSON value, so tests can change or drop keys.
std::map<std::string, std::string> TinyConfig() {
  return {
      {"architectures", R"(["LlamaForCausalLM"])"},
      {"model_type", R"("llama")"},
      {"hidden_size", absl::StrCat(kHidden)},
      {"intermediate_size", absl::StrCat(kFfn)},
      {"num_hidden_layers", absl::StrCat(kLayers)},
      {"num_attention_heads", absl::StrCat(kHeads)},
      {"num_key_value_heads", absl::StrCat(kKvHeads)},
      {"vocab_size", absl::StrCat(kVocab)},
      {"max_position_embeddings", "128"},
      {"rope_theta", "100000.0"},
      {"rms_norm_eps", "1e-05"},
      {"tie_word_embeddings", "false"},
      {"bos_token_id", "1"},
      {"eos_token_id", "[2, 3]"},
      {"hidden_act", R"("silu")"},
      {"rope_scaling", "null"},
      {"torch_dtype", R"("bfloat16")"},
  };
}

std::string ConfigJson(const std::map<std::string, std::string>& kv) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : kv)
    parts.push_back(absl::StrCat("\"", k, "\": ", v));
  return "{\n  " + absl::StrJoin(parts, ",\n  ") + "\n}\n";
}

// Writes a valid two-file model into `dir`; returns the files' bytes.
std::vector<std::string> WriteTinySafetensors(
    const std::string& dir,
    const std::map<std::string, std::string>& config = TinyConfig()) {
  WriteFile(dir + "/config.json", ConfigJson(config));
  std::vector<StTensor> first = {
      {"model.embed_tokens.weight", "F32", {kVocab, kHidden}}};
  for (const StTensor& t : LayerTensors(0)) first.push_back(t);
  std::vector<StTensor> second = LayerTensors(1);
  second.push_back({"model.norm.weight", "F32", {kHidden}});
  second.push_back({"lm_head.weight", "BF16", {kVocab, kHidden}});
  second.push_back({"model.layers.1.extra.position_ids", "I64", {1, 4}});
  std::vector<std::string> files = {SafetensorsBytes(first, 0),
                                    SafetensorsBytes(second, 100)};
  // Written in reverse to check that the reader sorts by name.
  WriteFile(dir + "/model-00002-of-00002.safetensors", files[1]);
  WriteFile(dir + "/model-00001-of-00002.safetensors", files[0]);
  return files;
}

// Expects opening `dir` to fail, mentioning every needle.
void ExpectSafetensorsError(
    const std::string& dir, const std::vector<std::string>& needles,
    absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  auto w = OpenSafetensorsWeights(dir);
  ASSERT_FALSE(w.ok()) << "hostile safetensors model was accepted";
  EXPECT_EQ(w.status().code(), code) << w.status();
  for (const std::string& n : needles) {
    EXPECT_THAT(w.status().message(), HasSubstr(n));
  }
}

TEST(SafetensorsLoaderTest, ValidDirectoryOpens) {
  const std::string dir = TestDir();
  const std::vector<std::string> files = WriteTinySafetensors(dir);
  auto source = OpenWeights(dir);
  ASSERT_TRUE(source.ok()) << source.status();
  const WeightSource& w = **source;
  EXPECT_EQ(w.format(), "safetensors (2 files)");

  const ModelConfig& c = w.config();
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.n_layers, kLayers);
  EXPECT_EQ(c.hidden, kHidden);
  EXPECT_EQ(c.ffn_hidden, kFfn);
  EXPECT_EQ(c.n_heads, kHeads);
  EXPECT_EQ(c.n_kv_heads, kKvHeads);
  EXPECT_EQ(c.head_dim, kHeadDim);
  EXPECT_EQ(c.vocab_size, kVocab);
  EXPECT_EQ(c.context_length, 128);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.rope_style, RopeStyle::kRotateHalf);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_id, 2);  // The first of the list.

  // 1 + 9 per layer + 2 canonical, plus the two inv_freq kept under their
  // own names; the I64 extra is skipped.
  EXPECT_EQ(w.tensors().size(), 1 + 9 * kLayers + 2 + 2);
  EXPECT_EQ(w.Find("model.layers.1.extra.position_ids"), nullptr);
  EXPECT_NE(w.Find("model.layers.0.self_attn.rotary_emb.inv_freq"), nullptr);

  struct Expect {
    std::string name;
    Shape shape;
    DType dtype;
    int file;
  };
  for (const Expect& e : std::vector<Expect>{
           {"token_embd.weight", {kVocab, kHidden}, DType::kF32, 0},
           {"blk.0.attn_norm.weight", {kHidden}, DType::kF32, 0},
           {"blk.0.attn_q.weight",
            {kHeads * kHeadDim, kHidden},
            DType::kBF16,
            0},
           {"blk.0.attn_k.weight",
            {kKvHeads * kHeadDim, kHidden},
            DType::kBF16,
            0},
           {"blk.0.attn_v.weight",
            {kKvHeads * kHeadDim, kHidden},
            DType::kBF16,
            0},
           {"blk.0.attn_output.weight",
            {kHidden, kHeads * kHeadDim},
            DType::kBF16,
            0},
           {"blk.0.ffn_norm.weight", {kHidden}, DType::kF32, 0},
           {"blk.1.ffn_gate.weight", {kFfn, kHidden}, DType::kF16, 1},
           {"blk.1.ffn_up.weight", {kFfn, kHidden}, DType::kF16, 1},
           {"blk.1.ffn_down.weight", {kHidden, kFfn}, DType::kF16, 1},
           {"output_norm.weight", {kHidden}, DType::kF32, 1},
           {"output.weight", {kVocab, kHidden}, DType::kBF16, 1}}) {
    auto t = w.Require(e.name, e.shape);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->dtype, e.dtype) << e.name;
    EXPECT_EQ((*t)->file, e.file) << e.name;
  }

  // Data: the embedding is the first tensor of file 0 (seed 1); the output
  // the second-to-last of file 1.
  const TensorInfo* embd = w.Find("token_embd.weight");
  uint64_t header_len = 0;
  std::memcpy(&header_len, files[0].data(), 8);
  EXPECT_EQ(embd->offset, 8 + header_len);
  EXPECT_EQ(w.Data(*embd), AsBytes(Pattern(kVocab * kHidden * 4, 1)));
  const TensorInfo* out = w.Find("output.weight");
  EXPECT_EQ(w.Data(*out), AsBytes(Pattern(kVocab * kHidden * 2, 100 + 12)));
  // File order: offsets increase within each file.
  for (size_t i = 1; i < w.tensors().size(); ++i) {
    const TensorInfo& a = w.tensors()[i - 1];
    const TensorInfo& b = w.tensors()[i];
    EXPECT_TRUE(a.file < b.file || (a.file == b.file && a.offset < b.offset))
        << a.name << " then " << b.name;
  }
}

TEST(SafetensorsLoaderTest, ConfigDefaultsAndSingleFile) {
  const std::string dir = TestDir();
  auto config = TinyConfig();
  config.erase("num_key_value_heads");  // Defaults to the query heads.
  config.erase("rope_theta");           // Defaults to 10000.
  config.erase("tie_word_embeddings");  // Defaults to false.
  config.erase("model_type");           // From architectures[0].
  config["eos_token_id"] = "7";
  config["tie_word_embeddings"] = "true";
  WriteFile(dir + "/config.json", ConfigJson(config));
  WriteFile(dir + "/model.safetensors",
            SafetensorsBytes(
                {{"model.embed_tokens.weight", "F16", {kVocab, kHidden}}}));
  auto w = OpenSafetensorsWeights(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->format(), "safetensors (1 file)");
  EXPECT_EQ((*w)->config().n_kv_heads, kHeads);
  EXPECT_FLOAT_EQ((*w)->config().rope_theta, 10000.0f);
  EXPECT_EQ((*w)->config().architecture, "llama");
  EXPECT_TRUE((*w)->config().tied_embeddings);
  EXPECT_EQ((*w)->config().eos_id, 7);
}

TEST(SafetensorsLoaderTest, RejectsBadConfig) {
  struct Case {
    std::string key;
    std::optional<std::string> value;  // nullopt: remove the key.
    std::string needle;
  };
  for (const Case& c : std::vector<Case>{
           {"num_hidden_layers", "1000000000", "n_layers"},
           {"num_hidden_layers", "1e9", "num_hidden_layers"},
           {"num_hidden_layers", "-2", "num_hidden_layers"},
           {"num_hidden_layers", "18446744073709551615", "num_hidden_layers"},
           {"num_hidden_layers", "0", "n_layers"},
           {"num_hidden_layers", R"("2")", "num_hidden_layers"},
           {"num_hidden_layers", std::nullopt, "num_hidden_layers"},
           {"hidden_size", std::nullopt, "hidden_size"},
           {"num_attention_heads", "5", "num_attention_heads"},  // 32 % 5.
           {"num_attention_heads", "0", "num_attention_heads"},
           {"num_key_value_heads", "3", "n_kv_heads"},
           {"vocab_size", "99999999999", "vocab_size"},
           {"rms_norm_eps", std::nullopt, "rms_norm_eps"},
           {"rope_theta", R"("big")", "rope_theta"},
           {"rope_theta", "1e300", "rope_theta"},
           {"model_type", R"("gpt2")", "gpt2"},
           {"rope_scaling", R"({"type":"linear","factor":2.0})",
            "rope_scaling"},
           {"hidden_act", R"("gelu")", "hidden_act"},
           {"attention_bias", "true", "attention_bias"},
           {"tie_word_embeddings", "1", "tie_word_embeddings"},
           {"eos_token_id", "4294967296", "eos_token_id"},
       }) {
    SCOPED_TRACE(absl::StrCat(c.key, " = ", c.value.value_or("(absent)")));
    const std::string dir = TestDir();
    auto config = TinyConfig();
    if (c.value.has_value()) {
      config[c.key] = *c.value;
    } else {
      config.erase(c.key);
    }
    WriteTinySafetensors(dir, config);
    ExpectSafetensorsError(dir, {"config.json", c.needle});
  }
}

TEST(SafetensorsLoaderTest, RejectsMissingOrMalformedConfigFile) {
  const std::string dir = TestDir();
  WriteTinySafetensors(dir);
  std::filesystem::remove(dir + "/config.json");
  ExpectSafetensorsError(dir, {"config.json"}, absl::StatusCode::kNotFound);
  for (const std::string& bad :
       std::vector<std::string>{"", "{", "[1,2]", "{\"hidden_size\": 32,}",
                                "nul", std::string("{\"a\":\"\xff\"}")}) {
    WriteFile(dir + "/config.json", bad);
    ExpectSafetensorsError(dir, {"config.json"});
  }
  // Deep nesting must not overflow the stack.
  WriteFile(dir + "/config.json", std::string(100000, '[') + "]");
  ExpectSafetensorsError(dir, {"config.json"});
}

TEST(SafetensorsLoaderTest, RejectsDirectoryWithoutWeights) {
  const std::string dir = TestDir();
  WriteFile(dir + "/config.json", ConfigJson(TinyConfig()));
  ExpectSafetensorsError(dir, {"safetensors"}, absl::StatusCode::kNotFound);
  ExpectSafetensorsError(dir + "/nonexistent", {"config.json"},
                         absl::StatusCode::kNotFound);
}

// Writes `bytes` as the only weights file of a model with a valid config.
std::string SingleFileModel(const std::string& bytes) {
  const std::string dir = TestDir();
  WriteFile(dir + "/config.json", ConfigJson(TinyConfig()));
  WriteFile(dir + "/model.safetensors", bytes);
  return dir;
}

TEST(SafetensorsLoaderTest, RejectsEveryTruncation) {
  const std::string bytes = SafetensorsBytes(LayerTensors(0));
  const std::string dir = SingleFileModel(bytes);
  const std::string path = dir + "/model.safetensors";
  ASSERT_TRUE(OpenSafetensorsWeights(dir).ok());
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  // Every cut inside the header, and a few inside the data.
  std::vector<size_t> lengths;
  for (size_t n = 0; n < 8 + header_len + 2; ++n) lengths.push_back(n);
  for (size_t n : {bytes.size() / 2, bytes.size() - 1}) lengths.push_back(n);
  for (size_t n : lengths) {
    WriteFile(path, std::string_view(bytes).substr(0, n));
    auto w = OpenSafetensorsWeights(dir);
    EXPECT_FALSE(w.ok()) << "prefix of " << n << " bytes was accepted";
    if (!w.ok()) {
      EXPECT_THAT(w.status().message(), HasSubstr("model.safetensors"));
    }
  }
}

TEST(SafetensorsLoaderTest, RejectsBadHeaderLength) {
  const std::string good = SafetensorsBytes(LayerTensors(0));
  for (uint64_t len :
       {uint64_t{1} << 62, ~uint64_t{0}, static_cast<uint64_t>(good.size()),
        static_cast<uint64_t>(good.size() - 7), uint64_t{200} << 20}) {
    std::string bytes = good;
    PutU64(bytes, 0, len);
    ExpectSafetensorsError(SingleFileModel(bytes), {"header length"});
  }
  // Header length 0 and 1: nothing, or half of the JSON.
  for (uint64_t len : {0, 1}) {
    std::string bytes = good;
    PutU64(bytes, 0, len);
    ExpectSafetensorsError(SingleFileModel(bytes), {"model.safetensors"});
  }
}

// A model file whose header is `header` verbatim (padded), with `data`.
std::string RawSafetensors(std::string header, std::string_view data = {}) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data);
}

TEST(SafetensorsLoaderTest, RejectsMalformedHeaderJson) {
  for (const std::string& header :
       {std::string("not json at all"), std::string("{\"a\": "),
        std::string("[1, 2, 3]"), std::string("\"string\""),
        std::string(50000, '{'), std::string(50000, '[') + "]",
        std::string("{\"t\": 5}"), std::string("{\"__metadata__\": 5}"),
        std::string("{\"t\": {\"dtype\": \"F32\"}}")}) {
    ExpectSafetensorsError(SingleFileModel(RawSafetensors(header, "abcd")),
                           {"model.safetensors"});
  }
}

TEST(SafetensorsLoaderTest, RejectsBadTensorEntries) {
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  struct Case {
    std::string what;
    std::vector<StTensor> tensors;
    std::vector<std::string> needles;
  };
  auto layer_with = [&](std::function<void(StTensor&)> f) {
    std::vector<StTensor> t = LayerTensors(0);
    for (StTensor& e : t) {
      if (e.name == q) f(e);
    }
    return t;
  };
  const std::vector<Case> cases = {
      {"offsets past the end",
       layer_with([](StTensor& t) { t.raw_offsets = "[0, 999999999]"; }),
       {q, "999999999"}},
      {"offsets of 2^64-1",
       layer_with(
           [](StTensor& t) { t.raw_offsets = "[0, 18446744073709551615]"; }),
       {q}},
      {"end before begin",
       layer_with([](StTensor& t) { t.raw_offsets = "[64, 0]"; }),
       {q, "end before"}},
      {"negative offset",
       layer_with([](StTensor& t) { t.raw_offsets = "[-8, 2040]"; }),
       {q}},
      {"float offset",
       layer_with([](StTensor& t) { t.raw_offsets = "[0.5, 2048]"; }),
       {q}},
      {"three offsets",
       layer_with([](StTensor& t) { t.raw_offsets = "[0, 1, 2]"; }),
       {q, "data_offsets"}},
      {"size mismatch",  // 1024 bytes for a 2048-byte tensor.
       layer_with([](StTensor& t) { t.raw_offsets = "[128, 1152]"; }),
       {q, "bytes"}},
      {"unsupported dtype",
       layer_with([](StTensor& t) { t.dtype = "I8"; }),
       {q, "I8"}},
      {"unknown dtype",
       layer_with([](StTensor& t) { t.dtype = "Q9"; }),
       {q, "Q9"}},
      {"negative dim",
       layer_with([](StTensor& t) {
         t.raw_entry =
             R"({"dtype":"F32","shape":[-1,4],"data_offsets":[0,16]})";
       }),
       {q, "-1"}},
      {"absurd dim",
       layer_with([](StTensor& t) {
         t.raw_entry = R"({"dtype":"F32","shape":[1125899906842624],)"
                       R"("data_offsets":[0,16]})";
       }),
       {q}},
      {"overflowing shape",
       layer_with([](StTensor& t) {
         t.raw_entry = R"({"dtype":"F32","shape":[1099511627776,)"
                       R"(1099511627776],"data_offsets":[0,0]})";
       }),
       {q}},
      {"rank 9",
       layer_with([](StTensor& t) {
         t.raw_entry = R"({"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],)"
                       R"("data_offsets":[0,4]})";
       }),
       {q}},
      {"missing shape",
       layer_with([](StTensor& t) {
         t.raw_entry = R"({"dtype":"F32","data_offsets":[0,4]})";
       }),
       {q, "shape"}},
      {"missing dtype",
       layer_with([](StTensor& t) {
         t.raw_entry = R"({"shape":[1],"data_offsets":[0,4]})";
       }),
       {q, "dtype"}},
      {"missing offsets",
       layer_with(
           [](StTensor& t) { t.raw_entry = R"({"dtype":"F32","shape":[1]})"; }),
       {q, "data_offsets"}},
      {"overlapping tensors",
       layer_with([](StTensor& t) {
         // q_proj is 2048 bytes at [128, 2176), after the 128-byte
         // layernorm; move it onto the start of the data.
         t.raw_offsets = "[0, 2048]";
       }),
       {"overlaps"}},
      {"layer beyond num_hidden_layers",
       {{"model.layers.7.mlp.up_proj.weight", "F16", {kFfn, kHidden}}},
       {"model.layers.7.mlp.up_proj.weight", "num_hidden_layers"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ExpectSafetensorsError(SingleFileModel(SafetensorsBytes(c.tensors)),
                           c.needles);
  }
}

TEST(SafetensorsLoaderTest, SurvivesRandomHeaderCorruption) {
  const std::string good = SafetensorsBytes(LayerTensors(0));
  uint64_t header_len = 0;
  std::memcpy(&header_len, good.data(), 8);
  const std::string dir = SingleFileModel(good);
  std::mt19937_64 rng(5678);
  const std::string alphabet = "{}[]\",:0123456789-.eE \\xFI";
  for (int iter = 0; iter < 300; ++iter) {
    std::string bytes = good;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % (8 + header_len);
      bytes[pos] = rng() % 2 == 0 ? alphabet[rng() % alphabet.size()]
                                  : static_cast<char>(rng());
    }
    WriteFile(dir + "/model.safetensors", bytes);
    auto w = OpenSafetensorsWeights(dir);
    if (!w.ok()) continue;
    for (const TensorInfo& t : (*w)->tensors()) {
      ASSERT_LE(t.offset, bytes.size()) << "iteration " << iter;
      ASSERT_LE(t.bytes, bytes.size() - t.offset) << "iteration " << iter;
      ASSERT_EQ((*w)->Data(t).size(), t.bytes);
    }
  }
}

TEST(SafetensorsLoaderTest, RejectsDuplicateNames) {
  {  // Twice in one header (JSON parsers keep the last silently).
    std::vector<StTensor> t = LayerTensors(0);
    t.push_back(t[0]);
    ExpectSafetensorsError(SingleFileModel(SafetensorsBytes(t)),
                           {t[0].name, "twice"});
  }
  {  // In two files.
    const std::string dir = TestDir();
    WriteTinySafetensors(dir);
    WriteFile(dir + "/model-00003-of-00003.safetensors",
              SafetensorsBytes({{"model.norm.weight", "F32", {kHidden}}}));
    ExpectSafetensorsError(dir, {"model.norm.weight", "model-00002-of-00002",
                                 "model-00003-of-00003"});
  }
  {  // Two HF names for one canonical name is also a duplicate.
    std::vector<StTensor> t = {{"lm_head.weight", "F32", {kVocab, kHidden}},
                               {"output.weight", "F32", {kVocab, kHidden}}};
    ExpectSafetensorsError(SingleFileModel(SafetensorsBytes(t)),
                           {"output.weight"});
  }
}

}  // namespace
}  // namespace shardlm
