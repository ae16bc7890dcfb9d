// Hostile-input tests for the safetensors reader (see loader_test_util.h).
#include <cmath>

#include "model/loader_test_util.h"

namespace shardlm {
namespace {

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

TEST(SafetensorsLoaderTest, ReadsFamilyFeatures) {
  const std::string dir = TestDir();
  const auto open = [&](const std::map<std::string, std::string>& changes) {
    auto config = TinyConfig();
    for (const auto& [k, v] : changes) config[k] = v;
    WriteTinySafetensors(dir, config);
    return OpenSafetensorsWeights(dir);
  };
  {
    auto w = open(
        {{"rope_scaling", R"({"rope_type":"llama3","factor":8.0,)"
                          R"("low_freq_factor":1.0,"high_freq_factor":4.0,)"
                          R"("original_max_position_embeddings":8192})"}});
    ASSERT_TRUE(w.ok()) << w.status();
    const RopeScaling& s = (*w)->config().rope_scaling;
    EXPECT_EQ(s.type, RopeScalingType::kLlama3);
    EXPECT_EQ(s.factor, 8.0);
    EXPECT_EQ(s.high_freq_factor, 4.0);
    EXPECT_EQ(s.original_context, 8192);
    EXPECT_FALSE((*w)->config().attention_bias);
  }
  {
    // YaRN's original context defaults to max_position_embeddings.
    auto w = open({{"rope_scaling", R"({"type":"yarn","factor":4.0})"},
                   {"max_position_embeddings", "4096"}});
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->config().rope_scaling.type, RopeScalingType::kYarn);
    EXPECT_EQ((*w)->config().rope_scaling.original_context, 4096);
  }
  for (const char* key : {"type", "rope_type"}) {
    // Dynamic NTK: scaled against max_position_embeddings, served to
    // factor times it.
    auto w = open({{"rope_scaling",
                    absl::StrCat(R"({")", key, R"(":"dynamic","factor":2.5})")},
                   {"max_position_embeddings", "4097"}});
    ASSERT_TRUE(w.ok()) << w.status();
    const ModelConfig& c = (*w)->config();
    EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kDynamic);
    EXPECT_EQ(c.rope_scaling.factor, 2.5);
    EXPECT_EQ(c.rope_scaling.original_context, 4097);
    EXPECT_EQ(c.context_length, 10242);  // floor(2.5 x 4097)
    EXPECT_THAT(c.DebugString(), HasSubstr("dynamic NTK, static"));
  }
  {
    auto w = open({{"model_type", R"("qwen2")"},
                   {"sliding_window", "4096"},
                   {"use_sliding_window", "false"}});
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->config().architecture, "qwen2");
    EXPECT_TRUE((*w)->config().attention_bias);
    EXPECT_EQ((*w)->config().sliding_window, 0);  // Not used by Qwen2.
  }
  // Qwen2's window as transformers' Qwen2Config reads it (kLayers = 2).
  struct Qwen2Case {
    std::map<std::string, std::string> keys;
    int64_t window;               // ModelConfig::sliding_window.
    std::vector<int64_t> layers;  // LayerWindow per layer.
  };
  for (const Qwen2Case& q : std::vector<Qwen2Case>{
           // max_window_layers defaults to 28: no layer of 2 slides.
           {{{"use_sliding_window", "true"}}, 0, {0, 0}},
           // sliding_window defaults to 4096 (absent, not null).
           {{{"use_sliding_window", "true"}, {"max_window_layers", "1"}},
            4096,
            {0, 4096}},
           {{{"use_sliding_window", "true"},
             {"sliding_window", "null"},
             {"max_window_layers", "0"}},
            0,
            {0, 0}},
           {{{"use_sliding_window", "true"},
             {"sliding_window", "64"},
             {"max_window_layers", "0"}},
            64,
            {64, 64}},
           // layer_types wins over max_window_layers.
           {{{"use_sliding_window", "true"},
             {"sliding_window", "64"},
             {"max_window_layers", "1"},
             {"layer_types", R"(["sliding_attention", "full_attention"])"}},
            64,
            {64, 0}},
           {{{"use_sliding_window", "false"},
             {"sliding_window", "64"},
             {"max_window_layers", "0"},
             {"layer_types", R"(["full_attention", "full_attention"])"}},
            0,
            {0, 0}},
       }) {
    auto keys = q.keys;
    keys["model_type"] = R"("qwen2")";
    SCOPED_TRACE(absl::StrJoin(keys, ", ", absl::PairFormatter("=")));
    auto w = open(keys);
    ASSERT_TRUE(w.ok()) << w.status();
    const ModelConfig& c = (*w)->config();
    EXPECT_EQ(c.sliding_window, q.window);
    for (int64_t l = 0; l < kLayers; ++l) {
      EXPECT_EQ(c.LayerWindow(l), q.layers[l]) << "layer " << l;
    }
    if (q.layers[0] != q.layers[1]) {
      EXPECT_THAT(c.DebugString(), HasSubstr("(the others attend to all)"));
    }
  }
  for (const auto& [keys, needle] :
       std::vector<std::pair<std::map<std::string, std::string>, std::string>>{
           {{{"layer_types", R"(["sliding_attention", "full_attention"])"}},
            "no window"},
           {{{"use_sliding_window", "true"},
             {"layer_types", R"(["full_attention"])"}},
            "one type for each"},
           {{{"use_sliding_window", "true"},
             {"layer_types", R"(["chunked_attention", "full_attention"])"}},
            "chunked_attention"},
           {{{"use_sliding_window", "true"}, {"sliding_window", "0"}},
            "sliding_window"},
           {{{"use_sliding_window", "1"}}, "use_sliding_window"},
       }) {
    auto all = keys;
    all["model_type"] = R"("qwen2")";
    SCOPED_TRACE(needle);
    auto w = open(all);
    ASSERT_FALSE(w.ok());
    EXPECT_THAT(w.status().message(), HasSubstr(needle));
  }
  {
    auto w = open({{"rope_scaling", R"({"type":"dynamic","factor":1e4})"},
                   {"max_position_embeddings", "4096"}});
    ASSERT_FALSE(w.ok());
    EXPECT_THAT(w.status().message(), HasSubstr("beyond 2^24"));
  }
  for (const auto& [window, want] :
       {std::pair<std::string, int64_t>{"4096", 4096}, {"null", 0}}) {
    auto w = open({{"model_type", R"("mistral")"}, {"sliding_window", window}});
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->config().sliding_window, want);
  }
}

