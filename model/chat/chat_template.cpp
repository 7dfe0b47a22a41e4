#include "model/chat/chat_template.hpp"

#include <algorithm>
#include <array>

namespace mqlm::model {

namespace {

// Texts of the tokens that end a turn in the template families of llama.cpp's collection.
constexpr std::array<std::string_view, 12> kEndOfTurnTexts = {
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>",
    "<|endoftext|>", "</s>", "<|END_OF_TURN_TOKEN|>", "<｜end▁of▁sentence｜>", "<|return|>", "<|call|>"};

std::string token_text(const Vocabulary& vocabulary, std::int32_t id) {
  if (id < 0 || static_cast<std::size_t>(id) >= vocabulary.tokens.size()) return "";
  return vocabulary.tokens[static_cast<std::size_t>(id)];
}

ChatTemplateError error(std::string message) { return {std::move(message)}; }

}  // namespace

std::variant<ChatTemplate, ChatTemplateError> ChatTemplate::make(std::string_view source, std::string bos_text,
                                                                 std::string eos_text) {
  auto parsed = jinja::Template::parse(source);
  if (auto* problem = std::get_if<jinja::TemplateError>(&parsed)) {
    return error("the chat template does not parse: " + problem->message +
                 "; give a template that does with --chat-template FILE");
  }
  return ChatTemplate(std::get<jinja::Template>(std::move(parsed)), std::string(source), std::move(bos_text),
                      std::move(eos_text));
}

std::variant<std::string, ChatTemplateError> ChatTemplate::render(std::span<const ChatMessage> messages,
                                                                  bool add_generation_prompt,
                                                                  std::int64_t now_unix_s) const {
  if (messages.empty()) return error("the conversation has no messages: give at least one user message");
  jinja::Array turns;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return error("message " + std::to_string(i) + " has role \"" + role +
                   "\": the roles are system, user, assistant and tool");
    }
    jinja::Object turn;
    turn.set("role", role);
    turn.set("content", messages[i].content);
    turns.emplace_back(std::move(turn));
  }
  jinja::Object variables;
  variables.set("messages", jinja::Value(std::move(turns)));
  variables.set("add_generation_prompt", add_generation_prompt);
  variables.set("bos_token", bos_text_);
  variables.set("eos_token", eos_text_);
  variables.set("tools", jinja::None{});
  variables.set("documents", jinja::None{});
  jinja::RenderOptions options;
  options.now_unix_s = now_unix_s;
  auto rendered = compiled_.render(variables, options);
  if (auto* problem = std::get_if<jinja::TemplateError>(&rendered)) {
    if (problem->raised) return error("the model's chat template refuses this conversation: " + problem->message);
    return error("the model's chat template failed on this conversation: " + problem->message);
  }
  return std::get<std::string>(std::move(rendered));
}

std::vector<std::int32_t> ChatTemplate::end_of_turn_tokens(const Vocabulary& vocabulary) const {
  std::vector<std::int32_t> ids;
  for (std::size_t id = 0; id < vocabulary.tokens.size(); ++id) {
    const std::string& text = vocabulary.tokens[id];
    if (std::find(kEndOfTurnTexts.begin(), kEndOfTurnTexts.end(), text) != kEndOfTurnTexts.end() &&
        source_.find(text) != std::string::npos) {
      ids.push_back(static_cast<std::int32_t>(id));
    }
  }
  for (std::int32_t id : {vocabulary.eos, vocabulary.eot})
    if (id >= 0) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::variant<ChatTemplate, ChatTemplateError> chat_template_for(const Vocabulary& vocabulary,
                                                                std::string_view override_source) {
  std::string_view source = override_source.empty() ? std::string_view(vocabulary.chat_template) : override_source;
  if (source.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return error("the model has no chat template (tokenizer.chat_template is empty): start the server with "
                 "--chat-template FILE, or send a prompt instead of messages");
  }
  // A vocabulary without BOS or EOS gives "" (transformers leaves the variable undefined, which prints so).
  return ChatTemplate::make(source, token_text(vocabulary, vocabulary.bos), token_text(vocabulary, vocabulary.eos));
}

}  // namespace mqlm::model
