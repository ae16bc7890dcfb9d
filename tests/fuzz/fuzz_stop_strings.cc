// Stop-string filtering over a stream of text pieces: the first bytes
// choose the stop strings and how the rest is cut into pieces. What comes
// out is a prefix of what went in: all of it when no stop string occurs,
// else cut before the earliest stop string in the text seen when the
// filter stopped.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "engine/stop_strings.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardlm;
  if (size < 2) return 0;
  // Byte 0: number of stop strings (1..4); then each as (length, bytes).
  size_t at = 1;
  std::vector<std::string> stops;
  const int n = 1 + data[0] % 4;
  for (int i = 0; i < n && at < size; ++i) {
    const size_t len = 1 + data[at++] % 8;
    if (at + len > size) break;
    stops.emplace_back(reinterpret_cast<const char*>(data + at), len);
    at += len;
  }
  if (stops.empty()) return 0;
  const std::string text(reinterpret_cast<const char*>(data + at), size - at);
  StopStringFilter filter(stops);
  std::string out;
  // Pieces of 1..7 bytes, their lengths taken from the text itself.
  size_t consumed = 0;
  while (consumed < text.size() && !filter.stopped()) {
    const size_t len =
        std::min<size_t>(text.size() - consumed,
                         1 + static_cast<unsigned char>(text[consumed]) % 7);
    out += filter.Push(std::string_view(text).substr(consumed, len));
    consumed += len;
  }
  out += filter.Finish();
  // Cut before the earliest stop string in the text seen when it stopped.
  const std::string_view seen = std::string_view(text).substr(0, consumed);
  size_t earliest = std::string::npos;
  for (const std::string& s : stops)
    earliest = std::min(earliest, seen.find(s));
  if (text.compare(0, out.size(), out) != 0) std::abort();
  if (filter.stopped() != (earliest != std::string::npos)) std::abort();
  if (filter.stopped() ? out.size() != earliest : out != text) std::abort();
  return 0;
}