// A tiny Gemma folder: TinyConfig() without hidden_act and
// tie_word_embeddings (Gemma's defaults hold), query_pre_attn_scalar 32, a
// window of 16, then `family`'s keys, then `changes` (an empty value
// removes the key).
absl::StatusOr<std::unique_ptr<WeightSource>> OpenGemma(
    const std::string& dir, const std::map<std::string, std::string>& family,
    const std::map<std::string, std::string>& changes) {
  auto config = TinyConfig();
  config.erase("hidden_act");
  config.erase("tie_word_embeddings");
  config["query_pre_attn_scalar"] = "32";
  config["sliding_window"] = "16";
  for (const auto* keys : {&family, &changes}) {
    for (const auto& [k, v] : *keys) {
      if (v.empty()) {
        config.erase(k);
      } else {
        config[k] = v;
      }
    }
  }
  WriteTinySafetensors(dir, config);
  return OpenSafetensorsWeights(dir);
}

// Gemma 3's text model as transformers' Gemma3TextConfig reads it, in the
// published configs' keys and in transformers 5's rope_parameters.
TEST(SafetensorsLoaderTest, ReadsGemma3) {
  const std::string dir = TestDir();
  const auto open = [&](const std::map<std::string, std::string>& changes) {
    return OpenGemma(
        dir,
        {{"model_type", R"("gemma3_text")"},
         {"architectures", R"(["Gemma3ForCausalLM"])"},
         {"hidden_activation", R"("gelu_pytorch_tanh")"},
         {"layer_types", R"(["sliding_attention", "full_attention"])"}},
        changes);
  };
  for (const bool v5 : {false, true}) {
    SCOPED_TRACE(v5 ? "rope_parameters" : "rope_theta, rope_local_base_freq");
    auto w = v5 ? open({{"rope_theta", ""},
                        {"rope_parameters",
                         R"({"full_attention": {"rope_type": "linear",)"
                         R"( "factor": 8.0, "rope_theta": 1000000.0},)"
                         R"( "sliding_attention": {"rope_type": "default",)"
                         R"( "rope_theta": 10000.0}})"}})
                : open({{"rope_theta", "1000000.0"},
                        {"rope_local_base_freq", "10000.0"},
                        {"rope_scaling",
                         R"({"rope_type": "linear", "factor": 8.0})"}});
    ASSERT_TRUE(w.ok()) << w.status();
    const ModelConfig& c = (*w)->config();
    EXPECT_EQ(c.rope_theta, 1e6f);
    EXPECT_EQ(c.rope_local_theta, 1e4f);
    EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLinear);
    EXPECT_EQ(c.rope_scaling.factor, 8.0);
    EXPECT_EQ(c.LayerWindow(0), 16);
    EXPECT_EQ(c.LayerWindow(1), 0);
    EXPECT_TRUE(c.LayerRopeIsLocal(0));
    EXPECT_FALSE(c.LayerRopeIsLocal(1));
    EXPECT_FLOAT_EQ(c.attn_scale_factor, std::sqrt(8.0f / 32.0f));
    EXPECT_FLOAT_EQ(c.embedding_scale, std::sqrt(32.0f));
    EXPECT_EQ(c.ffn_activation, FfnActivation::kGeluTanh);
    EXPECT_TRUE(c.qk_norm && c.post_norms && c.tied_embeddings);
    EXPECT_EQ(c.norm_weight_offset, 1.0f);
    EXPECT_EQ(c.rope_style, RopeStyle::kRotateHalf);
    // Gemma's post_attention_layernorm is the norm after attention.
    EXPECT_NE((*w)->Find("blk.0.post_attention_norm.weight"), nullptr);
    EXPECT_EQ((*w)->Find("blk.0.ffn_norm.weight"), nullptr);
  }
  {
    // As transformers 5 assembles them: a top-level rope_scaling over the
    // full layers' entry, the local base from rope_local_base_freq when
    // the sliding entry is missing.
    auto w = open(
        {{"rope_theta", "500000.0"},
         {"rope_local_base_freq", "20000.0"},
         {"rope_scaling", R"({"rope_type": "linear", "factor": 4.0})"},
         {"rope_parameters", R"({"full_attention": {"rope_type": "linear",)"
                             R"( "factor": 8.0}})"}});
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->config().rope_scaling.factor, 4.0);
    EXPECT_EQ((*w)->config().rope_theta, 5e5f);
    EXPECT_EQ((*w)->config().rope_local_theta, 2e4f);
  }
  {
    // Without layer_types: every sixth layer full (both of two slide).
    auto w = open({{"layer_types", ""}});
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->config().LayerWindow(1), 16);
  }
  struct Refused {
    std::map<std::string, std::string> changes;
    std::string needle;
  };
  for (const Refused& r : std::vector<Refused>{
           {{{"model_type", R"("gemma3")"}}, "Gemma3ForCausalLM"},
           {{{"final_logit_softcapping", "30.0"}}, "Gemma 2's, not Gemma 3's"},
           {{{"attn_logit_softcapping", "50.0"}}, "attn_logit_softcapping"},
           {{{"hidden_activation", R"("gelu")"}}, "hidden_activation"},
           {{{"use_bidirectional_attention", "true"}},
            "use_bidirectional_attention"},
           {{{"layer_types", R"(["sliding_attention", "chunked"])"}},
            "layer_types"},
           {{{"query_pre_attn_scalar", "0"}}, "query_pre_attn_scalar"},
           {{{"rope_parameters",
              R"({"full_attention": {"rope_type": "default"},)"
              R"( "sliding_attention": {"rope_type": "linear",)"
              R"( "factor": 2.0}})"}},
            "sliding layers"},
           {{{"rope_parameters", R"({"full_attention": 3})"}},
            "'full_attention' is not an object"},
           {{{"rope_local_base_freq", "-1"}}, "rope_local_base_freq"},
       }) {
    SCOPED_TRACE(r.needle);
    auto w = open(r.changes);
    ASSERT_FALSE(w.ok());
    EXPECT_THAT(w.status().message(), HasSubstr(r.needle));
  }
}

