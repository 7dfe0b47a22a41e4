// A chat's output split into content, reasoning and tool calls (model/chat/output_parser): each
// call format, parallel calls, text that is not a call, reasoning opened by the prompt or by the
// model, forced calls; the same output fed whole, at every byte boundary and byte by byte gives
// the same result; and the schemas of forced calls compile to grammars.
#include "model/chat/output_parser.hpp"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/grammar/json_schema.hpp"

namespace mqlm::model {
namespace {

struct Call {
  std::string name;
  std::string arguments;
  bool operator==(const Call&) const = default;
};

struct Result {
  std::string content;
  std::string reasoning;
  std::vector<Call> calls;
  bool operator==(const Result&) const = default;
};

std::ostream& operator<<(std::ostream& out, const Result& r) {
  out << "content=[" << r.content << "] reasoning=[" << r.reasoning << "] calls=";
  for (const auto& c : r.calls) out << "(" << c.name << " " << c.arguments << ")";
  return out;
}

// The output fed in the given pieces, then finished; the calls' pieces joined by index, each
// index's name given once, by its first piece.
Result parse(const OutputParserSetup& setup, const std::vector<std::string>& chunks) {
  OutputParser parser(setup);
  ParsedOutput all;
  for (const auto& chunk : chunks) all.append(parser.push(chunk));
  all.append(parser.finish());
  Result result{all.content, all.reasoning, {}};
  for (const auto& piece : all.calls) {
    if (piece.index == result.calls.size()) {
      EXPECT_FALSE(piece.name.empty()) << "call " << piece.index << "'s first piece has no name";
      result.calls.push_back({piece.name, piece.arguments});
    } else {
      EXPECT_EQ(piece.index + 1, result.calls.size()) << "a piece of an earlier call after a later one";
      EXPECT_TRUE(piece.name.empty()) << "a later piece of call " << piece.index << " names it again";
      result.calls.back().arguments += piece.arguments;
    }
  }
  return result;
}

// Whole, split at every byte boundary, and byte by byte: all the same.
Result parse_every_way(const OutputParserSetup& setup, const std::string& text) {
  const Result whole = parse(setup, {text});
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    EXPECT_EQ(parse(setup, {text.substr(0, cut), text.substr(cut)}), whole) << "cut at " << cut;
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(parse(setup, bytes), whole) << "byte by byte";
  return whole;
}

OutputParserSetup native(ToolCallFormat format, bool reasoning = false, bool starts_in_reasoning = false) {
  return {reasoning, starts_in_reasoning, CallReading::native, format, {}};
}

// Arguments compared as JSON values (a parsed call's are re-written compactly).
nlohmann::json args(const Call& call) { return nlohmann::json::parse(call.arguments); }

TEST(OutputConventions, FromTemplateSources) {
  const auto qwen3 = output_conventions("{%- if tools %}<tool_call>\\n{{ tool_call | tojson }}</tool_call>"
                                        "{%- endif %}{{ content.split('</think>')[-1] }}");
  EXPECT_TRUE(qwen3.reasoning);
  EXPECT_EQ(qwen3.tool_calls, ToolCallFormat::hermes);
  const auto r1 = output_conventions("{% set content = content.split('</think>')[-1] %}<｜Assistant｜><think>\\n");
  EXPECT_TRUE(r1.reasoning);
  EXPECT_EQ(r1.tool_calls, ToolCallFormat::none);
  EXPECT_EQ(output_conventions("{{- '[TOOL_CALLS]' + tool_calls | tojson }}").tool_calls, ToolCallFormat::mistral);
  EXPECT_EQ(output_conventions("<|start_header_id|>{\"name\": function name, \"parameters\": dictionary}").tool_calls,
            ToolCallFormat::llama3_json);
  EXPECT_EQ(output_conventions("{{- '<|python_tag|>' + tool_call.name }}").tool_calls, ToolCallFormat::llama3_json);
  const auto plain = output_conventions("<|im_start|>{{ message.content }}<|im_end|>");
  EXPECT_FALSE(plain.reasoning);
  EXPECT_EQ(plain.tool_calls, ToolCallFormat::none);
}

TEST(OutputConventions, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<｜Assistant｜><think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_reasoning(""));
}

TEST(OutputParser, HermesCallAfterContent) {
  const Result r = parse_every_way(native(ToolCallFormat::hermes),
                                   "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                   "{\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>");
  EXPECT_EQ(r.content, "Let me look.");
  EXPECT_EQ(r.reasoning, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(args(r.calls[0]), (nlohmann::json{{"city", "Paris"}, {"days", {1, 2}}}));
}

TEST(OutputParser, HermesParallelCalls) {
  const Result r = parse_every_way(native(ToolCallFormat::hermes),
                                   "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": \"}</tool_call\"}}\n"
                                   "</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(args(r.calls[0]), (nlohmann::json{{"x", "}</tool_call"}}));
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(args(r.calls[1]), nlohmann::json::object());
}

TEST(OutputParser, WithoutParallelCallsOnlyTheFirstCounts) {
  OutputParserSetup setup = native(ToolCallFormat::hermes);
  setup.parallel = false;
  const Result r = parse_every_way(setup, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n"
                                          "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(r.content, "");
  setup.format = ToolCallFormat::mistral;
  EXPECT_EQ(parse_every_way(setup, "[TOOL_CALLS][{\"name\": \"a\"}, {\"name\": \"b\"}]").calls.size(), 1u);
}

TEST(OutputParser, HermesBodyThatIsNoCallIsContent) {
  const Result r = parse_every_way(native(ToolCallFormat::hermes), "a <tool_call>not json</tool_call> b");
  EXPECT_EQ(r.content, "a <tool_call>not json</tool_call> b");
  EXPECT_TRUE(r.calls.empty());
  // A call the output ended inside: a call if what came parses, else content as written.
  const Result open = parse_every_way(native(ToolCallFormat::hermes), "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}");
  ASSERT_EQ(open.calls.size(), 1u);
  EXPECT_EQ(open.calls[0].name, "f");
  const Result cut = parse_every_way(native(ToolCallFormat::hermes), "x <tool_call>\n{\"name\": \"f\", \"argu");
  EXPECT_EQ(cut.content, "x <tool_call>\n{\"name\": \"f\", \"argu");
  EXPECT_TRUE(cut.calls.empty());
  // A marker's start that does not become one is content.
  EXPECT_EQ(parse_every_way(native(ToolCallFormat::hermes), "1 <tool 2 <tool_cal").content, "1 <tool 2 <tool_cal");
}

TEST(OutputParser, ReasoningThenCall) {
  const Result r = parse_every_way(native(ToolCallFormat::hermes, true),
                                   "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n"
                                   "{\"name\": \"w\", \"arguments\": {\"c\": 1}}\n</tool_call>");
  EXPECT_EQ(r.reasoning, "\nThe user wants weather.\n");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "w");
}

TEST(OutputParser, ReasoningOpenedByThePrompt) {
  const OutputParserSetup setup{true, true, CallReading::none, ToolCallFormat::none, {}};
  const Result r = parse_every_way(setup, "Two and two.\n</think>\n\nFour.");
  EXPECT_EQ(r.reasoning, "Two and two.\n");
  EXPECT_EQ(r.content, "Four.");
  // Never closed: all of it is reasoning, markers of other kinds included.
  const Result open = parse_every_way(setup, "still <tool_call> thinking </thin");
  EXPECT_EQ(open.reasoning, "still <tool_call> thinking </thin");
  EXPECT_EQ(open.content, "");
}

TEST(OutputParser, StreamingHoldsBackOnlyWhatMayBeAMarker) {
  OutputParser parser(native(ToolCallFormat::hermes, true, true));
  ParsedOutput first = parser.push("I think </th");
  EXPECT_EQ(first.reasoning, "I think ");
  ParsedOutput second = parser.push("ink>Hello there <tool");
  EXPECT_EQ(second.reasoning, "");
  EXPECT_EQ(second.content, "Hello there");
  ParsedOutput third = parser.push("_call>{\"name\": \"f\", \"arguments\": {}}");
  EXPECT_TRUE(third.empty());  // the call is not whole before its closing tag
  ParsedOutput fourth = parser.push("</tool_call>");
  ASSERT_EQ(fourth.calls.size(), 1u);
  EXPECT_EQ(fourth.calls[0].index, 0u);
  EXPECT_EQ(fourth.calls[0].name, "f");
  EXPECT_TRUE(parser.finish().empty());
  EXPECT_EQ(parser.calls(), 1u);
}

TEST(OutputParser, Llama3Json) {
  const Result r = parse_every_way(native(ToolCallFormat::llama3_json),
                                   "{\"name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_time");
  EXPECT_EQ(args(r.calls[0]), (nlohmann::json{{"zone", "UTC"}}));
  const Result tagged = parse_every_way(native(ToolCallFormat::llama3_json),
                                        "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; "
                                        "{\"name\": \"b\", \"arguments\": \"{\\\"q\\\": 1}\"}");
  ASSERT_EQ(tagged.calls.size(), 1u);  // what follows "; " is not read as a second call
  EXPECT_EQ(tagged.content, "; {\"name\": \"b\", \"arguments\": \"{\\\"q\\\": 1}\"}");
  const Result two = parse_every_way(native(ToolCallFormat::llama3_json),
                                     "{\"name\": \"a\", \"parameters\": {}}\n{\"name\": \"b\", \"arguments\": "
                                     "\"{\\\"q\\\": 1}\"}");
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[1].arguments, "{\"q\": 1}");  // arguments given as a string are taken as written
}

TEST(OutputParser, Llama3TextIsContent) {
  EXPECT_EQ(parse_every_way(native(ToolCallFormat::llama3_json), " Hello {\"name\": \"x\"}").content,
            "Hello {\"name\": \"x\"}");
  // JSON that is not a call, at the start: content.
  const Result r = parse_every_way(native(ToolCallFormat::llama3_json), "{\"answer\": 42} is all");
  EXPECT_EQ(r.content, "{\"answer\": 42} is all");
  EXPECT_TRUE(r.calls.empty());
}

TEST(OutputParser, MistralCalls) {
  const std::string calls = "[{\"name\": \"a\", \"arguments\": {\"n\": [1, {\"m\": \"]\"}]}}, "
                            "{\"name\": \"b\", \"arguments\": {}}]";
  for (const std::string& text : {"[TOOL_CALLS]" + calls, calls, "[TOOL_CALLS] " + calls + "\n"}) {
    const Result r = parse_every_way(native(ToolCallFormat::mistral), text);
    EXPECT_EQ(r.content, "") << text;
    ASSERT_EQ(r.calls.size(), 2u) << text;
    EXPECT_EQ(r.calls[0].name, "a");
    EXPECT_EQ(args(r.calls[0]), (nlohmann::json{{"n", {1, {{"m", "]"}}}}}));
    EXPECT_EQ(r.calls[1].name, "b");
  }
  const Result bad = parse_every_way(native(ToolCallFormat::mistral), "[TOOL_CALLS][{\"name\": 3}]");
  EXPECT_EQ(bad.content, "[{\"name\": 3}]");
  EXPECT_TRUE(bad.calls.empty());
}

TEST(OutputParser, MistralNamedCalls) {
  const Result r = parse_every_way(native(ToolCallFormat::mistral),
                                   "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"n\": [1]}"
                                   "[TOOL_CALLS]now[ARGS]{}");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(args(r.calls[0]), (nlohmann::json{{"city", "Paris"}, {"n", {1}}}));
  EXPECT_EQ(r.calls[1].name, "now");
  EXPECT_EQ(args(r.calls[1]), nlohmann::json::object());
  // Not a name, or arguments that are no object: content.
  EXPECT_EQ(parse_every_way(native(ToolCallFormat::mistral), "[TOOL_CALLS]bad name[ARGS]{}").content,
            "bad name[ARGS]{}");
  const Result bad = parse_every_way(native(ToolCallFormat::mistral), "[TOOL_CALLS]f[ARGS][1]");
  EXPECT_EQ(bad.content, "f[ARGS][1]");
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(parse_every_way(native(ToolCallFormat::mistral), "[TOOL_CALLS]f[AR").content, "f[AR");
}

TEST(OutputParser, NoCallReadingIsAllContent) {
  const OutputParserSetup none{true, false, CallReading::none, ToolCallFormat::hermes, {}};
  const Result r = parse_every_way(none, "<think>x</think>y <tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_EQ(r.reasoning, "x");
  EXPECT_EQ(r.content, "y <tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_TRUE(r.calls.empty());
}

TEST(OutputParser, ForcedFunctionStreamsArguments) {
  const OutputParserSetup setup{false, false, CallReading::forced_function, ToolCallFormat::none, "get_weather"};
  OutputParser parser(setup);
  ParsedOutput first = parser.push("{\"ci");
  ASSERT_EQ(first.calls.size(), 1u);
  EXPECT_EQ(first.calls[0].name, "get_weather");
  EXPECT_EQ(first.calls[0].arguments, "{\"ci");
  ParsedOutput second = parser.push("ty\": \"Oslo\"}");
  ASSERT_EQ(second.calls.size(), 1u);
  EXPECT_EQ(second.calls[0].name, "");
  EXPECT_EQ(second.calls[0].arguments, "ty\": \"Oslo\"}");
  EXPECT_TRUE(parser.finish().empty());
  const Result r = parse_every_way(setup, "{\"city\": \"Oslo\"}");
  EXPECT_EQ(r.calls, (std::vector<Call>{{"get_weather", "{\"city\": \"Oslo\"}"}}));
  EXPECT_EQ(r.content, "");
  // Nothing generated: still the one call, with no arguments.
  EXPECT_EQ(parse(setup, {}).calls, (std::vector<Call>{{"get_weather", ""}}));
}

TEST(OutputParser, ForcedRequired) {
  const OutputParserSetup setup{false, false, CallReading::forced_required, ToolCallFormat::none, {}};
  const Result one = parse_every_way(setup, "{\"name\": \"f\", \"arguments\": {\"a\": \"{[\"}}");
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(args(one.calls[0]), (nlohmann::json{{"a", "{["}}));
  const Result many = parse_every_way(setup, "[{\"name\": \"f\", \"arguments\": {}},\n {\"name\": \"g\", \"arguments\": "
                                             "{\"b\": true}}]");
  ASSERT_EQ(many.calls.size(), 2u);
  EXPECT_EQ(many.calls[1].name, "g");
  EXPECT_EQ(many.content, "");
}

nlohmann::json schema_of(const std::variant<std::string, ToolSchemaError>& made) {
  if (const auto* e = std::get_if<ToolSchemaError>(&made)) {
    ADD_FAILURE() << e->message;
    return {};
  }
  const auto schema = nlohmann::ordered_json::parse(std::get<std::string>(made));
  auto compiled = grammar::compile_json_schema(schema, false);
  if (const auto* e = std::get_if<grammar::SchemaError>(&compiled)) ADD_FAILURE() << e->message;
  return nlohmann::json::parse(std::get<std::string>(made));
}

TEST(ForcedCallSchema, FunctionAndRequired) {
  const std::string tools =
      R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
          {"type": "function", "function": {"name": "now"}}])";
  const auto function = schema_of(forced_call_schema(tools, CallReading::forced_function, "get_weather", true));
  EXPECT_EQ(function["required"], nlohmann::json::array({"city"}));
  EXPECT_EQ(schema_of(forced_call_schema(tools, CallReading::forced_function, "now", true)),
            (nlohmann::json{{"type", "object"}}));
  const auto one = schema_of(forced_call_schema(tools, CallReading::forced_required, {}, false));
  ASSERT_EQ(one["anyOf"].size(), 2u);
  EXPECT_EQ(one["anyOf"][0]["properties"]["name"]["const"], "get_weather");
  EXPECT_EQ(one["anyOf"][1]["properties"]["arguments"], (nlohmann::json{{"type", "object"}}));
  const auto many = schema_of(forced_call_schema(tools, CallReading::forced_required, {}, true));
  EXPECT_EQ(many["type"], "array");
  EXPECT_EQ(many["minItems"], 1);
  EXPECT_EQ(many["items"], one);
}

TEST(ForcedCallSchema, Errors) {
  const std::string tools = R"([{"type": "function", "function": {"name": "a"}}])";
  auto unknown = forced_call_schema(tools, CallReading::forced_function, "b", true);
  ASSERT_TRUE(std::holds_alternative<ToolSchemaError>(unknown));
  EXPECT_NE(std::get<ToolSchemaError>(unknown).message.find("'b'"), std::string::npos);
  EXPECT_TRUE(std::holds_alternative<ToolSchemaError>(forced_call_schema("", CallReading::forced_required, {}, true)));
  EXPECT_TRUE(std::holds_alternative<ToolSchemaError>(
      forced_call_schema(R"([{"type": "function"}])", CallReading::forced_required, {}, true)));
  EXPECT_TRUE(std::holds_alternative<ToolSchemaError>(forced_call_schema(
      R"([{"type": "function", "function": {"name": "a", "parameters": 3}}])", CallReading::forced_required, {}, true)));
}

}  // namespace
}  // namespace mqlm::model
