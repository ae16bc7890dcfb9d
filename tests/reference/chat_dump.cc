// Prints our rendering of chat conversations, for check_chat_template.py.
//
//   chat_dump --model PATH [--now UNIX_SECONDS] < conversations
//   chat_dump --template FILE --bos TEXT [--eos TEXT] [--chatml-vocab]
//             [--now S] < ...
//
// The template comes from the model's tokenizer, or from FILE (a Jinja
// source) with BOS and EOS texts (EOS default "</s>"). Each stdin line is a
// JSON array of {"role", "content"} messages (an assistant's may carry
// OpenAI "tool_calls", arguments as JSON text), or an object {"messages":
// [...], "tools": [OpenAI tools]}; each stdout line is {"prompt": text} or
// {"error": message}. The chosen format (Describe()) goes to stderr.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/time/time.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

int Usage() {
  std::fprintf(stderr,
               "usage: chat_dump --model PATH [--now S] < conversations\n"
               "       chat_dump --template FILE --bos TEXT [--chatml-vocab] "
               "[--now S] < conversations\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, template_file, bos, eos = "</s>";
  bool chatml_vocab = false;
  absl::Time now = absl::Now();
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--chatml-vocab") {
      chatml_vocab = true;
      continue;
    }
    if (i + 1 >= argc) return Usage();
    const std::string value = argv[++i];
    if (flag == "--model") {
      model = value;
    } else if (flag == "--template") {
      template_file = value;
    } else if (flag == "--bos") {
      bos = value;
    } else if (flag == "--eos") {
      eos = value;
    } else if (flag == "--now") {
      now = absl::FromUnixSeconds(std::stoll(value));
    } else {
      return Usage();
    }
  }
  absl::StatusOr<shardlm::ChatTemplate> chat =
      absl::InvalidArgumentError("no template");
  if (!model.empty()) {
    auto tok = shardlm::LoadTokenizer(model);
    if (!tok.ok()) {
      std::fprintf(stderr, "chat_dump: %s\n", tok.status().ToString().c_str());
      return 2;
    }
    chat = shardlm::ChatTemplate::ForModel(**tok, now);
  } else if (!template_file.empty()) {
    std::ifstream in(template_file, std::ios::binary);
    std::stringstream source;
    source << in.rdbuf();
    chat = shardlm::ChatTemplate::FromSource(source.str(), bos, eos,
                                             chatml_vocab, now);
  } else {
    return Usage();
  }
  if (!chat.ok()) {
    std::fprintf(stderr, "chat_dump: %s\n", chat.status().ToString().c_str());
    return 3;
  }
  std::fprintf(stderr, "chat_dump: format %s\n", chat->Describe().c_str());
  std::string line;
  while (std::getline(std::cin, line)) {
    // Ordered: tools and arguments render in their keys' order.
    const OrderedJson in =
        OrderedJson::parse(line, nullptr, /*allow_exceptions=*/false);
    const OrderedJson& list = in.is_object() ? in["messages"] : in;
    std::vector<shardlm::ChatMessage> messages;
    for (const OrderedJson& m : list) {
      shardlm::ChatMessage message{m.value("role", ""), m.value("content", "")};
      if (m.contains("tool_calls")) {
        for (const OrderedJson& c : m["tool_calls"]) {
          message.tool_calls.push_back(
              {.id = c.value("id", ""),
               .name = c["function"].value("name", ""),
               .arguments = c["function"].value("arguments", "")});
        }
      }
      messages.push_back(std::move(message));
    }
    std::vector<shardlm::ChatTool> tools;
    if (in.is_object() && in.contains("tools")) {
      for (const OrderedJson& t : in["tools"]) {
        const OrderedJson& f = t["function"];
        tools.push_back({.name = f.value("name", ""),
                         .description = f.value("description", ""),
                         .parameters = f.contains("parameters")
                                           ? f["parameters"].dump()
                                           : ""});
      }
    }
    shardlm::ChatTemplateVars vars;
    if (in.is_object() && in.contains("reasoning_effort")) {
      vars.reasoning_effort = in["reasoning_effort"].get<std::string>();
    }
    if (in.is_object() && in.contains("enable_thinking")) {
      vars.enable_thinking = in["enable_thinking"].get<bool>();
    }
    auto prompt = chat->Render(messages, tools, vars);
    const Json out =
        prompt.ok() ? Json{{"prompt", *prompt}}
                    : Json{{"error", std::string(prompt.status().message())}};
    std::cout << out.dump() << "\n";
  }
  return 0;
}