// Gemma 2 as transformers' Gemma2Config reads it: every other layer
// slides from the first, soft-capping at 50 / 30 unless a key says
// otherwise (null: none), one RoPE, no QK norms.
TEST(SafetensorsLoaderTest, ReadsGemma2) {
  const std::string dir = TestDir();
  const auto open = [&](const std::map<std::string, std::string>& changes) {
    return OpenGemma(dir,
                     {{"model_type", R"("gemma2")"},
                      {"architectures", R"(["Gemma2ForCausalLM"])"}},
                     changes);
  };
  {
    auto w = open({});
    ASSERT_TRUE(w.ok()) << w.status();
    const ModelConfig& c = (*w)->config();
    EXPECT_EQ(c.attn_softcap, 50.0f);
    EXPECT_EQ(c.final_softcap, 30.0f);
    EXPECT_EQ(c.LayerWindow(0), 16);
    EXPECT_EQ(c.LayerWindow(1), 0);
    EXPECT_EQ(c.rope_local_theta, 0.0f);
    EXPECT_FALSE(c.LayerRopeIsLocal(0));
    EXPECT_FALSE(c.qk_norm);
    EXPECT_TRUE(c.post_norms && c.tied_embeddings);
    EXPECT_EQ(c.ffn_activation, FfnActivation::kGeluTanh);
    EXPECT_FLOAT_EQ(c.attn_scale_factor, std::sqrt(8.0f / 32.0f));
    EXPECT_EQ(c.norm_weight_offset, 1.0f);
    // Gemma's post_attention_layernorm is the norm after attention.
    EXPECT_NE((*w)->Find("blk.0.post_attention_norm.weight"), nullptr);
    EXPECT_EQ((*w)->Find("blk.0.ffn_norm.weight"), nullptr);
  }
  {
    auto w =
        open({{"attn_logit_softcapping", "null"},
              {"final_logit_softcapping", "12.5"},
              {"layer_types", R"(["full_attention", "sliding_attention"])"},
              {"rope_theta", ""},
              {"rope_parameters",
               R"({"rope_type": "default", "rope_theta": 20000.0})"}});
    ASSERT_TRUE(w.ok()) << w.status();
    const ModelConfig& c = (*w)->config();
    EXPECT_EQ(c.attn_softcap, 0.0f);
    EXPECT_EQ(c.final_softcap, 12.5f);
    EXPECT_EQ(c.LayerWindow(0), 0);
    EXPECT_EQ(c.LayerWindow(1), 16);
    EXPECT_EQ(c.rope_theta, 2e4f);
    EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
  }
  for (const auto& [changes, needle] :
       std::vector<std::pair<std::map<std::string, std::string>, std::string>>{
           {{{"attn_logit_softcapping", "-1"}}, "attn_logit_softcapping"},
           {{{"final_logit_softcapping", R"("30")"}},
            "final_logit_softcapping"},
           {{{"hidden_activation", R"("gelu")"}}, "hidden_activation"},
           {{{"rope_parameters", "3"}}, "rope_parameters"},
       }) {
    SCOPED_TRACE(needle);
    auto w = open(changes);
    ASSERT_FALSE(w.ok());
    EXPECT_THAT(w.status().message(), HasSubstr(needle));
  }
}

