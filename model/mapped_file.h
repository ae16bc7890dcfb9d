// Read-only memory map of a whole file (RAII, move-only).
#ifndef SHARDLM_MODEL_MAPPED_FILE_H_
#define SHARDLM_MODEL_MAPPED_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardlm {

class MappedFile {
 public:
  // NotFound / PermissionDenied / Internal naming the path on failure.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path);
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::string& path() const { return path_; }
  absl::Span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace shardlm

#endif  // SHARDLM_MODEL_MAPPED_FILE_H_
