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
constexpr std::string_view kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
constexpr std::string_view kLlama2Template =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
constexpr std::string_view kMistralTemplate =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% endif %}{% endfor %}";
constexpr std::string_view kGemmaTemplate =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + "
    "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{'<start_of_turn>model\\n'}}{% endif %}";
constexpr std::string_view kPhi3Template =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + "
    "message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + "
    "message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + "
    "message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}";
constexpr std::string_view kZephyrTemplate =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + "
    "eos_token }}{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\\n'  + message['content'] + "
    "eos_token }}{% endif %}{% endfor %}";
constexpr std::string_view kVicunaTemplate =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ 'USER: ' + message['content'] }}"
    "{% else %}{{ 'ASSISTANT: ' + message['content'] + eos_token }}{% endif %}{% endfor %}";

const std::vector<ChatMessage> kConversation = {
    {"system", "You are terse."},
    {"user", "Hi!"},
    {"assistant", "Hello."},
    {"user", "What is 2+2?"},
};

ChatFamily family_of(std::string_view chat_template) {
  auto detected = detect_chat_family(chat_template);
  if (auto* problem = std::get_if<ChatTemplateError>(&detected)) ADD_FAILURE() << problem->message;
  return std::get<ChatFamily>(detected);
}

std::string render(ChatFamily family, bool add_generation_prompt,
                   const std::vector<ChatMessage>& messages = kConversation) {
  auto rendered = render_chat(ChatTemplate{family}, messages, add_generation_prompt);
  if (auto* problem = std::get_if<ChatTemplateError>(&rendered)) {
    ADD_FAILURE() << problem->message;
    return {};
  }
  return std::get<std::string>(rendered);
}

std::string render_error(ChatFamily family, const std::vector<ChatMessage>& messages) {
  auto rendered = render_chat(ChatTemplate{family}, messages, true);
  if (auto* problem = std::get_if<ChatTemplateError>(&rendered)) return problem->message;
  ADD_FAILURE() << "rendered: " << std::get<std::string>(rendered);
  return {};
}

// ---- detection ---------------------------------------------------------------------------

TEST(ChatTemplate, DetectsEachFamilyFromRealisticTemplates) {
  EXPECT_EQ(family_of(kQwenTemplate), ChatFamily::chatml);
  EXPECT_EQ(family_of(kLlama3Template), ChatFamily::llama3);
  EXPECT_EQ(family_of(kLlama2Template), ChatFamily::llama2);
  EXPECT_EQ(family_of(kMistralTemplate), ChatFamily::llama2);
  EXPECT_EQ(family_of(kGemmaTemplate), ChatFamily::gemma);
  EXPECT_EQ(family_of(kPhi3Template), ChatFamily::phi3);
}

TEST(ChatTemplate, UnrecognisedTemplateIsAnErrorNamingWhatWasSeen) {
  auto detected = detect_chat_family(kVicunaTemplate);
  ASSERT_TRUE(std::holds_alternative<ChatTemplateError>(detected));
  const std::string& message = std::get<ChatTemplateError>(detected).message;
  EXPECT_NE(message.find("unrecognised chat template \"{% for message in messages %}"), std::string::npos) << message;
  EXPECT_NE(message.find("...\""), std::string::npos) << message;  // cut at 80 characters
  EXPECT_NE(message.find("ChatML fallback"), std::string::npos) << message;
  // Zephyr shares Phi-3's <|user|> but not its <|end|>: not rendered as Phi-3.
  EXPECT_TRUE(std::holds_alternative<ChatTemplateError>(detect_chat_family(kZephyrTemplate)));
}

TEST(ChatTemplate, EmptyTemplateIsAnError) {
  auto detected = detect_chat_family("");
  ASSERT_TRUE(std::holds_alternative<ChatTemplateError>(detected));
  EXPECT_NE(std::get<ChatTemplateError>(detected).message.find("no chat template"), std::string::npos);
}

TEST(ChatTemplate, ChatMLFallbackOnlyWhenAskedFor) {
  EXPECT_EQ(std::get<ChatFamily>(detect_chat_family("", ChatFallback::chatml)), ChatFamily::chatml);
  EXPECT_EQ(std::get<ChatFamily>(detect_chat_family(kVicunaTemplate, ChatFallback::chatml)), ChatFamily::chatml);
  // A recognised template keeps its family.
  EXPECT_EQ(std::get<ChatFamily>(detect_chat_family(kGemmaTemplate, ChatFallback::chatml)), ChatFamily::gemma);
}

TEST(ChatTemplate, TemplateFromTheVocabularyCarriesItsBosAndEos) {
  Vocabulary vocabulary;
  vocabulary.tokens = {"<unk>", "<s>", "</s>", "hello"};
  vocabulary.bos = 1;
  vocabulary.eos = 2;
  vocabulary.chat_template = std::string(kLlama2Template);
  auto found = chat_template_for(vocabulary);
  ASSERT_TRUE(std::holds_alternative<ChatTemplate>(found));
  const auto& chat_template = std::get<ChatTemplate>(found);
  EXPECT_EQ(chat_template.family, ChatFamily::llama2);
  EXPECT_EQ(chat_template.bos_text, "<s>");
  EXPECT_EQ(chat_template.eos_text, "</s>");
  vocabulary.chat_template.clear();
  EXPECT_TRUE(std::holds_alternative<ChatTemplateError>(chat_template_for(vocabulary)));
}

// ---- rendering: system + user + assistant + user, with and without the generation prompt ----

