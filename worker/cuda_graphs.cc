#include "worker/cuda_graphs.h"

#include <cassert>
#include <utility>

namespace shardlm {
namespace {

// The table of every padding sequence: block 0, which every pool has.
constexpr int32_t kPaddingTable[] = {0};

}  // namespace

int64_t GraphBatchSize(int64_t n) {
  if (n < 1 || n > kMaxGraphBatch) return 0;
  if (n <= 8) {
    int64_t size = 1;
    while (size < n) size *= 2;
    return size;
  }
  return (n + 7) / 8 * 8;
}

bool IsDecodeStep(const StepInput& step) {
  const size_t n = step.tokens.size();
  if (n == 0 || step.block_tables.size() != n || step.positions.size() != n ||
      step.token_seq.size() != n || step.logit_rows.size() != n) {
    return false;
  }
  for (size_t i = 0; i < n; ++i) {
    if (step.token_seq[i] != static_cast<int32_t>(i) ||
        step.logit_rows[i] != static_cast<int32_t>(i)) {
      return false;
    }
  }
  return true;
}

PaddedDecode PadDecodeStep(const StepInput& step, int64_t size) {
  const int64_t n = static_cast<int64_t>(step.tokens.size());
  assert(IsDecodeStep(step) && size >= n);
  PaddedDecode p;
  p.padding = size - n;
  p.tokens = step.tokens;
  p.positions = step.positions;
  p.tokens.resize(size, 0);
  p.positions.resize(size, 0);
  p.token_seq.resize(size);
  p.logit_rows.resize(size);
  for (int64_t i = 0; i < size; ++i) {
    p.token_seq[i] = static_cast<int32_t>(i);
    p.logit_rows[i] = static_cast<int32_t>(i);
  }
  p.block_tables.reserve(size);
  for (const auto& table : step.block_tables) p.block_tables.push_back(table);
  p.block_tables.resize(size, absl::MakeConstSpan(kPaddingTable));
  return p;
}

GraphCache::GraphCache(size_t capacity, int max_failures,
                       std::function<void(void*)> destroy)
    : capacity_(capacity < 1 ? 1 : capacity),
      max_failures_(max_failures),
      destroy_(std::move(destroy)) {}

GraphCache::~GraphCache() { Clear(); }

void* GraphCache::Find(const Key& key) {
  const auto it = graphs_.find(key);
  if (it == graphs_.end()) return nullptr;
  uses_.splice(uses_.begin(), uses_, it->second.use);
  return it->second.graph;
}

void GraphCache::Insert(const Key& key, void* graph) {
  assert(graph != nullptr && graphs_.count(key) == 0);
  if (graphs_.size() >= capacity_) {
    const auto oldest = graphs_.find(uses_.back());
    destroy_(oldest->second.graph);
    graphs_.erase(oldest);
    uses_.pop_back();
    ++evictions_;
  }
  uses_.push_front(key);
  graphs_.emplace(key, Entry{graph, uses_.begin()});
}

void GraphCache::Clear() {
  for (auto& [key, entry] : graphs_) destroy_(entry.graph);
  graphs_.clear();
  uses_.clear();
}

void GraphCache::MarkFailed(const Key& key) { failed_.insert(key); }

}  // namespace shardlm
