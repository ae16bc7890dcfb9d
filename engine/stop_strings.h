// Stop strings over streamed text (DESIGN.md section 6): the text is cut
// just before the first stop string, and no part of one is ever emitted.
#ifndef SHARDLM_ENGINE_STOP_STRINGS_H_
#define SHARDLM_ENGINE_STOP_STRINGS_H_

#include <string>
#include <string_view>
#include <vector>

namespace shardlm {

// Holds back the tail of the text that could still become a stop string
// until it either completes one (stopped(); the text before it was
// returned, everything after is dropped) or cannot any more (returned).
// The stream stops with the first piece after which the text contains a
// stop string, cut before the earliest one it then contains (so, as in
// vLLM and OpenAI, a short stop string completed by a piece wins over a
// longer one that began earlier but is not complete yet). Not thread-safe.
class StopStringFilter {
 public:
  // `stops` must be non-empty strings (the service validates them).
  explicit StopStringFilter(std::vector<std::string> stops)
      : stops_(std::move(stops)) {}

  // Appends the next piece of text; returns the text now known to come
  // before any stop string. After a stop string: always "".
  std::string Push(std::string_view text);
  // End of the stream: the held-back text ("" after a stop string).
  std::string Finish();
  bool stopped() const { return stopped_; }
  // The stop string that stopped the stream ("" until one did): of those
  // found at the earliest position, the first given.
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace shardlm

#endif  // SHARDLM_ENGINE_STOP_STRINGS_H_