TEST(ChatTemplate, RendersChatML) {
  const std::string body =
      "<|im_start|>system\nYou are terse.<|im_end|>\n"
      "<|im_start|>user\nHi!<|im_end|>\n"
      "<|im_start|>assistant\nHello.<|im_end|>\n"
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n";
  EXPECT_EQ(render(ChatFamily::chatml, false), body);
  EXPECT_EQ(render(ChatFamily::chatml, true), body + "<|im_start|>assistant\n");
}

TEST(ChatTemplate, RendersLlama3) {
  const std::string body =
      "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>";
  EXPECT_EQ(render(ChatFamily::llama3, false), body);
  EXPECT_EQ(render(ChatFamily::llama3, true), body + "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, RendersLlama2WithTheSystemPromptFolded) {
  const std::string expected =
      "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi! [/INST] Hello. </s>"
      "<s>[INST] What is 2+2? [/INST]";
  EXPECT_EQ(render(ChatFamily::llama2, false), expected);
  EXPECT_EQ(render(ChatFamily::llama2, true), expected);  // already ends ready for the answer
  EXPECT_EQ(render(ChatFamily::llama2, true, {{"user", "  Hi!\n"}}), "[INST] Hi! [/INST]");
}

TEST(ChatTemplate, RendersGemmaWithTheSystemPromptInTheFirstUserTurn) {
  const std::string body =
      "<start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n"
      "<start_of_turn>model\nHello.<end_of_turn>\n"
      "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n";
  EXPECT_EQ(render(ChatFamily::gemma, false), body);
  EXPECT_EQ(render(ChatFamily::gemma, true), body + "<start_of_turn>model\n");
}

TEST(ChatTemplate, RendersPhi3) {
  const std::string body =
      "<|system|>\nYou are terse.<|end|>\n"
      "<|user|>\nHi!<|end|>\n"
      "<|assistant|>\nHello.<|end|>\n"
      "<|user|>\nWhat is 2+2?<|end|>\n";
  EXPECT_EQ(render(ChatFamily::phi3, false), body);
  EXPECT_EQ(render(ChatFamily::phi3, true), body + "<|assistant|>\n");
}

TEST(ChatTemplate, TrimsContentWhereTheReferenceTemplateDoes) {
  const std::vector<ChatMessage> padded = {{"user", "\n Hi! \n"}};
  EXPECT_EQ(render(ChatFamily::chatml, false, padded), "<|im_start|>user\n\n Hi! \n<|im_end|>\n");
  EXPECT_EQ(render(ChatFamily::llama3, false, padded), "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>");
  EXPECT_EQ(render(ChatFamily::gemma, false, padded), "<start_of_turn>user\nHi!<end_of_turn>\n");
}

TEST(ChatTemplate, Llama2UsesTheVocabularysBosAndEosTexts) {
  ChatTemplate chat_template{ChatFamily::llama2, "<BOS>", "<EOS>"};
  const std::vector<ChatMessage> messages = {{"user", "a"}, {"assistant", "b"}, {"user", "c"}};
  auto rendered = render_chat(chat_template, messages, true);
  EXPECT_EQ(std::get<std::string>(rendered), "[INST] a [/INST] b <EOS><BOS>[INST] c [/INST]");
}

// ---- bad conversations -------------------------------------------------------------------

TEST(ChatTemplate, BadConversationsAreErrorValues) {
  EXPECT_NE(render_error(ChatFamily::chatml, {}).find("no messages"), std::string::npos);
  EXPECT_NE(render_error(ChatFamily::chatml, {{"tool", "x"}}).find("message 0 has role \"tool\""), std::string::npos);
  EXPECT_NE(render_error(ChatFamily::llama3, {{"user", "x"}, {"system", "y"}}).find("only come first"),
            std::string::npos);
  EXPECT_NE(render_error(ChatFamily::llama2, {{"user", "x"}, {"user", "y"}}).find("alternate"), std::string::npos);
  EXPECT_NE(render_error(ChatFamily::gemma, {{"assistant", "x"}}).find("needs \"user\""), std::string::npos);
  EXPECT_NE(render_error(ChatFamily::gemma, {{"system", "x"}}).find("needs a user message"), std::string::npos);
  // ChatML and the others accept consecutive user turns.
  EXPECT_EQ(render(ChatFamily::chatml, false, {{"user", "a"}, {"user", "b"}}),
            "<|im_start|>user\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n");
}

// ---- end of turn -------------------------------------------------------------------------

TEST(ChatTemplate, EndOfTurnTokens) {
  EXPECT_EQ(end_of_turn_texts(ChatFamily::chatml)[0], "<|im_end|>");
  EXPECT_EQ(end_of_turn_texts(ChatFamily::llama3)[0], "<|eot_id|>");
  EXPECT_EQ(end_of_turn_texts(ChatFamily::llama2)[0], "</s>");
  EXPECT_EQ(end_of_turn_texts(ChatFamily::gemma)[0], "<end_of_turn>");
  EXPECT_EQ(end_of_turn_texts(ChatFamily::phi3)[0], "<|end|>");

  Vocabulary vocabulary;
  vocabulary.tokens = {"a", "<|endoftext|>", "b", "<|im_start|>", "<|im_end|>"};
  vocabulary.eos = 1;
  EXPECT_EQ(end_of_turn_token_ids(ChatFamily::chatml, vocabulary), (std::vector<std::int32_t>{1, 4}));
  vocabulary.eot = 2;
  EXPECT_EQ(end_of_turn_token_ids(ChatFamily::llama3, vocabulary), (std::vector<std::int32_t>{1, 2}));
}

}  // namespace
}  // namespace mqlm::model
