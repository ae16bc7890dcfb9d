// DeepSeek's chat formats. tests/reference/check_chat_template.py compares
// whole published templates with jinja2; these check which template is
// which, and the parts a reader can verify by eye.
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "model/chat_template.h"

namespace shardlm {
namespace {

constexpr char kBos[] = "<｜begin▁of▁sentence｜>";

// The parts of R1's template (its system, user and answer branches and its
// generation prompt) that tell it apart; `prompt` is what the generation
// prompt writes.
std::string R1Like(const std::string& prompt) {
  return "{% set ns = namespace(system_prompt='', is_first_sp=true) %}"
         "{%- for message in messages %}{%- if message['role'] == 'system' %}"
         "{%- if ns.is_first_sp %}"
         "{% set ns.system_prompt = ns.system_prompt + message['content'] %}"
         "{% set ns.is_first_sp = false %}{%- else %}"
         "{% set ns.system_prompt = ns.system_prompt + '\\n\\n' + "
         "message['content'] %}{%- endif %}{%- endif %}{%- endfor %}"
         "{{ bos_token }}{{ ns.system_prompt }}"
         "{%- for message in messages %}"
         "{%- if message['role'] == 'user' %}"
         "{{'<｜User｜>' + message['content']}}{%- endif %}"
         "{%- if message['role'] == 'assistant' %}"
         "{% set content = message['content'] %}"
         "{% if '</think>' in content %}"
         "{% set content = content.split('</think>')[-1] %}{% endif %}"
         "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}"
         "{%- endif %}{%- endfor -%}"
         "{% if add_generation_prompt %}{{'" +
         prompt + "'}}{% endif %}";
}

absl::StatusOr<ChatTemplate> FromSource(const std::string& source) {
  return ChatTemplate::FromSource(source, kBos, "<｜end▁of▁sentence｜>",
                                  /*vocab_has_chatml=*/false,
                                  absl::FromUnixSeconds(0));
}

ChatMessage M(std::string role, std::string content) {
  return {.role = std::move(role), .content = std::move(content)};
}

TEST(ChatDeepSeek, R1OpensThinkAndDropsOldReasoning) {
  absl::StatusOr<ChatTemplate> t =
      FromSource(R1Like("<｜Assistant｜><think>\\n"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->format(), ChatTemplate::Format::kDeepSeek);
  EXPECT_EQ(t->reasoning_format(), ReasoningFormat::kThinkOpen);
  EXPECT_EQ(t->tool_format(), ToolCallFormat::kNone);
  const std::vector<ChatMessage> messages = {
      M("system", "A"), M("user", "2+2?"),
      M("assistant", "<think>\nadd\n</think>\n\n4"), M("system", "B"),
      M("user", "3+3?")};
  absl::StatusOr<std::string> got = t->Render(messages);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string(kBos) +
                      "A\n\nB<｜User｜>2+2?<｜Assistant｜>\n\n4"
                      "<｜end▁of▁sentence｜><｜User｜>3+3?<｜Assistant｜>"
                      "<think>\n");
  // Its tools' format is not rendered: refused, not dropped.
  got = t->Render(messages, {{.name = "f"}});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("tools"), std::string::npos);
}

TEST(ChatDeepSeek, V3AnswersWithoutReasoning) {
  absl::StatusOr<ChatTemplate> t = FromSource(R1Like("<｜Assistant｜>"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->reasoning_format(), ReasoningFormat::kNone);
  absl::StatusOr<std::string> got = t->Render({M("user", "Hi")});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string(kBos) + "<｜User｜>Hi<｜Assistant｜>");
}

TEST(ChatDeepSeek, DistilledTemplateKeepsTheLastSystemMessage) {
  std::string source = R1Like("<｜Assistant｜>");
  const std::string append =
      "ns.system_prompt = ns.system_prompt + '\\n\\n' + message['content']";
  source.replace(source.find(append), append.size(),
                 "ns.system_prompt = message['content']");
  absl::StatusOr<ChatTemplate> t = FromSource(source);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<std::string> got =
      t->Render({M("system", "A"), M("system", "B"), M("user", "Hi")});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string(kBos) + "B<｜User｜>Hi<｜Assistant｜>");
}

