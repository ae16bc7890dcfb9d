// The next-token distribution after every prefix of a token sequence, in
// one precision (kernels/precision.h), for bench/precision_bench.py:
//   precision_dump --model PATH --tokens-file IDS --out FILE
//                  [--precision exact|fast] [--threads N]
// IDS holds whitespace-separated token ids t_0 .. t_{n-1}; FILE gets n - 1
// rows of vocab float32 log-probabilities (row p: log_softmax of the
// logits after t_0 .. t_p, which predict t_{p+1}). Each prefix is one
// request; the prefix cache keeps the shared part from being recomputed.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "executor/local_engine.h"
#include "kernels/blas_cpu.h"
#include "kernels/precision.h"
#include "launch/flags.h"

namespace shardlm {
namespace {

int Main(int argc, char** argv) {
  std::string model, tokens_file, out_path, precision = "exact";
  int64_t threads = 0;
  FlagSet flags(
      "usage: precision_dump --model PATH --tokens-file IDS --out FILE "
      "[flags]");
  flags.Add("model", &model, "model path");
  flags.Add("tokens-file", &tokens_file, "whitespace-separated token ids");
  flags.Add("out", &out_path, "where the float32 log-probability rows go");
  flags.Add("precision", &precision, "exact or fast");
  flags.Add("threads", &threads, "CPU threads, 0 = what the process may use");
  const absl::Status parsed = flags.Parse(argc, argv, 1);
  const absl::StatusOr<Precision> p = ParsePrecision(precision);
  if (absl::Status s = parsed; !s.ok() || !p.ok() || model.empty() ||
                               tokens_file.empty() || out_path.empty()) {
    std::fprintf(stderr, "%s%s\n%s", std::string(s.message()).c_str(),
                 p.ok() ? "" : std::string(p.status().message()).c_str(),
                 flags.Usage().c_str());
    return 2;
  }
  std::vector<int32_t> ids;
  std::ifstream in(tokens_file);
  for (int32_t id; in >> id;) ids.push_back(id);
  if (ids.size() < 2) {
    std::fprintf(stderr, "precision_dump: %s holds fewer than 2 ids\n",
                 tokens_file.c_str());
    return 2;
  }
  auto source = OpenWeights(model);
  if (!source.ok()) {
    std::fprintf(stderr, "precision_dump: %s\n",
                 std::string(source.status().message()).c_str());
    return 1;
  }
  auto engine = CreateLocalEngine(
      **source, {.threads = static_cast<int>(threads), .precision = *p});
  if (!engine.ok()) {
    std::fprintf(stderr, "precision_dump: %s\n",
                 std::string(engine.status().message()).c_str());
    return 1;
  }
  std::FILE* out = std::fopen(out_path.c_str(), "wb");
  if (out == nullptr) {
    std::fprintf(stderr, "precision_dump: cannot write %s\n", out_path.c_str());
    return 1;
  }
  std::vector<float> row;
  for (size_t n = 1; n < ids.size(); ++n) {
    auto r = (*engine)->Generate(
        {.prompt = std::vector<int32_t>(ids.begin(), ids.begin() + n),
         .max_tokens = 1,
         .return_prompt_logits = true});
    if (!r.ok()) {
      std::fprintf(stderr, "precision_dump: prefix %zu: %s\n", n,
                   std::string(r.status().message()).c_str());
      std::fclose(out);
      return 1;
    }
    const std::vector<float>& l = r->prompt_logits;
    double mx = -INFINITY, sum = 0;
    for (float v : l) mx = std::max(mx, double{v});
    for (float v : l) sum += std::exp(v - mx);
    const double lse = mx + std::log(sum);
    row.resize(l.size());
    for (size_t i = 0; i < l.size(); ++i)
      row[i] = static_cast<float>(l[i] - lse);
    std::fwrite(row.data(), sizeof(float), row.size(), out);
  }
  std::fclose(out);
  return 0;
}

}  // namespace
}  // namespace shardlm

int main(int argc, char** argv) {
  shardlm::RerunWithBetterBlasCoreType(argv);
  return shardlm::Main(argc, argv);
}
