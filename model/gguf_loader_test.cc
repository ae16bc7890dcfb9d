// Hostile-input tests for the GGUF reader (see loader_test_util.h).
#include <cmath>
#include <functional>

#include "model/loader_test_util.h"
#include "testing/status.h"

namespace shardlm {
namespace {

using testing_util::IsError;

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
// value as a string instead of a number; its keys under `arch` (the
// tensors stay Llama's), its block_count `layers` (the tensors stay
// kLayers').
GgufBuilder TinyGguf(std::string_view string_key = "",
                     const std::string& arch = "llama",
                     uint32_t layers = kLayers) {
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
    g.Str("general.architecture", arch);
  }
  g.Str("general.name", "tiny");
  const std::string p = arch + ".";
  u32(p + "block_count", layers);
  u32(p + "context_length", 128);
  u32(p + "embedding_length", kHidden);
  u32(p + "feed_forward_length", kFfn);
  u32(p + "attention.head_count", kHeads);
  u32(p + "attention.head_count_kv", kKvHeads);
  f32(p + "rope.freq_base", 100000.0f);
  f32(p + "attention.layer_norm_rms_epsilon", 1e-5f);
  u32(p + "vocab_size", kVocab);
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
    EXPECT_TRUE(IsError(g, absl::StatusCode::kInvalidArgument, "cut.gguf"))
        << "prefix of " << n << " bytes";
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
  {  // Unknown and unsupported tensor types: refused by number and name,
     // with the list of the types that are read.
    for (uint32_t t : {999u, 0xffffffffu}) {
      std::string bytes = good;
      PutU32(bytes, b.marks["ggml_type:" + name], t);
      ExpectGgufError(bytes, {name, absl::StrCat(t), "unknown", "Q4_K"});
    }
    for (const auto& [t, type_name] :
         std::vector<std::pair<uint32_t, std::string>>{
             {16, "IQ2_XXS"}, {19, "IQ1_S"}, {35, "TQ2_0"}, {40, "NVFP4"}}) {
      std::string bytes = good;
      PutU32(bytes, b.marks["ggml_type:" + name], t);
      ExpectGgufError(bytes, {name, absl::StrCat(t), type_name, "IQ4_XS"});
    }
  }
  {  // A K-quant whose rows (32 values) are not whole 256-value
     // super-blocks: a type that disagrees with the shape.
    std::string bytes = good;
    PutU32(bytes, b.marks["ggml_type:" + name], 12 /* Q4_K */);
    ExpectGgufError(bytes, {name, "Q4_K"});
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

// n f32 values start, start + 1, ... as tensor bytes.
std::string F32Values(int n, float start) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    const float v = start + static_cast<float>(i);
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  return out;
}

TEST(GgufLoaderTest, ReadsRopeScalingBiasesAndSlidingWindow) {
  GgufBuilder b = TinyGguf();
  b.Str("llama.rope.scaling.type", "yarn");
  b.F32("llama.rope.scaling.factor", 4.0f);
  b.U32("llama.rope.scaling.original_context_length", 64);
  b.U32("llama.attention.sliding_window", 20);
  b.Tensor("rope_freqs.weight", kGgmlF32, {kHeadDim / 2},
           F32Values(kHeadDim / 2, 1.0f));
  b.Tensor("blk.0.attn_q.bias", kGgmlF32, {kHeads * kHeadDim},
           F32Values(kHeads * kHeadDim, 0.0f));
  const std::string bytes = b.Build();
  auto g = ParseGguf(bytes);
  ASSERT_TRUE(g.ok()) << g.status();
  auto c = ModelConfigFromGguf(**g);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_EQ(c->rope_scaling.factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_context, 64);
  ASSERT_EQ(c->rope_scaling.freq_factors.size(), size_t{kHeadDim / 2});
  EXPECT_EQ(c->rope_scaling.freq_factors[1], 2.0f);
  EXPECT_EQ(c->sliding_window, 20);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->rope_style, RopeStyle::kAdjacentPairs);  // llama, permuted.
  EXPECT_THAT(c->DebugString(), HasSubstr("yarn (factor 4"));
}

// Gemma 2 as llama.cpp reads its GGUF: soft-caps 50 and 30 and a window
// of 4096 when the keys are missing, every other layer from the first
// windowed, the keys when present; the 27B's (46 layers) softmax scale
// from hidden / heads, not head_dim.
TEST(GgufLoaderTest, ReadsGemma2DefaultsAndKeys) {
  const auto config = [](GgufBuilder b) {
    const std::string bytes = b.Build();
    auto g = ParseGguf(bytes);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? ModelConfigFromGguf(**g)
                  : absl::StatusOr<ModelConfig>(g.status());
  };
  absl::StatusOr<ModelConfig> c = config(TinyGguf("", "gemma2"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attn_softcap, 50.0f);
  EXPECT_EQ(c->final_softcap, 30.0f);
  EXPECT_EQ(c->LayerWindow(0), 4096);
  EXPECT_EQ(c->LayerWindow(1), 0);
  EXPECT_TRUE(c->post_norms);
  EXPECT_EQ(c->ffn_activation, FfnActivation::kGeluTanh);
  EXPECT_FLOAT_EQ(c->embedding_scale, std::sqrt(static_cast<float>(kHidden)));
  EXPECT_EQ(c->attn_scale_factor, 1.0f);

  GgufBuilder keys = TinyGguf("", "gemma2");
  keys.F32("gemma2.attn_logit_softcapping", 20.0f);
  keys.F32("gemma2.final_logit_softcapping", 12.5f);
  keys.U32("gemma2.attention.sliding_window", 16);
  keys.U32("gemma2.attention.key_length", 2 * kHeadDim);
  keys.U32("gemma2.attention.value_length", 2 * kHeadDim);
  c = config(keys);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attn_softcap, 20.0f);
  EXPECT_EQ(c->final_softcap, 12.5f);
  EXPECT_EQ(c->LayerWindow(0), 16);
  EXPECT_EQ(c->head_dim, 2 * kHeadDim);
  EXPECT_EQ(c->attn_scale_factor, 1.0f);  // Not the 27B.

  GgufBuilder big = TinyGguf("", "gemma2", 46);
  big.U32("gemma2.attention.key_length", 2 * kHeadDim);
  big.U32("gemma2.attention.value_length", 2 * kHeadDim);
  c = config(big);
  ASSERT_TRUE(c.ok()) << c.status();
  // head_dim 2 x kHeadDim over hidden / heads = kHeadDim: sqrt(2).
  EXPECT_FLOAT_EQ(c->attn_scale_factor, std::sqrt(2.0f));
  EXPECT_EQ(c->LayerWindow(44), 4096);
  EXPECT_EQ(c->LayerWindow(45), 0);
}

TEST(GgufLoaderTest, RejectsRopeScalingItCannotApply) {
  struct Case {
    std::function<void(GgufBuilder&)> change;
    std::string needle;
  };
  for (const Case& c : std::vector<Case>{
           {[](GgufBuilder& b) {
              b.Str("llama.rope.scaling.type", "longrope");
            },
            "longrope"},
           {[](GgufBuilder& b) {
              // Not a llama.cpp type: its converter drops dynamic NTK.
              b.Str("llama.rope.scaling.type", "dynamic");
              b.F32("llama.rope.scaling.factor", 2.0f);
            },
            "'dynamic' is not supported"},
           {[](GgufBuilder& b) {
              b.Str("llama.rope.scaling.type", "linear");
              b.F32("llama.rope.scaling.factor", 0.25f);
            },
            "factor"},
           {[](GgufBuilder& b) {
              b.Str("llama.rope.scaling.type", "yarn");
              b.F32("llama.rope.scaling.factor", 4.0f);
            },
            "original_max_position_embeddings"},
           {[](GgufBuilder& b) {
              b.Str("llama.rope.scaling.type", "yarn");
              b.F32("llama.rope.scaling.factor", 4.0f);
              b.U32("llama.rope.scaling.original_context_length", 64);
              b.F32("llama.rope.scaling.yarn_attn_factor", 0.5f);
            },
            "yarn_attn_factor"},
           {[](GgufBuilder& b) {
              b.Tensor("rope_freqs.weight", kGgmlF32, {kHeadDim},
                       F32Values(kHeadDim, 1.0f));
            },
            "rope_freqs"},
           {[](GgufBuilder& b) {
              b.Tensor("rope_freqs.weight", kGgmlF32, {kHeadDim / 2},
                       F32Values(kHeadDim / 2, -1.0f));
            },
            "freq_factors"},
       }) {
    SCOPED_TRACE(c.needle);
    GgufBuilder b = TinyGguf();
    c.change(b);
    const std::string bytes = b.Build();
    auto g = ParseGguf(bytes);
    ASSERT_TRUE(g.ok()) << g.status();
    auto config = ModelConfigFromGguf(**g);
    ASSERT_FALSE(config.ok()) << "accepted";
    EXPECT_THAT(config.status().message(), HasSubstr(c.needle));
  }
}

TEST(GgufLoaderTest, RejectsAbsurdConfigValues) {
  for (auto [key, value, why] :
       std::vector<std::tuple<std::string, uint32_t, std::string>>{
           {"llama.block_count", 1'000'000'000,
            "n_layers = 1000000000 is outside [1, 1024]"},
           {"llama.attention.head_count", 3,  // Does not divide 32.
            "embedding_length 32 is not a multiple of head_count 3"},
           {"llama.attention.head_count_kv", 3,
            "n_heads (4) is not a multiple of n_kv_heads (3)"},
           {"llama.vocab_size", 0xffffffff,
            "vocab_size = 4294967295 is outside [1, 4194304]"}}) {
    GgufBuilder b = TinyGguf();
    std::string bytes = b.Build();
    PutU32(bytes, b.marks["value:" + key], value);
    auto g = ParseGguf(bytes);
    ASSERT_TRUE(g.ok()) << g.status();
    auto c = ModelConfigFromGguf(**g);
    EXPECT_TRUE(IsError(c, absl::StatusCode::kInvalidArgument, why))
        << key << " = " << value;
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

}  // namespace
}  // namespace shardlm
