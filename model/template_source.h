// Reading a chat template's Jinja source: the pieces the template parsers
// (chat_template.cc, chat_deepseek.cc) share.
#ifndef SHARDLM_MODEL_TEMPLATE_SOURCE_H_
#define SHARDLM_MODEL_TEMPLATE_SOURCE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm {

// The string literal starting at source[*pos] (its opening quote),
// decoded (\n, \t, \r and escaped characters as themselves); *pos ends past
// its closing quote, or at the end of an unterminated one.
std::string ReadTemplateLiteral(std::string_view source, size_t* pos);

// Over a template's string literals (ReadTemplateLiteral's): whether one
// of them is exactly `what`, and whether one contains it.
bool HasLiteral(const std::vector<std::string>& literals,
                std::string_view what);
bool LiteralWrites(const std::vector<std::string>& literals,
                   std::string_view what);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_TEMPLATE_SOURCE_H_
