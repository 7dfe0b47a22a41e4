// A model's chat template as the server runs it: from the vocabulary (or given in its place),
// with the vocabulary's BOS and EOS texts, over messages; its errors; the tokens that end a turn.
#include "model/chat/chat_template.hpp"

#include <string>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

namespace mqlm::model {
namespace {

// Short but realistic tokenizer.chat_template values, as GGUF files carry them.
constexpr std::string_view kQwenTemplate =
    "{%- for message in messages %}{%- if loop.first and messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
constexpr std::string_view kLlama2Template =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
constexpr std::string_view kLlama31DateTemplate =
    "{%- if strftime_now is defined %}{%- set date_string = strftime_now('%d %b %Y') %}"
    "{%- else %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{{- bos_token + 'Today Date: ' + date_string + '\\n' }}{%- for m in messages %}{{- m.content + '<|eot_id|>' }}"
    "{%- endfor %}";

Vocabulary vocabulary_with(std::string_view chat_template) {
  Vocabulary vocabulary;
  vocabulary.tokens = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "hello"};
  vocabulary.bos = 1;
  vocabulary.eos = 2;
  vocabulary.chat_template = std::string(chat_template);
  return vocabulary;
}

ChatTemplate template_for(std::string_view source) {
  auto made = chat_template_for(vocabulary_with(source));
  if (auto* problem = std::get_if<ChatTemplateError>(&made)) ADD_FAILURE() << problem->message;
  return std::get<ChatTemplate>(made);
}

std::string render(std::string_view source, const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) {
  auto rendered = template_for(source).render(messages, add_generation_prompt, 0);
  if (auto* problem = std::get_if<ChatTemplateError>(&rendered)) {
    ADD_FAILURE() << problem->message;
    return {};
  }
  return std::get<std::string>(rendered);
}

std::string render_error(std::string_view source, const std::vector<ChatMessage>& messages) {
  auto rendered = template_for(source).render(messages, true, 0);
  if (auto* problem = std::get_if<ChatTemplateError>(&rendered)) return problem->message;
  ADD_FAILURE() << "rendered: " << std::get<std::string>(rendered);
  return {};
}

TEST(ChatTemplate, RendersTheModelsOwnTemplateWithItsDefaults) {
  // Qwen's default system prompt is the template's, not ours.
  EXPECT_EQ(render(kQwenTemplate, {{"user", "Hi!"}}),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render(kQwenTemplate, {{"system", "Be terse."}, {"user", "Hi!"}}, false),
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n");
}

TEST(ChatTemplate, BosAndEosAreTheVocabularysTexts) {
  EXPECT_EQ(render(kLlama2Template, {{"system", "S"}, {"user", " a "}, {"assistant", "b"}, {"user", "c"}}),
            "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\n a [/INST] b </s><s>[INST] c [/INST]");
}

TEST(ChatTemplate, StrftimeNowFormatsTheTimeGiven) {
  auto rendered = template_for(kLlama31DateTemplate).render(std::vector<ChatMessage>{{"user", "x"}}, true, 1764403200);
  EXPECT_EQ(std::get<std::string>(rendered), "<s>Today Date: 29 Nov 2025\nx<|eot_id|>");
}

TEST(ChatTemplate, RefusalsAndBadConversationsAreErrorValues) {
  EXPECT_NE(render_error(kLlama2Template, {{"user", "a"}, {"user", "b"}})
                .find("refuses this conversation: Conversation roles must alternate"),
            std::string::npos);
  EXPECT_NE(render_error(kQwenTemplate, {}).find("no messages"), std::string::npos);
  EXPECT_NE(render_error(kQwenTemplate, {{"robot", "x"}}).find("message 0 has role \"robot\""), std::string::npos);
  EXPECT_NE(render_error("{{ messages[0].content + 1 }}", {{"user", "x"}}).find("failed on this conversation: line 1"),
            std::string::npos);
}

// What a template sees of a tool-calling conversation, written out: each message's keys (items()
// in order, content None where null), the arguments as a mapping (.items(), tojson), the tools.
constexpr std::string_view kShowTemplate =
    "{% for m in messages %}{% for k, v in m.items() %}{% if k != 'tool_calls' %}{{ k }}={{ v }};{% endif %}"
    "{% endfor %}{% for c in m.tool_calls or [] %}[{{ c.id }} {{ c.type }} {{ c.function.name }}"
    "{% if c.function.arguments is mapping %}{% for k, v in c.function.arguments.items() %} {{ k }}:{{ v }}"
    "{% endfor %}{% else %} text {{ c.function.arguments }}{% endif %} {{ c.function.arguments | tojson }}]"
    "{% endfor %}|{% endfor %}tools={{ tools | tojson if tools is not none else 'None' }}"
    "{% if enable_thinking is defined %} thinking={{ enable_thinking }} depth={{ custom.depth }}{% endif %}";

std::variant<std::string, ChatTemplateError> render_with(const std::vector<ChatMessage>& messages,
                                                         const ChatExtras& extras) {
  return template_for(kShowTemplate).render(messages, true, 0, extras);
}

TEST(ChatTemplate, ToolCallsToolResultsAndToolsAreWhatTransformersGivesTemplates) {
  const std::vector<ChatMessage> messages = {
      {"user", "Weather?"},
      {"assistant", "", {{"call_1", "get_weather", R"({"city": "Paris", "days": 2})"}, {"call_2", "now", "not json"},
                         {"call_3", "list", "[1, 2]"}}, "", "", false},
      {"tool", "18 C", {}, "call_1", "get_weather"}};
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather"}}])";
  auto rendered = render_with(messages, {tools, ""});
  ASSERT_TRUE(std::holds_alternative<std::string>(rendered)) << std::get<ChatTemplateError>(rendered).message;
  EXPECT_EQ(std::get<std::string>(rendered),
            "role=user;content=Weather?;|"
            "role=assistant;content=None;"
            R"([call_1 function get_weather city:Paris days:2 {"city": "Paris", "days": 2}])"
            R"([call_2 function now text not json "not json"])"
            R"([call_3 function list text [1, 2] "[1, 2]"])"
            "|role=tool;tool_call_id=call_1;name=get_weather;content=18 C;|"
            R"(tools=[{"type": "function", "function": {"name": "get_weather"}}])");
  // No tools: the variable is None, as transformers passes it.
  EXPECT_NE(std::get<std::string>(render_with({{"user", "x"}}, {})).find("tools=None"), std::string::npos);
}

TEST(ChatTemplate, KwargsAreVariablesButMayNotReplaceTheServers) {
  auto rendered = render_with({{"user", "x"}}, {"", R"({"enable_thinking": false, "custom": {"depth": 3}})"});
  ASSERT_TRUE(std::holds_alternative<std::string>(rendered)) << std::get<ChatTemplateError>(rendered).message;
  EXPECT_NE(std::get<std::string>(rendered).find("thinking=False depth=3"), std::string::npos);
  for (const char* reserved : {"messages", "add_generation_prompt", "bos_token", "eos_token", "tools"}) {
    auto refused = render_with({{"user", "x"}}, {"", std::string(R"({")") + reserved + R"(": 1})"});
    ASSERT_TRUE(std::holds_alternative<ChatTemplateError>(refused)) << reserved;
    EXPECT_NE(std::get<ChatTemplateError>(refused).message.find(std::string("may not set '") + reserved + "'"),
              std::string::npos);
  }
  for (const ChatExtras& bad : {ChatExtras{"{", ""}, ChatExtras{R"({"a": 1})", ""}, ChatExtras{"", "[1]"},
                                ChatExtras{"", "not json"}}) {
    EXPECT_TRUE(std::holds_alternative<ChatTemplateError>(render_with({{"user", "x"}}, bad))) << bad.tools << bad.kwargs;
  }
}

TEST(ChatTemplate, AModelWithoutATemplateNeedsOneGiven) {
  auto missing = chat_template_for(vocabulary_with(""));
  ASSERT_TRUE(std::holds_alternative<ChatTemplateError>(missing));
  EXPECT_NE(std::get<ChatTemplateError>(missing).message.find("--chat-template FILE"), std::string::npos);
  // The template given replaces the model's own, whether it has one or not.
  auto given = chat_template_for(vocabulary_with(""), "{{ bos_token }}{{ messages[0].content }}");
  ASSERT_TRUE(std::holds_alternative<ChatTemplate>(given));
  EXPECT_EQ(std::get<std::string>(std::get<ChatTemplate>(given).render(std::vector<ChatMessage>{{"user", "x"}}, true, 0)),
            "<s>x");
  auto broken = chat_template_for(vocabulary_with(kQwenTemplate), "{% for x in %}");
  ASSERT_TRUE(std::holds_alternative<ChatTemplateError>(broken));
  EXPECT_NE(std::get<ChatTemplateError>(broken).message.find("does not parse: line 1"), std::string::npos);
}

TEST(ChatTemplate, EndOfTurnTokensAreThoseTheTemplateWrites) {
  Vocabulary vocabulary = vocabulary_with(kQwenTemplate);
  vocabulary.eot = 7;
  // <|im_end|> (4) is written by the template; <|endoftext|> (5) and <|eot_id|> (6) are not; EOS and EOT always.
  EXPECT_EQ(template_for(kQwenTemplate).end_of_turn_tokens(vocabulary), (std::vector<std::int32_t>{2, 4, 7}));
  EXPECT_EQ(template_for(kLlama31DateTemplate).end_of_turn_tokens(vocabulary), (std::vector<std::int32_t>{2, 6, 7}));
}

}  // namespace
}  // namespace mqlm::model
