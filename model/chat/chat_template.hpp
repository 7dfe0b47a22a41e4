// Chat prompts: a model's own chat template (tokenizer.chat_template, or a file given in its
// place), run by the Jinja interpreter (jinja/) as transformers' apply_chat_template runs it:
// the variables are messages, add_generation_prompt, bos_token and eos_token (the vocabulary's
// texts), tools (the list, or None), documents (None), and the request's chat_template_kwargs.
// A message is {role, content} with, where it has them, tool_call_id and name (a tool result)
// and tool_calls ([{id, type: "function", function: {name, arguments}}]); a null content is None.
//
// The rendered prompt holds special tokens as text (<|im_start|>, and the BOS where the template
// writes it): tokenize it with special tokens parsed, adding the vocabulary's BOS only where the
// template did not write it already.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "model/chat/jinja/template.hpp"
#include "model/vocabulary.hpp"

namespace mqlm::model {

// The variables the server gives every template, which a request's chat_template_kwargs may not
// replace: a request that tries is refused.
inline constexpr std::array<std::string_view, 5> kReservedTemplateVariables = {
    "messages", "add_generation_prompt", "bos_token", "eos_token", "tools"};

inline bool is_reserved_template_variable(std::string_view name) {
  for (std::string_view reserved : kReservedTemplateVariables)
    if (name == reserved) return true;
  return false;
}

// A call an assistant turn made: arguments as JSON text (an object, as the model wrote it).
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

// One message. has_content false: its content is null (an assistant turn with only tool calls).
// A tool result names the call it answers (tool_call_id) and may name the function (name).
struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  std::vector<ChatToolCall> tool_calls{};
  std::string tool_call_id{};
  std::string name{};
  bool has_content = true;
};

// What a request gives the template beyond its messages, as JSON text; "" for none.
struct ChatExtras {
  std::string tools;   // the tools array (OpenAI's {"type": "function", "function": {...}} entries)
  std::string kwargs;  // an object: each key a variable more (enable_thinking, ...)
};

struct ChatTemplateError {
  std::string message;  // what was wrong and what to do
};

class ChatTemplate {
 public:
  // `source` parsed, with the texts bos_token and eos_token stand for.
  static std::variant<ChatTemplate, ChatTemplateError> make(std::string_view source, std::string bos_text,
                                                            std::string eos_text);

  // The prompt for `messages`, ending with the assistant's turn opened when add_generation_prompt
  // (where the template does that). now_unix_s is the time strftime_now formats. An empty
  // conversation, an unknown role, tools or kwargs that are not JSON of the right shape, a
  // kwarg that would replace one of kReservedTemplateVariables, a template that refuses the
  // conversation (raise_exception) or fails on it are error values saying so.
  std::variant<std::string, ChatTemplateError> render(std::span<const ChatMessage> messages,
                                                      bool add_generation_prompt, std::int64_t now_unix_s,
                                                      const ChatExtras& extras = {}) const;

  // The ids that end an assistant turn: EOS, EOT, and the vocabulary's end-of-turn tokens
  // (<|im_end|>, <|eot_id|>, <end_of_turn>, ...) that this template writes. Sorted, unique.
  std::vector<std::int32_t> end_of_turn_tokens(const Vocabulary& vocabulary) const;

  const std::string& source() const { return source_; }

 private:
  ChatTemplate(jinja::Template compiled, std::string source, std::string bos_text, std::string eos_text)
      : compiled_(std::move(compiled)), source_(std::move(source)), bos_text_(std::move(bos_text)),
        eos_text_(std::move(eos_text)) {}

  jinja::Template compiled_;
  std::string source_;
  std::string bos_text_;
  std::string eos_text_;
};

// The template for a model: `override_source` when not empty (--chat-template), else the
// vocabulary's own. A model without either, or a template that does not parse, is an error
// saying what to do.
std::variant<ChatTemplate, ChatTemplateError> chat_template_for(const Vocabulary& vocabulary,
                                                                std::string_view override_source = {});

}  // namespace mqlm::model
