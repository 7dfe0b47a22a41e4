// `mqlm client -p TEXT`: one generate request to a running `mqlm serve` over its client protocol
// (docs/protocol.md); prints the text as it streams and a summary on stderr, or every event as a
// JSON line. `mqlm client --status` prints the server's status event.
//
// Exit codes: 0 when the request ends with stop or length; 1 when it ends otherwise (an error or
// abort), when the server sends something that is not an event or nothing for --timeout-ms;
// 2 for flags that make no request.
#include <algorithm>
#include <iostream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tools/command_options.hpp"
#include "tools/commands.hpp"
#include "tools/serve_client.hpp"

namespace mqlm::tools {

namespace {

using Clock = std::chrono::steady_clock;

struct ClientOptions {
  std::string server = "tcp://127.0.0.1:5555";
  std::string api_key;
  CurveClientFlags curve_flags;
  std::optional<actors::curve::ClientKeys> curve;  // read from curve_flags before the request
  std::string model;
  std::string prompt;
  std::vector<std::int32_t> tokens;
  std::string chat_user;
  std::string system;
  model::SamplingParams sampling;
  bool no_stream = false;
  std::int64_t timeout_ms = 30000;
  bool status = false;
  bool json = false;
  // Which way the prompt was given (set by the parser).
  CLI::Option* prompt_option = nullptr;
  CLI::Option* tokens_option = nullptr;
  CLI::Option* chat_option = nullptr;
  CLI::Option* system_option = nullptr;
};

std::string json_line(const nlohmann::json& j) {
  // Text is whole UTF-8 characters by the protocol; a server that breaks that gets U+FFFD
  // rather than an exception halfway through the output.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The flag that sets a sampling field, for validation errors.
std::string flag_for(const std::string& field) {
  auto starts = [&](std::string_view prefix) { return field.rfind(prefix, 0) == 0; };
  if (starts("max_tokens")) return "-n/--max-tokens";
  if (starts("stop_token_ids")) return "--stop-token";
  std::string flag = "--" + (starts("repetition_") ? "repeat_" + field.substr(11) : field);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

GenerateRequest build_request(const ClientOptions& o) {
  // count() is the number of values given (three for --tokens 1,2,3): each way counts once.
  const int ways = int{o.prompt_option->count() > 0} + int{o.tokens_option->count() > 0} +
                   int{o.chat_option->count() > 0};
  if (ways != 1) throw CommandFailed("give the prompt one way: -p TEXT, --tokens IDS or --chat-user TEXT", 2);
  if (o.system_option->count() > 0 && o.chat_option->count() == 0) {
    throw CommandFailed("--system goes with --chat-user", 2);
  }
  if (auto error = model::validate(o.sampling)) throw CommandFailed(flag_for(error->field) + ": " + error->message, 2);

  GenerateRequest request;
  request.api_key = o.api_key;
  request.id = std::int64_t{1};
  request.model = o.model;
  request.stream = !o.no_stream;
  request.sampling = o.sampling;
  if (o.prompt_option->count() > 0) {
    if (o.prompt.empty()) throw CommandFailed("the prompt is empty", 2);
    request.prompt = o.prompt;
  } else if (o.tokens_option->count() > 0) {
    request.prompt = o.tokens;
  } else {
    std::vector<ChatMessage> chat;
    if (o.system_option->count() > 0) chat.push_back({"system", o.system});
    chat.push_back({"user", o.chat_user});
    request.prompt = std::move(chat);
  }
  return request;
}

ServeClient connect(const ClientOptions& o) {
  auto connected = ServeClient::connect(o.server, o.curve);
  if (auto* why = std::get_if<std::string>(&connected)) throw CommandFailed(*why, 2);
  return std::move(std::get<ServeClient>(connected));
}

// The next event, or a CommandFailed (exit 1) that says why there is none.
ServeEvent next_event(ServeClient& client, const ClientOptions& o) {
  auto received = client.receive(std::chrono::milliseconds(o.timeout_ms));
  if (std::holds_alternative<NoEvent>(received)) {
    throw CommandFailed(fmt::format("no event from {} for {} ms: is `mqlm serve --listen {}` running? {}(--timeout-ms "
                                    "waits longer)", o.server, o.timeout_ms, o.server,
                                    o.curve ? "Is --curve-server-key its key, and your key's NAME.pub in its "
                                              "--curve-clients? "
                                            : "Does it serve CURVE (then give --curve-server-key and --curve-key)? "));
  }
  if (auto* bad = std::get_if<BadEvent>(&received)) {
    throw CommandFailed("the server sent a frame that is not a protocol event: " + bad->reason);
  }
  auto& event = std::get<ServeEvent>(received);
  if (o.json) std::cout << json_line(event.fields) << "\n" << std::flush;
  if (event.kind == EventKind::error) {
    throw CommandFailed(fmt::format("the server answered with an error: {}: {}", event.error_code,
                                    event.error_message));
  }
  return std::move(event);
}

void print_status(const ClientOptions& o) {
  ServeClient client = connect(o);
  if (!client.send_status(StatusRequest{std::nullopt, false, o.api_key})) {
    throw CommandFailed("cannot queue the status request");
  }
  // Anything else on a fresh connection is not for us; the status event is what is waited for.
  while (true) {
    ServeEvent event = next_event(client, o);
    if (event.kind != EventKind::status) continue;
    if (!o.json) std::cout << event.fields.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return;
  }
}

void print_logprobs(const std::vector<TokenLogprob>& logprobs) {
  for (const auto& lp : logprobs) {
    std::string line = fmt::format("  token {} logprob {:.4f}", lp.token, lp.logprob);
    for (std::size_t i = 0; i < lp.top.size(); ++i) {
      line += fmt::format("{}{} {:.4f}", i == 0 ? "; top: " : ", ", lp.top[i].first, lp.top[i].second);
    }
    std::cerr << line << "\n";
  }
}

std::string summary(const ServeEvent& final, std::optional<double> ttft_ms, double total_ms) {
  std::string line = fmt::format("finish: {}", to_string(*final.finish_reason));
  if (!final.stop.empty()) line += fmt::format(" ({})", nlohmann::json(final.stop).dump());
  if (final.usage) {
    line += fmt::format(", {} tokens (prompt {}, cached {})", final.usage->completion_tokens,
                        final.usage->prompt_tokens, final.usage->cached_tokens);
  }
  if (ttft_ms) line += fmt::format(", TTFT {:.1f} ms", *ttft_ms);
  line += fmt::format(", total {:.1f} ms", total_ms);
  if (final.timings) {
    line += fmt::format("; server: queue {:.1f} ms, TTFT {:.1f} ms, total {:.1f} ms", final.timings->queue_ms,
                        final.timings->ttft_ms, final.timings->total_ms);
  }
  return line;
}

void generate(const ClientOptions& o) {
  const GenerateRequest request = build_request(o);
  ServeClient client = connect(o);
  const auto sent = Clock::now();
  if (!client.send_generate(request)) throw CommandFailed("cannot queue the request");
  std::optional<double> ttft_ms;
  std::vector<TokenLogprob> logprobs;
  while (true) {
    ServeEvent event;
    try {
      event = next_event(client, o);
    } catch (const CommandFailed&) {
      (void)client.send_abort(request.id);  // the server need not finish what nobody reads
      throw;
    }
    if (event.kind == EventKind::status) continue;
    if (event.id != request.id) {
      spdlog::warn("client: an event for request {}, not ours", event.id ? to_string(*event.id) : "(none)");
      continue;
    }
    if (!ttft_ms && !event.tokens.empty()) {
      ttft_ms = std::chrono::duration<double, std::milli>(event.received_at - sent).count();
    }
    logprobs.insert(logprobs.end(), event.logprobs.begin(), event.logprobs.end());
    if (!o.json) std::cout << event.text << std::flush;
    if (event.kind != EventKind::final) continue;

    const double total_ms = std::chrono::duration<double, std::milli>(event.received_at - sent).count();
    if (!o.json) {
      std::cout << "\n" << std::flush;
      // Not streaming, the first token came with the final event: only the server knows when.
      std::cerr << summary(event, request.stream ? ttft_ms : std::nullopt, total_ms) << "\n";
      print_logprobs(logprobs);
    }
    switch (*event.finish_reason) {
      case FinishReason::stop:
      case FinishReason::length:
      case FinishReason::tool_calls: return;
      case FinishReason::abort: throw CommandFailed("the request was aborted by the server (is it stopping?)");
      case FinishReason::error:
        throw CommandFailed(fmt::format("the request failed: {}: {}",
                                        event.error_code.empty() ? "error" : event.error_code,
                                        event.error_message.empty() ? "(no message)" : event.error_message));
    }
  }
}

}  // namespace

void add_client_command(CLI::App& app) {
  auto o = std::make_shared<ClientOptions>();
  auto* cmd = app.add_subcommand("client", "send one request to a running `mqlm serve` and print what comes back");
  cmd->add_option("--server", o->server, "the server's address")->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "the server's API key, when it was given one")->envname("MQLM_API_KEY");
  add_curve_client_flags(*cmd, o->curve_flags);
  cmd->add_option("--model", o->model, "a model the server serves (default: its default)");
  o->prompt_option = cmd->add_option("-p,--prompt", o->prompt, "the prompt, as text");
  o->tokens_option = cmd->add_option("--tokens", o->tokens, "the prompt as token ids: 1,2,3")->delimiter(',');
  o->chat_option = cmd->add_option("--chat-user", o->chat_user, "the prompt as a chat: the user's message");
  o->system_option = cmd->add_option("--system", o->system, "with --chat-user: a system message first");
  add_sampling_flags(*cmd, o->sampling);
  cmd->add_option("--stop-token", o->sampling.stop_token_ids, "a token id that ends the output (repeatable)");
  add_logprobs_flags(*cmd, o->sampling, "printed on stderr, or in the final event with --json");
  cmd->add_flag("--no-stream", o->no_stream, "ask for the whole output in the final event only");
  cmd->add_option("--timeout-ms", o->timeout_ms, "no event for this long is an error")->capture_default_str();
  cmd->add_flag("--status", o->status, "print the server's status instead of generating");
  cmd->add_flag("--json", o->json, "print every event as a JSON line instead of text");
  cmd->callback([o] {
    if (o->timeout_ms < 1) throw CommandFailed("--timeout-ms must be at least 1", 2);
    o->curve = read_curve_client_flags(o->curve_flags);
    if (o->status) {
      if (o->prompt_option->count() + o->tokens_option->count() + o->chat_option->count() > 0) {
        throw CommandFailed("--status sends no prompt: leave out -p, --tokens and --chat-user", 2);
      }
      print_status(*o);
    } else {
      generate(*o);
    }
  });
}

}  // namespace mqlm::tools
