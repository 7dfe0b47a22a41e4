// Writes the client protocol fuzzer's seed corpus: one frame of each request a client sends
// (docs/protocol.md), generate with every key and each prompt kind, and a few near misses.
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/fuzz/fuzz_support.hpp"

int main(int argc, char** argv) {
  using nlohmann::json;
  const auto dir = mqlm::fuzz::seed_dir(argc, argv);
  if (dir.empty()) return 2;
  const json chat = json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}});
  const std::vector<std::pair<std::string, json>> seeds = {
      {"generate-text", {{"op", "generate"}, {"id", 1}, {"prompt", "Once upon a time"}, {"max_tokens", 8}}},
      {"generate-tokens", {{"op", "generate"}, {"id", "t-1"}, {"tokens", {1, 15043, 29871}}, {"stream", false}}},
      {"generate-chat", {{"op", "generate"}, {"id", -5}, {"model", "tiny"}, {"messages", chat}}},
      {"generate-every-key",
       {{"op", "generate"}, {"id", "all"}, {"model", "tiny"}, {"prompt", "x"}, {"stream", true}, {"max_tokens", 16},
        {"temperature", 0.7}, {"top_k", 40}, {"top_p", 0.9}, {"min_p", 0.05}, {"repetition_penalty", 1.1},
        {"repetition_last_n", 64}, {"presence_penalty", 0.5}, {"frequency_penalty", -0.5}, {"seed", 42},
        {"stop", {"\n\n", "END"}}, {"stop_token_ids", {2}}, {"logprobs", true}, {"top_logprobs", 3},
        {"logit_bias", {{"5", 1.5}, {"9", -100}}}}},
      {"generate-tools",
       {{"op", "generate"}, {"id", 8}, {"tools", R"([{"type": "function", "function": {"name": "get_weather", )"
                                                R"("parameters": {"type": "object"}}}])"},
        {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}, {"parallel_tool_calls", false},
        {"chat_template_kwargs", {{"enable_thinking", false}}},
        {"messages",
         {{{"role", "user"}, {"content", "Weather?"}},
          {{"role", "assistant"}, {"content", nullptr},
           {"tool_calls", {{{"id", "c1"}, {"type", "function"},
                            {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Paris"})"}}}}}}},
          {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "18 C"}}}}}},
      {"generate-two-prompts", {{"op", "generate"}, {"id", 2}, {"prompt", "a"}, {"tokens", {1}}}},
      {"generate-bad-temperature", {{"op", "generate"}, {"id", 3}, {"prompt", "a"}, {"temperature", -1}}},
      {"abort", {{"op", "abort"}, {"id", 1}}},
      {"generate-api-key", {{"op", "generate"}, {"id", 6}, {"prompt", "a"}, {"api_key", "sk-test"}}},
      {"unload-api-key", {{"op", "unload"}, {"model", "tiny"}, {"api_key", std::string(300, 'k')}}},
      {"status", {{"op", "status"}}},
      {"status-trim", {{"op", "status"}, {"id", "s"}, {"trim", true}}},
      {"load", {{"op", "load"}, {"id", 4}, {"model", "tiny"}}},
      {"unload", {{"op", "unload"}, {"model", "tiny"}, {"if_idle", true}}},
      {"models", {{"op", "models"}}},
      {"clear-cache", {{"op", "clear_cache"}, {"tier", "ssd"}}},
      {"unknown-op", {{"op", "frobnicate"}, {"id", 1}}},
  };
  for (const auto& [name, frame] : seeds) {
    const std::vector<std::uint8_t> packed = json::to_msgpack(frame);
    if (!mqlm::fuzz::write_seed(dir, name, std::string(packed.begin(), packed.end()))) return 1;
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  return 0;
}
