// Chat prompts: the family of a model's chat template recognised from its tokenizer.chat_template
// (by distinctive markers, not by the exact Jinja text, which varies between releases), and the
// conversation rendered as that family's reference template renders it.
//
// Families: ChatML / Qwen (<|im_start|>), Llama 3 (<|start_header_id|>), Llama 2 / Mistral
// ([INST], the system prompt folded into the first user turn in <<SYS>>), Gemma
// (<start_of_turn>, "model" for the assistant, the system prompt folded into the first user
// turn), Phi-3 (<|user|> ... <|end|>).
//
// The rendered prompt never starts with the BOS token: tokenize it with the vocabulary's add_bos
// and with special tokens parsed (the text holds <|im_start|>, <|eot_id|>, ... and, between
// Llama 2 turns, "<s>"). Content is trimmed where the family's reference template trims it
// (Llama 3, Gemma, Llama 2). No default system prompt is injected (Qwen's templates add one;
// a server that wants it adds a system message).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "model/vocabulary.hpp"

namespace mqlm::model {

enum class ChatFamily : std::uint8_t { chatml, llama3, llama2, gemma, phi3 };

std::string_view family_name(ChatFamily family);  // "ChatML", "Llama 3", ...

struct ChatMessage {
  std::string role;  // "system" (first message only), "user" or "assistant"
  std::string content;
};

struct ChatTemplateError {
  std::string message;  // what was wrong and what to do
};

// What to do with a template no family is recognised in (or an empty one).
enum class ChatFallback : std::uint8_t {
  none,    // an error naming what was seen
  chatml,  // render as ChatML: the most widely understood format, asked for explicitly
};

struct ChatTemplate {
  ChatFamily family = ChatFamily::chatml;
  std::string bos_text = "<s>";   // the vocabulary's BOS and EOS texts: Llama 2 writes them
  std::string eos_text = "</s>";  // between turns
};

std::variant<ChatFamily, ChatTemplateError> detect_chat_family(std::string_view chat_template,
                                                               ChatFallback fallback = ChatFallback::none);

// The family from vocabulary.chat_template, with the BOS / EOS texts of the vocabulary.
std::variant<ChatTemplate, ChatTemplateError> chat_template_for(const Vocabulary& vocabulary,
                                                                ChatFallback fallback = ChatFallback::none);

// The prompt for `messages`, ending with the assistant's turn opened when add_generation_prompt
// (Llama 2's prompt always ends ready for the assistant: it has no separate opening). Bad input
// (no messages, an unknown role, a system message not first, Llama 2 or Gemma turns that do not
// alternate user / assistant) is an error value.
std::variant<std::string, ChatTemplateError> render_chat(const ChatTemplate& chat_template,
                                                         std::span<const ChatMessage> messages,
                                                         bool add_generation_prompt);

// The token texts that end an assistant turn in this family (to stop generation on).
std::span<const std::string_view> end_of_turn_texts(ChatFamily family);

// Their ids in `vocabulary` (those it has), plus its EOS and EOT: sorted, without repeats.
std::vector<std::int32_t> end_of_turn_token_ids(ChatFamily family, const Vocabulary& vocabulary);

}  // namespace mqlm::model
