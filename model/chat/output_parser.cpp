#include "model/chat/output_parser.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

namespace mqlm::model {

namespace {

constexpr std::string_view kSpace = " \t\r\n";
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralArgs = "[ARGS]";

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

// Where the text's tail that may still become one of the markers starts (text.size(): none).
std::size_t hold_point(std::string_view text, const std::vector<std::string_view>& markers) {
  std::size_t longest = 0;
  for (auto marker : markers) longest = std::max(longest, marker.size());
  const std::size_t from = text.size() >= longest ? text.size() - longest + 1 : 0;
  for (std::size_t i = from; i < text.size(); ++i) {
    const std::string_view tail = text.substr(i);
    for (auto marker : markers) {
      if (marker.size() > tail.size() && marker.starts_with(tail)) return i;
    }
  }
  return text.size();
}

// The earliest marker in the text: its position (npos: none) and which.
std::pair<std::size_t, std::string_view> first_marker(std::string_view text,
                                                      const std::vector<std::string_view>& markers) {
  std::pair<std::size_t, std::string_view> first{std::string_view::npos, {}};
  for (auto marker : markers) {
    const std::size_t at = text.find(marker);
    if (at < first.first) first = {at, marker};
  }
  return first;
}

// A call read from JSON: {"name": "...", "arguments" (or Llama's "parameters"): an object, or the
// object's JSON as a string}.
std::optional<ToolCallPiece> call_from(const nlohmann::ordered_json& call) {
  if (!call.is_object()) return std::nullopt;
  auto name = call.find("name");
  if (name == call.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  auto arguments = call.find("arguments");
  if (arguments == call.end()) arguments = call.find("parameters");
  ToolCallPiece piece;
  piece.name = name->get<std::string>();
  if (arguments == call.end()) {
    piece.arguments = "{}";
  } else if (arguments->is_string()) {
    piece.arguments = arguments->get<std::string>();
  } else if (arguments->is_object()) {
    piece.arguments = arguments->dump();
  } else {
    return std::nullopt;
  }
  return piece;
}

void add_piece(std::vector<ToolCallPiece>& calls, ToolCallPiece piece) {
  if (!calls.empty() && calls.back().index == piece.index && piece.name.empty()) {
    calls.back().arguments += piece.arguments;
  } else {
    calls.push_back(std::move(piece));
  }
}

}  // namespace

OutputConventions output_conventions(std::string_view source) {
  OutputConventions conventions;
  conventions.reasoning = contains(source, kThinkClose);
  if (contains(source, kHermesOpen)) {
    conventions.tool_calls = ToolCallFormat::hermes;
  } else if (contains(source, kMistralCalls)) {
    conventions.tool_calls = ToolCallFormat::mistral;
  } else if (contains(source, kPythonTag) ||
             (contains(source, "<|start_header_id|>") && contains(source, "\"parameters\""))) {
    conventions.tool_calls = ToolCallFormat::llama3_json;
  }
  return conventions;
}

bool prompt_opens_reasoning(std::string_view prompt) {
  const std::size_t end = prompt.find_last_not_of(kSpace);
  return end != std::string_view::npos && prompt.substr(0, end + 1).ends_with(kThinkOpen);
}

void ParsedOutput::append(ParsedOutput more) {
  content += more.content;
  reasoning += more.reasoning;
  for (auto& piece : more.calls) add_piece(calls, std::move(piece));
}

OutputParser::OutputParser(OutputParserSetup setup) : setup_(std::move(setup)) {
  if (setup_.calls == CallReading::forced_function) {
    state_ = State::arguments;
  } else if (setup_.reasoning && setup_.starts_in_reasoning) {
    state_ = State::reasoning;
  }
  // Llama's and Mistral's calls may be the whole answer, without a marker before them.
  expect_json_ = setup_.calls == CallReading::forced_required ||
                 (setup_.calls == CallReading::native &&
                  (setup_.format == ToolCallFormat::llama3_json || setup_.format == ToolCallFormat::mistral));
}

ParsedOutput OutputParser::push(std::string_view text) {
  pending_ += text;
  return drain(false);
}

ParsedOutput OutputParser::finish() {
  ParsedOutput out = drain(true);
  held_space_.clear();
  if (state_ == State::arguments && calls_ == 0) {
    out.calls.push_back({0, setup_.function, {}});
    calls_ = 1;
  }
  return out;
}

ParsedOutput OutputParser::drain(bool final) {
  ParsedOutput out;
  while (step(final, out)) {
  }
  return out;
}

// One move of the state machine; false when nothing more can be done with what is pending.
bool OutputParser::step(bool final, ParsedOutput& out) {
  switch (state_) {
    case State::content: return step_content(final, out);
    case State::reasoning: return step_reasoning(final, out);
    case State::hermes_call: return step_hermes(final, out);
    case State::json_call: return step_json(final, out);
    case State::mistral_name: return step_mistral_name(final);
    case State::arguments:
      if (pending_.empty()) return false;
      add_piece(out.calls, {0, calls_ == 0 ? setup_.function : std::string{}, std::move(pending_)});
      pending_.clear();
      calls_ = 1;
      return false;
  }
  return false;
}

std::vector<std::string_view> OutputParser::content_markers() const {
  std::vector<std::string_view> markers;
  if (setup_.reasoning) markers.push_back(kThinkOpen);
  if (setup_.calls != CallReading::native) return markers;
  if (setup_.format == ToolCallFormat::hermes) markers.push_back(kHermesOpen);
  if (setup_.format == ToolCallFormat::mistral) markers.push_back(kMistralCalls);
  if (setup_.format == ToolCallFormat::llama3_json) markers.push_back(kPythonTag);
  return markers;
}

bool OutputParser::step_content(bool final, ParsedOutput& out) {
  if (pending_.empty()) return false;
  const auto markers = content_markers();
  if (expect_json_) {
    const std::size_t first = pending_.find_first_not_of(kSpace);
    if (first == std::string::npos) {
      held_space_ += pending_;
      pending_.clear();
      return false;
    }
    // "[TOOL_CALLS]" opens with a bracket too: a marker, or what may become one, goes first.
    const std::string_view rest = std::string_view(pending_).substr(first);
    const bool marker_next = std::any_of(markers.begin(), markers.end(), [&](std::string_view marker) {
      return rest.starts_with(marker) || (!final && marker.starts_with(rest));
    });
    if (marker_next && !final && hold_point(rest, markers) == 0) return false;
    if (!marker_next) {
      expect_json_ = false;
      const bool named = std::exchange(named_call_next_, false);
      const bool opens_json = pending_[first] == '{' || pending_[first] == '[';
      if (opens_json || named) {
        held_space_.append(pending_, 0, first);
        pending_.erase(0, first);
        state_ = opens_json ? State::json_call : State::mistral_name;
        start_json();
        return true;
      }
    }
  }
  const auto [at, marker] = first_marker(pending_, markers);
  const std::size_t end = at != std::string::npos ? at : final ? pending_.size() : hold_point(pending_, markers);
  add_content(std::string_view(pending_).substr(0, end), out);
  if (at == std::string::npos) {
    pending_.erase(0, end);
    return false;
  }
  pending_.erase(0, at + marker.size());
  // Whitespace before a call is dropped once it is one (add_calls); before a think block, now.
  if (marker == kThinkOpen) {
    held_space_.clear();
    state_ = State::reasoning;
  } else if (marker == kHermesOpen) {
    state_ = State::hermes_call;
  } else {
    expect_json_ = true;  // [TOOL_CALLS], <|python_tag|>: JSON follows (or Mistral's name[ARGS])
    named_call_next_ = marker == kMistralCalls;
  }
  return true;
}

void OutputParser::start_json() {
  call_text_.clear();
  call_name_.clear();
  json_depth_ = 0;
  json_in_string_ = json_escape_ = false;
}

// [TOOL_CALLS]name[ARGS]{...}: the name up to [ARGS], then its arguments as a JSON value; anything
// else where the name stands is content.
bool OutputParser::step_mistral_name(bool final) {
  std::size_t i = 0;
  while (i < pending_.size() && name_char(pending_[i])) ++i;
  const std::string_view rest = std::string_view(pending_).substr(i);
  if (i > 0 && rest.starts_with(kMistralArgs)) {
    call_name_ = pending_.substr(0, i);
    pending_.erase(0, i + kMistralArgs.size());
    state_ = State::json_call;
    return true;
  }
  if (!final && kMistralArgs.starts_with(rest)) return false;  // the name, or [ARGS], not whole yet
  state_ = State::content;
  return true;
}

bool OutputParser::step_reasoning(bool final, ParsedOutput& out) {
  const std::size_t at = pending_.find(kThinkClose);
  if (at != std::string::npos) {
    out.reasoning.append(pending_, 0, at);
    pending_.erase(0, at + kThinkClose.size());
    state_ = State::content;
    return true;
  }
  const std::size_t end = final ? pending_.size() : hold_point(pending_, {kThinkClose});
  out.reasoning.append(pending_, 0, end);
  pending_.erase(0, end);
  return false;
}

// <tool_call> ... </tool_call>: the body whole, then a call or, not one, content as written.
bool OutputParser::step_hermes(bool final, ParsedOutput& out) {
  const std::size_t at = pending_.find(kHermesClose);
  if (at == std::string::npos && !final) return false;
  const std::string body = pending_.substr(0, at);
  pending_.erase(0, at == std::string::npos ? pending_.size() : at + kHermesClose.size());
  state_ = State::content;
  if (!add_calls(body, out)) {
    add_content(std::string(kHermesOpen) + body + std::string(at == std::string::npos ? "" : kHermesClose), out);
  }
  return true;
}

// A JSON value read to its end (brackets counted outside strings), then calls or content.
bool OutputParser::step_json(bool final, ParsedOutput& out) {
  std::size_t i = 0;
  bool whole = false;
  for (; i < pending_.size() && !whole; ++i) {
    const char c = pending_[i];
    if (json_in_string_) {
      if (json_escape_) {
        json_escape_ = false;
      } else if (c == '\\') {
        json_escape_ = true;
      } else if (c == '"') {
        json_in_string_ = false;
      }
    } else if (c == '"') {
      json_in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++json_depth_;
    } else if (c == '}' || c == ']') {
      whole = --json_depth_ == 0;
    }
  }
  call_text_.append(pending_, 0, i);
  pending_.erase(0, i);
  if (!whole && !final) return false;
  state_ = State::content;
  if (call_name_.empty() ? add_calls(call_text_, out) : add_named_call(out)) {
    expect_json_ = true;  // another may follow
  } else {
    add_content(call_name_.empty() ? call_text_ : call_name_ + std::string(kMistralArgs) + call_text_, out);
  }
  start_json();
  return true;
}

// Content with its whitespace held: leading whitespace dropped, and whitespace out only when
// more content follows it.
void OutputParser::add_content(std::string_view text, ParsedOutput& out) {
  const std::size_t last = text.find_last_not_of(kSpace);
  if (last == std::string_view::npos) {
    if (content_started_) held_space_ += text;
    return;
  }
  const std::size_t first = content_started_ ? 0 : text.find_first_not_of(kSpace);
  if (content_started_) out.content += held_space_;
  out.content.append(text.substr(first, last + 1 - first));
  held_space_ = std::string(text.substr(last + 1));
  content_started_ = true;
}

// call_name_'s call, with call_text_ as its arguments (an object); false when they are not one.
bool OutputParser::add_named_call(ParsedOutput& out) {
  const auto arguments = nlohmann::ordered_json::parse(call_text_, nullptr, false);
  if (!arguments.is_object()) return false;
  return add_calls(nlohmann::ordered_json{{"name", call_name_}, {"arguments", arguments}}.dump(), out);
}

// The calls in `json` (a call object or an array of them), each whole; false (nothing added)
// when it is not that.
bool OutputParser::add_calls(std::string_view json, ParsedOutput& out) {
  const auto value = nlohmann::ordered_json::parse(json, nullptr, false);
  if (value.is_discarded()) return false;
  std::vector<ToolCallPiece> found;
  if (value.is_array()) {
    for (const auto& element : value) {
      auto call = call_from(element);
      if (!call) return false;
      found.push_back(std::move(*call));
    }
  } else if (auto call = call_from(value)) {
    found.push_back(std::move(*call));
  }
  if (found.empty()) return false;
  held_space_.clear();  // whitespace before a call
  for (auto& call : found) {
    if (!setup_.parallel && calls_ > 0) break;
    call.index = calls_++;
    out.calls.push_back(std::move(call));
  }
  return true;
}

std::variant<std::string, ToolSchemaError> forced_call_schema(std::string_view tools_json, CallReading reading,
                                                              std::string_view function, bool parallel) {
  using json = nlohmann::ordered_json;
  const auto tools = json::parse(tools_json, nullptr, false);
  if (tools.is_discarded() || !tools.is_array() || tools.empty()) {
    return ToolSchemaError{"tools: a forced tool_choice needs tools, an array of functions"};
  }
  json calls = json::array();
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const json& tool = tools[i];
    const json* described = tool.is_object() && tool.contains("function") ? &tool["function"] : nullptr;
    if (described == nullptr || !described->is_object() || !described->contains("name") ||
        !(*described)["name"].is_string()) {
      return ToolSchemaError{"tools[" + std::to_string(i) + "]: not {\"type\": \"function\", \"function\": {name, ...}}"};
    }
    const std::string name = (*described)["name"];
    json parameters = described->value("parameters", json::object());
    if (!parameters.is_object()) {
      return ToolSchemaError{"tools[" + std::to_string(i) + "].function.parameters: not a JSON schema object"};
    }
    if (parameters.empty()) parameters = json{{"type", "object"}};
    if (reading == CallReading::forced_function && name == function) return parameters.dump();
    calls.push_back(json{{"type", "object"},
                         {"properties", {{"name", {{"const", name}}}, {"arguments", std::move(parameters)}}},
                         {"required", {"name", "arguments"}},
                         {"additionalProperties", false}});
  }
  if (reading == CallReading::forced_function) {
    return ToolSchemaError{"tool_choice names function '" + std::string(function) + "', which is not among the tools"};
  }
  json call = calls.size() == 1 ? std::move(calls[0]) : json{{"anyOf", std::move(calls)}};
  if (!parallel) return call.dump();
  return json{{"type", "array"}, {"items", std::move(call)}, {"minItems", 1}}.dump();
}

}  // namespace mqlm::model
