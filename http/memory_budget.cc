#include "http/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace shardlm {
namespace {

// The first line of `path` as a byte count; 0 when absent or "max".
int64_t ReadLimitFile(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return 0;
  int64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &v) || v <= 0) {
    return 0;
  }
  return v;
}

}  // namespace

MemoryShare& MemoryShare::operator=(MemoryShare&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void MemoryShare::Release() {
  if (budget_ != nullptr && bytes_ > 0) budget_->Give(bytes_);
  budget_ = nullptr;
  bytes_ = 0;
}

void MemoryShare::ShrinkTo(int64_t bytes) {
  if (budget_ == nullptr || bytes >= bytes_) return;
  bytes = std::max<int64_t>(bytes, 0);
  budget_->Give(bytes_ - bytes);
  bytes_ = bytes;
}

MemoryBudget::MemoryBudget(int64_t limit_bytes, std::string flag)
    : limit_(std::max<int64_t>(limit_bytes, 1)), flag_(std::move(flag)) {}

absl::StatusOr<MemoryShare> MemoryBudget::Take(int64_t bytes,
                                               absl::string_view what,
                                               absl::Duration wait) {
  if (bytes <= 0) return MemoryShare();
  absl::MutexLock lock(&mu_);
  const auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_use_ + bytes <= limit_;
  };
  if (bytes <= limit_) {
    mu_.AwaitWithTimeout(absl::Condition(&fits), wait);
  }
  if (!fits()) {
    ++refused_;
    return absl::ResourceExhaustedError(
        absl::StrCat("the server's memory budget for requests is full: ", what,
                     " needs ", bytes, " bytes, ", limit_ - in_use_, " of ",
                     limit_, " are free (", flag_, "); retry later"));
  }
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  return MemoryShare(this, bytes);
}

void MemoryBudget::Give(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  in_use_ -= bytes;
}

int64_t MemoryBudget::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

int64_t MemoryBudget::peak() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

int64_t MemoryBudget::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

int64_t MemoryBudget::AvailableMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  int64_t total = pages > 0 && page > 0 ? int64_t{pages} * page : 0;
  for (const char* path : {"/sys/fs/cgroup/memory.max",
                           "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const int64_t cg = ReadLimitFile(path);
    // cgroup v1 reports "no limit" as a huge number; any value above the
    // machine's memory is no limit either.
    if (cg > 0 && (total == 0 || cg < total)) total = cg;
  }
  return total;
}

int64_t MemoryBudget::DefaultLimitBytes() {
  return std::clamp(AvailableMemoryBytes() / 8, kMinDefaultBytes,
                    kMaxDefaultBytes);
}

}  // namespace shardlm
