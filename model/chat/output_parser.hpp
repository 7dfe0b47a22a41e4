// A chat's generated text split into what OpenAI's API returns apart: the answer's content, the
// model's reasoning (<think> ... </think>) and the tool calls it made. Fed the text as it is
// generated, the parser returns what can be told apart so far and holds back only what may still
// be the start of a marker (as stop strings are held back) or a call not yet whole.
//
// What a model writes is decided once per model from its chat template (output_conventions):
// whether it reasons in <think> blocks, and which tool call format it was trained on:
//   hermes       <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, several in a row
//                for parallel calls (Hermes 2/3, Qwen 2.5 / 3, QwQ)
//   llama3_json  {"name": ..., "parameters": {...}} as the whole answer, optionally after
//                <|python_tag|> (Llama 3.1 / 3.2 / 3.3)
//   mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (Mistral Nemo), or
//                [TOOL_CALLS]name[ARGS]{...}, once per call (Mistral Small 3.2, Devstral)
// A request decides the rest (OutputParserSetup): whether its prompt opened the think block,
// and how calls are read: not at all (tool_choice none, or no tools), in the model's format
// (auto), or as the JSON a forced call's grammar makes the model write (forced_call_schema).
// Text that turns out not to be a valid call is content; content's leading and trailing
// whitespace, and whitespace beside calls, are dropped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace mqlm::model {

enum class ToolCallFormat : std::uint8_t { none, hermes, llama3_json, mistral };

// What a chat template's model writes, from the template's source.
struct OutputConventions {
  bool reasoning = false;  // it thinks in <think> ... </think> first
  ToolCallFormat tool_calls = ToolCallFormat::none;
};
OutputConventions output_conventions(std::string_view template_source);

// Whether a rendered prompt ends inside an opened <think> block (the generation prompt opened it,
// as DeepSeek-R1's and QwQ's do): the output then starts as reasoning.
bool prompt_opens_reasoning(std::string_view prompt);

// How a request's output is read for calls.
enum class CallReading : std::uint8_t {
  none,             // all content
  native,           // OutputParserSetup::format
  forced_function,  // the output is the arguments of OutputParserSetup::function
  forced_required,  // the output is {"name", "arguments"} or an array of them
};

struct OutputParserSetup {
  bool reasoning = false;            // split <think> ... </think> off
  bool starts_in_reasoning = false;  // the prompt opened the block
  CallReading calls = CallReading::none;
  ToolCallFormat format = ToolCallFormat::none;  // native's
  std::string function;                          // forced_function's name
  bool parallel = true;  // false: calls after the first are dropped (parallel_tool_calls false)
};

// A piece of call `index` (0, 1, ... in the order made): the first has the function's name,
// each a further part of the arguments' JSON text.
struct ToolCallPiece {
  std::uint32_t index = 0;
  std::string name;
  std::string arguments;
};

struct ParsedOutput {
  std::string content;
  std::string reasoning;
  std::vector<ToolCallPiece> calls;

  bool empty() const { return content.empty() && reasoning.empty() && calls.empty(); }
  void append(ParsedOutput more);
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserSetup setup);

  // What `text` (the next part of the output) and what was held back make, as far as it can be
  // told apart now.
  ParsedOutput push(std::string_view text);
  // The output ended: everything held back, as what it is (a call not closed that parses is a
  // call; anything else is content or reasoning).
  ParsedOutput finish();
  // Calls made so far.
  std::uint32_t calls() const { return calls_; }

 private:
  enum class State : std::uint8_t { content, reasoning, hermes_call, json_call, mistral_name, arguments };

  ParsedOutput drain(bool final);
  bool step(bool final, ParsedOutput& out);
  bool step_content(bool final, ParsedOutput& out);
  bool step_reasoning(bool final, ParsedOutput& out);
  bool step_hermes(bool final, ParsedOutput& out);
  bool step_json(bool final, ParsedOutput& out);
  bool step_mistral_name(bool final);
  void start_json();
  void add_content(std::string_view text, ParsedOutput& out);
  bool add_calls(std::string_view json, ParsedOutput& out);
  bool add_named_call(ParsedOutput& out);
  std::vector<std::string_view> content_markers() const;

  OutputParserSetup setup_;
  State state_ = State::content;
  std::string pending_;     // text not yet consumed
  std::string held_space_;  // content's whitespace, out only when more content follows
  std::string call_text_;   // a call's text so far (hermes body, JSON value)
  bool content_started_ = false;  // content other than whitespace went out
  bool expect_json_ = false;      // the next non-space character may open a JSON call
  bool named_call_next_ = false;  // ... or, after [TOOL_CALLS], a function's name and [ARGS]
  std::string call_name_;         // that name, while its arguments are read
  // The JSON value being read: nesting depth, inside a string, after a backslash there.
  int json_depth_ = 0;
  bool json_in_string_ = false, json_escape_ = false;
  std::uint32_t calls_ = 0;
};

// The JSON schema that constrains a forced call's output (response_format json_schema), from the
// request's tools (JSON text: [{"type": "function", "function": {name, parameters}}]):
// function: that function's parameters; required: {"name": one of the tools, "arguments": its
// parameters} (anyOf per tool), an array of one or more of them when parallel. An error says
// what is wrong with the tools.
struct ToolSchemaError {
  std::string message;
};
std::variant<std::string, ToolSchemaError> forced_call_schema(std::string_view tools_json, CallReading reading,
                                                              std::string_view function, bool parallel);

}  // namespace mqlm::model
