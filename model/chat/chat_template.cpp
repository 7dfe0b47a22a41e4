#include "model/chat/chat_template.hpp"

#include <algorithm>
#include <array>
#include <optional>

namespace mqlm::model {
namespace {

struct Marker {
  ChatFamily family;
  std::string_view text;
  std::string_view also;  // a second text the template must hold, or empty
};

// Checked in this order: each marker is specific to its family's special tokens. Phi-3 needs
// both of its markers, as Zephyr's template also has <|user|> (but ends turns with </s>).
constexpr std::array kMarkers = {
    Marker{ChatFamily::llama3, "<|start_header_id|>", ""},
    Marker{ChatFamily::chatml, "<|im_start|>", ""},
    Marker{ChatFamily::gemma, "<start_of_turn>", ""},
    Marker{ChatFamily::phi3, "<|user|>", "<|end|>"},
    Marker{ChatFamily::llama2, "[INST]", ""},
};

std::string_view trimmed(std::string_view text) {  // Python's str.strip() / Jinja's trim
  constexpr std::string_view kSpace = " \t\n\r\v\f";
  std::size_t first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kSpace) - first + 1);
}

std::string excerpt(std::string_view text) {
  constexpr std::size_t kLength = 80;
  std::string shown(text.substr(0, kLength));
  std::replace(shown.begin(), shown.end(), '\n', ' ');
  return "\"" + shown + (text.size() > kLength ? "...\"" : "\"");
}

ChatTemplateError error(std::string message) { return {std::move(message)}; }

// Roles known, system first only; for Llama 2 and Gemma, user and assistant alternate from a user.
std::optional<ChatTemplateError> check_roles(ChatFamily family, std::span<const ChatMessage> messages) {
  if (messages.empty()) return error("the conversation has no messages: give at least one user message");
  bool has_system = messages[0].role == "system";
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    std::string which = "message " + std::to_string(i) + " has role \"" + role + "\"";
    if (role != "system" && role != "user" && role != "assistant")
      return error(which + ": the roles are system, user and assistant");
    if (role == "system" && i > 0) return error(which + ": a system message can only come first");
  }
  if (family != ChatFamily::llama2 && family != ChatFamily::gemma) return std::nullopt;
  std::size_t first_turn = has_system ? 1 : 0;
  if (first_turn == messages.size())
    return error(std::string(family_name(family)) + " needs a user message after the system prompt");
  for (std::size_t i = first_turn; i < messages.size(); ++i) {
    const char* expected = (i - first_turn) % 2 == 0 ? "user" : "assistant";
    if (messages[i].role != expected)
      return error("message " + std::to_string(i) + " has role \"" + messages[i].role + "\" where " +
                   std::string(family_name(family)) + " needs \"" + expected +
                   "\": its turns alternate user / assistant, starting with user");
  }
  return std::nullopt;
}

std::string render_chatml(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_llama3(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  for (const auto& m : messages)
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + std::string(trimmed(m.content)) + "<|eot_id|>";
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]", the first BOS left
// to the tokenizer.
std::string render_llama2(const ChatTemplate& chat_template, std::span<const ChatMessage> messages) {
  std::string system;
  if (messages[0].role == "system") {
    system = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n";
    messages = messages.subspan(1);
  }
  std::string out;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "user") {
      std::string content = (i == 0 ? system : std::string()) + messages[i].content;
      out += (i == 0 ? std::string() : chat_template.bos_text) + "[INST] " + std::string(trimmed(content)) + " [/INST]";
    } else {
      out += " " + std::string(trimmed(messages[i].content)) + " " + chat_template.eos_text;
    }
  }
  return out;
}

std::string render_gemma(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string first_user_prefix;
  if (messages[0].role == "system") {
    first_user_prefix = messages[0].content + "\n\n";
    messages = messages.subspan(1);
  }
  std::string out;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    std::string role = m.role == "assistant" ? "model" : m.role;
    out += "<start_of_turn>" + role + "\n" + (i == 0 ? first_user_prefix : std::string()) +
           std::string(trimmed(m.content)) + "<end_of_turn>\n";
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

std::string render_phi3(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
  if (add_generation_prompt) out += "<|assistant|>\n";
  return out;
}

std::string token_text(const Vocabulary& vocabulary, std::int32_t id, std::string fallback) {
  if (id < 0 || static_cast<std::size_t>(id) >= vocabulary.tokens.size()) return fallback;
  return vocabulary.tokens[id];
}

}  // namespace