// gpt-oss as transformers' GptOssConfig reads it, with its folders'
// tensor names: MXFP4 experts (u8 _blocks and _scales, kept as raw bytes
// for worker/gpt_oss_experts.cc), the router, sinks, the output bias.
TEST(SafetensorsLoaderTest, ReadsGptOss) {
  const std::string dir = TestDir();
  const auto write = [&](const std::map<std::string, std::string>& changes) {
    auto config = TinyConfig();
    config["model_type"] = R"("gpt_oss")";
    config["architectures"] = R"(["GptOssForCausalLM"])";
    config["num_local_experts"] = "4";
    config["num_experts_per_tok"] = "2";
    config["sliding_window"] = "16";
    config["attention_bias"] = "true";
    config["rope_scaling"] =
        R"({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,)"
        R"( "beta_slow": 1.0, "truncate": false,)"
        R"( "original_max_position_embeddings": 64})";
    config["quantization_config"] = R"({"quant_method": "mxfp4"})";
    for (const auto& [k, v] : changes) {
      if (v.empty()) {
        config.erase(k);
      } else {
        config[k] = v;
      }
    }
    WriteFile(dir + "/config.json", ConfigJson(config));
    const std::string e = "model.layers.0.mlp.experts.";
    WriteFile(dir + "/model.safetensors",
              SafetensorsBytes({
                  {"model.layers.0.self_attn.sinks", "F32", {kHeads}},
                  {"model.layers.0.self_attn.o_proj.bias", "F32", {kHidden}},
                  {"model.layers.0.mlp.router.weight", "F32", {4, kHidden}},
                  {"model.layers.0.mlp.router.bias", "F32", {4}},
                  {e + "gate_up_proj_blocks", "U8", {4, 2 * kFfn, 1, 16}},
                  {e + "gate_up_proj_scales", "U8", {4, 2 * kFfn, 1}},
                  {e + "gate_up_proj_bias", "F32", {4, 2 * kFfn}},
                  {e + "down_proj", "BF16", {4, kFfn, kHidden}},
              }));
  };
  write({});
  auto w = OpenSafetensorsWeights(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelConfig& c = (*w)->config();
  EXPECT_EQ(c.n_experts, 4);
  EXPECT_EQ(c.n_experts_used, 2);
  EXPECT_EQ(c.expert_ffn_hidden, kFfn);
  EXPECT_TRUE(c.attention_bias && c.output_bias && c.attention_sinks &&
              c.expert_biases);
  EXPECT_EQ(c.ffn_activation, FfnActivation::kSwigluOai);
  EXPECT_EQ(c.LayerWindow(0), 16);  // Even layers slide by default.
  EXPECT_EQ(c.LayerWindow(1), 0);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_FALSE(c.rope_scaling.truncate);
  for (const auto& [name, dtype] : std::vector<std::pair<std::string, DType>>{
           {"blk.0.attn_sinks.weight", DType::kF32},
           {"blk.0.attn_output.bias", DType::kF32},
           {"blk.0.ffn_gate_inp.weight", DType::kF32},
           {"blk.0.ffn_gate_inp.bias", DType::kF32},
           {"blk.0.ffn_gate_up_exps.blocks", DType::kI8},
           {"blk.0.ffn_gate_up_exps.scales", DType::kI8},
           {"blk.0.ffn_gate_up_exps.bias", DType::kF32},
           {"blk.0.ffn_down_exps.weight_t", DType::kBF16}}) {
    const TensorInfo* t = (*w)->Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, dtype) << name;
  }

  write({{"layer_types", R"(["full_attention", "sliding_attention"])"}});
  w = OpenSafetensorsWeights(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->config().LayerWindow(0), 0);
  EXPECT_EQ((*w)->config().LayerWindow(1), 16);

  write({{"swiglu_limit", "5.0"}});
  ExpectSafetensorsError(dir, {"swiglu_limit", "7"});
  write({{"attention_bias", "false"}});
  ExpectSafetensorsError(dir, {"attention_bias"});
  // MXFP4 is gpt-oss's only.
  write({{"model_type", R"("llama")"},
         {"architectures", R"(["LlamaForCausalLM"])"}});
  ExpectSafetensorsError(dir, {"quant_method", "mxfp4"});
}

