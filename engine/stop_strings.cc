#include "engine/stop_strings.h"

#include <algorithm>

namespace shardlm {

std::string StopStringFilter::Push(std::string_view text) {
  if (stopped_) return "";
  held_.append(text);
  // The earliest stop string wins. Text emitted earlier cannot hold the
  // start of a match: any tail that could begin one was held back.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    if (const size_t at = held_.find(s); at < first) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; --k) {
      if (std::string_view(held_).substr(held_.size() - k) ==
          std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopStringFilter::Finish() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace shardlm