std::string_view family_name(ChatFamily family) {
  switch (family) {
    case ChatFamily::chatml: return "ChatML";
    case ChatFamily::llama3: return "Llama 3";
    case ChatFamily::llama2: return "Llama 2 / Mistral";
    case ChatFamily::gemma: return "Gemma";
    case ChatFamily::phi3: return "Phi-3";
  }
  return "unknown";
}

std::variant<ChatFamily, ChatTemplateError> detect_chat_family(std::string_view chat_template,
                                                               ChatFallback fallback) {
  for (const Marker& marker : kMarkers)
    if (chat_template.find(marker.text) != std::string_view::npos &&
        chat_template.find(marker.also) != std::string_view::npos)
      return marker.family;
  if (fallback == ChatFallback::chatml) return ChatFamily::chatml;
  if (trimmed(chat_template).empty())
    return error("the model has no chat template (tokenizer.chat_template is empty): render the prompt "
                 "yourself, or ask for the ChatML fallback");
  return error("unrecognised chat template " + excerpt(chat_template) +
               ": it has none of the markers of ChatML (<|im_start|>), Llama 3 (<|start_header_id|>), "
               "Llama 2 / Mistral ([INST]), Gemma (<start_of_turn>) or Phi-3 (<|user|> with <|end|>); render the "
               "prompt yourself, or ask for the ChatML fallback");
}

std::variant<ChatTemplate, ChatTemplateError> chat_template_for(const Vocabulary& vocabulary,
                                                                ChatFallback fallback) {
  auto family = detect_chat_family(vocabulary.chat_template, fallback);
  if (auto* problem = std::get_if<ChatTemplateError>(&family)) return *problem;
  return ChatTemplate{std::get<ChatFamily>(family), token_text(vocabulary, vocabulary.bos, "<s>"),
                      token_text(vocabulary, vocabulary.eos, "</s>")};
}

std::variant<std::string, ChatTemplateError> render_chat(const ChatTemplate& chat_template,
                                                         std::span<const ChatMessage> messages,
                                                         bool add_generation_prompt) {
  if (auto problem = check_roles(chat_template.family, messages)) return *problem;
  switch (chat_template.family) {
    case ChatFamily::chatml: return render_chatml(messages, add_generation_prompt);
    case ChatFamily::llama3: return render_llama3(messages, add_generation_prompt);
    case ChatFamily::llama2: return render_llama2(chat_template, messages);
    case ChatFamily::gemma: return render_gemma(messages, add_generation_prompt);
    case ChatFamily::phi3: return render_phi3(messages, add_generation_prompt);
  }
  return error("unknown chat family");
}

std::span<const std::string_view> end_of_turn_texts(ChatFamily family) {
  static constexpr std::string_view kChatml[] = {"<|im_end|>", "<|endoftext|>"};
  static constexpr std::string_view kLlama3[] = {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"};
  static constexpr std::string_view kLlama2[] = {"</s>"};
  static constexpr std::string_view kGemma[] = {"<end_of_turn>", "<eos>"};
  static constexpr std::string_view kPhi3[] = {"<|end|>", "<|endoftext|>"};
  switch (family) {
    case ChatFamily::chatml: return kChatml;
    case ChatFamily::llama3: return kLlama3;
    case ChatFamily::llama2: return kLlama2;
    case ChatFamily::gemma: return kGemma;
    case ChatFamily::phi3: return kPhi3;
  }
  return {};
}

std::vector<std::int32_t> end_of_turn_token_ids(ChatFamily family, const Vocabulary& vocabulary) {
  std::vector<std::int32_t> ids;
  auto texts = end_of_turn_texts(family);
  for (std::size_t id = 0; id < vocabulary.tokens.size(); ++id)
    if (std::find(texts.begin(), texts.end(), vocabulary.tokens[id]) != texts.end())
      ids.push_back(static_cast<std::int32_t>(id));
  for (std::int32_t id : {vocabulary.eos, vocabulary.eot})
    if (id >= 0) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace mqlm::model