// Qwen3.5 as it ships (Qwen3_5ForConditionalGeneration): the language
// model's config is text_config; layer 0 a Gated DeltaNet layer, layer 1
// gated attention.
TEST(SafetensorsLoaderTest, ReadsQwen35) {
  const std::string dir = TestDir();
  const auto write = [&](const std::map<std::string, std::string>& changes,
                         bool nested = true) {
    auto text = TinyConfig();
    text.erase("architectures");
    text.erase("rope_theta");
    text["model_type"] = R"("qwen3_5_text")";
    text["head_dim"] = absl::StrCat(kHeadDim);
    text["layer_types"] = R"(["linear_attention", "full_attention"])";
    text["linear_conv_kernel_dim"] = "4";
    text["linear_num_key_heads"] = "2";
    text["linear_num_value_heads"] = "4";
    text["linear_key_head_dim"] = "8";
    text["linear_value_head_dim"] = "8";
    text["rope_parameters"] =
        R"({"rope_type": "default", "rope_theta": 10000000.0,)"
        R"( "partial_rotary_factor": 0.25, "mrope_section": [1, 0, 0],)"
        R"( "mrope_interleaved": true})";
    for (const auto& [k, v] : changes) {
      if (v.empty()) {
        text.erase(k);
      } else {
        text[k] = v;
      }
    }
    WriteFile(dir + "/config.json",
              nested ? ConfigJson({{"architectures",
                                    R"(["Qwen3_5ForConditionalGeneration"])"},
                                   {"model_type", R"("qwen3_5")"},
                                   {"text_config", ConfigJson(text)}})
                     : ConfigJson(text));
    WriteFile(dir + "/model.safetensors",
              SafetensorsBytes(
                  {{"model.language_model.norm.weight", "F32", {kHidden}}}));
  };
  write({});
  auto w = OpenSafetensorsWeights(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelConfig& c = (*w)->config();
  EXPECT_EQ(c.architecture, "qwen3_5_text");
  EXPECT_EQ(c.linear_layers, (std::vector<bool>{true, false}));
  EXPECT_EQ(c.ssm_k_heads, 2);
  EXPECT_EQ(c.ssm_v_heads, 4);
  EXPECT_FALSE(c.ssm_v_tiled);  // Hugging Face's grouped order.
  EXPECT_TRUE(c.attention_gate && c.qk_norm);
  EXPECT_EQ(c.rope_dims, 2);  // A quarter of head_dim 8.
  EXPECT_FLOAT_EQ(c.rope_theta, 1e7f);
  EXPECT_EQ(c.norm_weight_offset, 1.0f);

  // Qwen3_5ForCausalLM's flat form reads the same.
  write({}, /*nested=*/false);
  w = OpenSafetensorsWeights(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->config().linear_layers, (std::vector<bool>{true, false}));

  write({{"layer_types", ""}});  // Every 4th attends: layers 0 and 1 don't.
  w = OpenSafetensorsWeights(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->config().linear_layers, (std::vector<bool>{true, true}));

  write({{"layer_types", R"(["linear_attention", "mamba"])"}});
  ExpectSafetensorsError(dir, {"text_config", "layer_types", "[1]"});
  write({{"linear_num_value_heads", "3"}});
  ExpectSafetensorsError(dir, {"ssm_v_heads (3)", "ssm_k_heads (2)"});
  WriteFile(dir + "/config.json", ConfigJson({{"model_type", R"("qwen3_5")"}}));
  ExpectSafetensorsError(dir, {"qwen3_5", "text_config"});
}

TEST(SafetensorsLoaderTest, RejectsBadConfig) {
  struct Case {
    std::string key;
    std::optional<std::string> value;  // nullopt: remove the key.
    std::string needle;
  };
  for (
      const Case& c : std::vector<Case>{
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
          {"rope_scaling", R"({"type":"dynamic"})", "factor"},
          {"rope_scaling", R"({"rope_type":"longrope"})", "longrope"},
          {"rope_scaling", R"({"type":"linear"})", "factor"},
          {"rope_scaling", R"({"type":"linear","factor":0.5})", "factor"},
          {"rope_scaling", R"({"rope_type":"llama3","factor":8.0})",
           "original_max_position_embeddings"},
          {"rope_scaling",
           R"({"rope_type":"llama3","factor":8.0,"low_freq_factor":4.0,)"
           R"("high_freq_factor":1.0,"original_max_position_embeddings":8192})",
           "high_freq_factor"},
          {"rope_scaling", R"({"rope_type":"yarn","factor":4.0,"mscale":1})",
           "mscale"},
          {"rope_scaling", "[1]", "rope_scaling"},
          {"sliding_window", "-1", "sliding_window"},
          {"sliding_window", R"("4096")", "sliding_window"},
          {"hidden_act", R"("gelu")", "hidden_act"},
          {"attention_bias", "true", "attention_bias"},
          {"tie_word_embeddings", "1", "tie_word_embeddings"},
          {"eos_token_id", "4294967296", "eos_token_id"},
          {"quantization_config", R"({"quant_method":"gptq","bits":4})",
           "'gptq'; only 'fp8'"},
          {"quantization_config",
           R"({"quant_method":"fp8","weight_block_size":[128,64]})",
           "weight_block_size"},
          {"quantization_config", R"({"quant_method":"fp8"})",
           "weight_block_size"},
          {"quantization_config",
           R"({"quant_method":"fp8","fmt":"e5m2","weight_block_size":[128,128]})",
           "e4m3"},
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

// A multi-token-prediction layer after the model's (DeepSeek V3 and
// GLM-4.5 checkpoints carry one) is skipped when the config counts it, and
// refused as beyond num_hidden_layers when it does not.
TEST(SafetensorsLoaderTest, SkipsMultiTokenPredictionLayers) {
  for (const bool counted : {true, false}) {
    SCOPED_TRACE(counted ? "counted" : "not counted");
    const std::string dir = TestDir();
    std::map<std::string, std::string> config = TinyConfig();
    if (counted) config["num_nextn_predict_layers"] = "1";
    WriteTinySafetensors(dir, config);
    WriteFile(dir + "/mtp.safetensors",
              SafetensorsBytes(LayerTensors(kLayers)));
    auto w = OpenSafetensorsWeights(dir);
    if (!counted) {
      EXPECT_FALSE(w.ok());
      EXPECT_THAT(w.status().message(), HasSubstr("num_hidden_layers"));
      continue;
    }
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->config().n_layers, kLayers);
    EXPECT_EQ((*w)->config().n_nextn_layers, 1);
    EXPECT_NE((*w)->Find(absl::StrCat("blk.", kLayers - 1, ".ffn_up.weight")),
              nullptr);
    EXPECT_EQ((*w)->Find(absl::StrCat("blk.", kLayers, ".ffn_up.weight")),
              nullptr);
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