TEST(ChatDeepSeek, VariantsItDoesNotRenderAreRefused) {
  // The user's turn followed by <｜Assistant｜> in one expression, and a
  // generation prompt that writes something else.
  std::string source = R1Like("<｜Assistant｜>");
  const std::string user = "'<｜User｜>' + message['content']";
  source.replace(source.find(user), user.size(),
                 "'<｜User｜>' + message['content'] + '<｜Assistant｜>'");
  for (const std::string& s : {source, R1Like("<｜Assistant｜><think>"),
                               R1Like("<｜Assistant｜>") + "{{ '<think>' }}"}) {
    const absl::StatusOr<ChatTemplate> t = FromSource(s);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_NE(t.status().message().find("DeepSeek"), std::string::npos);
  }
}

TEST(ChatDeepSeek, V31ThinksWhenEnabled) {
  const std::string source =
      "{%- if not thinking is defined -%}{%- if enable_thinking is defined "
      "-%}{%- set thinking = enable_thinking -%}{%- else -%}"
      "{%- set thinking = false -%}{%- endif -%}{%- endif -%}"
      "{%- set ns = namespace(system_prompt='', is_first_sp=true, "
      "is_last_user=false) -%}{%- for message in messages -%}"
      "{%- if message['role'] == 'system' -%}{%- if ns.is_first_sp -%}"
      "{%- set ns.system_prompt = ns.system_prompt + message['content'] -%}"
      "{%- set ns.is_first_sp = false -%}{%- else -%}"
      "{%- set ns.system_prompt = ns.system_prompt + '\\n\\n' + "
      "message['content'] -%}{%- endif -%}{%- endif -%}{%- endfor -%}"
      "{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages -%}"
      "{%- if message['role'] == 'user' -%}{%- set ns.is_last_user = true "
      "-%}{{'<｜User｜>' + message['content']}}{%- endif -%}"
      "{%- if message['role'] == 'assistant' -%}{%- if ns.is_last_user -%}"
      "{{'<｜Assistant｜>'}}{{'</think>'}}{%- endif -%}"
      "{%- set ns.is_last_user = false -%}"
      "{%- set content = message['content'] -%}"
      "{%- if '</think>' in content -%}"
      "{%- set content = content.split('</think>', 1)[1] -%}{%- endif -%}"
      "{{content + '<｜end▁of▁sentence｜>'}}{%- endif -%}{%- endfor -%}"
      "{%- if add_generation_prompt and ns.is_last_user -%}"
      "{{'<｜Assistant｜>'}}{%- if not thinking -%}{{'</think>'}}"
      "{%- else -%}{{'<think>'}}{%- endif -%}{%- endif %}";
  absl::StatusOr<ChatTemplate> t = FromSource(source);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->reasoning_format(), ReasoningFormat::kThinkIfEnabled);
  const std::vector<ChatMessage> messages = {
      M("user", "2+2?"), M("assistant", "a</think>b</think>4"),
      M("user", "3+3?")};
  const std::string history = std::string(kBos) +
                              "<｜User｜>2+2?<｜Assistant｜></think>b</think>4"
                              "<｜end▁of▁sentence｜><｜User｜>3+3?";
  absl::StatusOr<std::string> got = t->Render(messages, {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, history + "<｜Assistant｜></think>");
  got = t->Render(messages, {}, {.enable_thinking = true});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, history + "<｜Assistant｜><think>");
  // After an assistant's turn the template writes no generation prompt.
  got = t->Render({M("user", "q"), M("assistant", "a")});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got,
            std::string(kBos) +
                "<｜User｜>q<｜Assistant｜></think>a<｜end▁of▁sentence｜>");
}

}  // namespace
}  // namespace shardlm
