// Writes the OpenAI JSON fuzzer's seed corpus: request bodies as OpenAI's, llama-server's and
// vLLM's clients send them (those of tests/actors/http), each as text and as msgpack, behind the
// byte that picks the parser (openai_json_fuzzer.cpp).
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/fuzz/fuzz_support.hpp"

namespace {

using nlohmann::json;

enum Parser : char { chat = 0, completions = 1, tokenize = 2, detokenize = 3 };
constexpr char kMsgpackForm = 4;

struct Seed {
  std::string name;
  Parser parser;
  json body;
};

std::vector<Seed> seeds() {
  const json hi = json::array({{{"role", "user"}, {"content", "Hi"}}});
  const json parts = json::array(
      {{{"role", "system"}, {"content", "Be brief."}},
       {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Hello"}}})}},
       {{"role", "assistant"}, {"content", "Hi!"}}, {{"role", "user"}, {"content", "Again"}}});
  return {
      {"chat", chat, {{"model", "tiny"}, {"messages", hi}}},
      {"chat-stream", chat,
       {{"model", "tiny"}, {"messages", parts}, {"stream", true}, {"stream_options", {{"include_usage", true}}}}},
      {"chat-sampling", chat,
       {{"model", "tiny"}, {"messages", hi}, {"temperature", 0.7}, {"top_p", 0.9}, {"max_completion_tokens", 32},
        {"presence_penalty", 0.5}, {"frequency_penalty", 0.2}, {"seed", 7}, {"stop", {"\n", "END"}}, {"n", 1},
        {"logprobs", true}, {"top_logprobs", 2}, {"logit_bias", {{"15", -100}}}, {"user", "u-1"}}},
      {"chat-extensions", chat,
       {{"model", "tiny"}, {"messages", hi}, {"top_k", 40}, {"min_p", 0.05}, {"repetition_penalty", 1.1},
        {"ignore_eos", true}, {"cache_prompt", true}, {"chat_template_kwargs", {{"enable_thinking", false}}},
        {"return_tokens_as_token_ids", true}, {"max_tokens", 8}}},
      {"chat-tools", chat,
       {{"model", "tiny"},
        {"tools", json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "d",
                                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])")},
        {"tool_choice", "required"}, {"parallel_tool_calls", true},
        {"messages", json::parse(R"([{"role": "user", "content": "Weather?"},
          {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
          {"role": "tool", "tool_call_id": "c1", "content": "18 C"}])")}}},
      {"completions", completions, {{"model", "tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 16}}},
      {"completions-tokens", completions,
       {{"model", "tiny"}, {"prompt", {1, 15043, 29871}}, {"logprobs", 3}, {"echo", false}, {"stop", "."}}},
      {"completions-stream", completions,
       {{"model", "tiny"}, {"prompt", "x"}, {"stream", true}, {"temperature", 0}, {"stop_token_ids", {2}}}},
      {"completions-bad", completions, {{"model", "tiny"}, {"prompt", "x"}, {"temperature", -1}, {"n", 2}}},
      {"tokenize", tokenize, {{"content", "Hello <|eot_id|>"}, {"add_special", true}, {"with_pieces", true}}},
      {"tokenize-vllm", tokenize, {{"model", "tiny"}, {"prompt", "Hello"}, {"add_special_tokens", false}}},
      {"detokenize", detokenize, {{"tokens", {1, 15043, 29871}}, {"model", "tiny"}}},
  };
}

}  // namespace

int main(int argc, char** argv) {
  const auto dir = mqlm::fuzz::seed_dir(argc, argv);
  if (dir.empty()) return 2;
  std::size_t written = 0;
  for (const Seed& seed : seeds()) {
    const std::vector<std::uint8_t> packed = json::to_msgpack(seed.body);
    const std::string text = std::string(1, seed.parser) + seed.body.dump();
    const std::string msgpack = std::string(1, static_cast<char>(seed.parser | kMsgpackForm)) +
                                std::string(packed.begin(), packed.end());
    if (!mqlm::fuzz::write_seed(dir, seed.name + ".json", text)) return 1;
    if (!mqlm::fuzz::write_seed(dir, seed.name + ".msgpack", msgpack)) return 1;
    written += 2;
  }
  // Not JSON, or not an object: refused before any field is read.
  using namespace std::string_literals;
  for (const auto& [name, text] : {std::pair{"truncated", "\0{\"model\": \"ti"s}, std::pair{"array", "\1[1, 2]"s}}) {
    if (!mqlm::fuzz::write_seed(dir, name, text)) return 1;
    ++written;
  }
  std::printf("wrote %zu seeds to %s\n", written, dir.c_str());
  return 0;
}
