#include "tools/serve_client.hpp"

#include <limits>

#include <fmt/format.h>
#include <msgpack.hpp>

#include "messages/codec.hpp"

namespace mqlm::tools {

using nlohmann::json;

std::string to_string(const RequestId& id) {
  if (const auto* number = std::get_if<std::int64_t>(&id)) return std::to_string(*number);
  return std::get<std::string>(id);
}

std::string_view to_string(EventKind kind) {
  switch (kind) {
    case EventKind::token: return "token";
    case EventKind::final: return "final";
    case EventKind::error: return "error";
    case EventKind::status: return "status";
  }
  return "?";
}

std::string_view to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
    case FinishReason::error: return "error";
    case FinishReason::tool_calls: return "tool_calls";
  }
  return "?";
}

// ---- requests -------------------------------------------------------------------------------

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_id(Packer& p, const RequestId& id) {
  std::visit([&](const auto& value) { p.pack(value); }, id);
}

// Floats go out as float64, as most clients' (Python's, JSON's) floats do.
void pack_sampling(Packer& p, const model::SamplingParams& s) {
  p.pack("max_tokens"), p.pack(s.max_tokens);
  p.pack("temperature"), p.pack(double{s.temperature});
  p.pack("top_k"), p.pack(s.top_k);
  p.pack("top_p"), p.pack(double{s.top_p});
  p.pack("min_p"), p.pack(double{s.min_p});
  p.pack("repetition_penalty"), p.pack(double{s.repetition_penalty});
  p.pack("repetition_last_n"), p.pack(s.repetition_last_n);
  p.pack("presence_penalty"), p.pack(double{s.presence_penalty});
  p.pack("frequency_penalty"), p.pack(double{s.frequency_penalty});
  p.pack("seed"), p.pack(s.seed);
  p.pack("stop"), p.pack(s.stop);
  p.pack("stop_token_ids"), p.pack(s.stop_token_ids);
  p.pack("logprobs"), p.pack(s.logprobs);
  p.pack("top_logprobs"), p.pack(s.top_logprobs);
  // Older servers do not know the keys below: they go only when asked for.
  if (!s.logit_bias.empty()) {
    p.pack("logit_bias");
    p.pack_map(static_cast<std::uint32_t>(s.logit_bias.size()));
    for (const model::TokenBias& entry : s.logit_bias) p.pack(entry.token), p.pack(double{entry.bias});
  }
  if (const model::ResponseFormat& f = s.response_format; f.constrained()) {
    const bool schema = f.kind == static_cast<std::uint8_t>(model::ResponseKind::json_schema);
    p.pack("response_format");
    p.pack_map(schema ? 3 : 1);
    p.pack("type"), p.pack(schema ? "json_schema" : "json_object");
    if (schema) p.pack("schema"), p.pack(f.schema), p.pack("strict"), p.pack(f.strict);
  }
}
std::uint32_t sampling_keys(const model::SamplingParams& s) {
  return 14 + (s.logit_bias.empty() ? 0 : 1) + (s.response_format.constrained() ? 1 : 0);
}

void pack_prompt(Packer& p, const Prompt& prompt) {
  if (const auto* text = std::get_if<std::string>(&prompt)) {
    p.pack("prompt"), p.pack(*text);
  } else if (const auto* tokens = std::get_if<std::vector<std::int32_t>>(&prompt)) {
    p.pack("tokens"), p.pack(*tokens);
  } else {
    const auto& messages = std::get<std::vector<ChatMessage>>(prompt);
    p.pack("messages");
    p.pack_array(static_cast<std::uint32_t>(messages.size()));
    for (const auto& m : messages) {
      p.pack_map(2);
      p.pack("role"), p.pack(m.role);
      p.pack("content"), p.pack(m.content);
    }
  }
}

std::string to_string(const msgpack::sbuffer& buffer) { return std::string(buffer.data(), buffer.size()); }

}  // namespace

std::string encode_generate(const GenerateRequest& r) {
  msgpack::sbuffer buffer;
  Packer p(buffer);
  p.pack_map(4 + sampling_keys(r.sampling) + (r.model.empty() ? 0 : 1) + (r.api_key.empty() ? 0 : 1) +
             (r.draft_max ? 1 : 0));
  p.pack("op"), p.pack("generate");
  if (!r.api_key.empty()) p.pack("api_key"), p.pack(r.api_key);
  p.pack("id"), pack_id(p, r.id);
  if (!r.model.empty()) p.pack("model"), p.pack(r.model);
  pack_prompt(p, r.prompt);
  p.pack("stream"), p.pack(r.stream);
  pack_sampling(p, r.sampling);
  if (r.draft_max) p.pack("draft_max"), p.pack(*r.draft_max);
  return to_string(buffer);
}

std::string encode_abort(const RequestId& id, const std::string& api_key) {
  msgpack::sbuffer buffer;
  Packer p(buffer);
  p.pack_map(2 + (api_key.empty() ? 0 : 1));
  p.pack("op"), p.pack("abort");
  if (!api_key.empty()) p.pack("api_key"), p.pack(api_key);
  p.pack("id"), pack_id(p, id);
  return to_string(buffer);
}

std::string encode_status(const StatusRequest& r) {
  msgpack::sbuffer buffer;
  Packer p(buffer);
  p.pack_map(1 + (r.id ? 1 : 0) + (r.trim ? 1 : 0) + (r.api_key.empty() ? 0 : 1));
  p.pack("op"), p.pack("status");
  if (!r.api_key.empty()) p.pack("api_key"), p.pack(r.api_key);
  if (r.id) p.pack("id"), pack_id(p, *r.id);
  if (r.trim) p.pack("trim"), p.pack(true);
  return to_string(buffer);
}

// ---- events ---------------------------------------------------------------------------------

namespace {

// The JSON value of an unpacked frame. messages::unpack_untrusted has bounded the nesting (so
// this recursion is shallow) and the element counts; what the protocol never sends is rejected
// here: non-string or repeated map keys, binary and extension values.
std::optional<std::string> to_json(const msgpack::object& o, json& out) {
  switch (o.type) {
    case msgpack::type::NIL: out = nullptr; return {};
    case msgpack::type::BOOLEAN: out = o.via.boolean; return {};
    case msgpack::type::POSITIVE_INTEGER: out = o.via.u64; return {};
    case msgpack::type::NEGATIVE_INTEGER: out = o.via.i64; return {};
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: out = o.via.f64; return {};
    case msgpack::type::STR: out = std::string(o.via.str.ptr, o.via.str.size); return {};
    case msgpack::type::ARRAY:
      out = json::array();
      for (std::uint32_t i = 0; i < o.via.array.size; ++i) {
        if (auto problem = to_json(o.via.array.ptr[i], out.emplace_back())) return problem;
      }
      return {};
    case msgpack::type::MAP:
      out = json::object();
      for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
        const msgpack::object_kv& kv = o.via.map.ptr[i];
        if (kv.key.type != msgpack::type::STR) return "a map key that is not a string";
        std::string key(kv.key.via.str.ptr, kv.key.via.str.size);
        if (out.contains(key)) return "the key '" + key + "' appears twice";
        if (auto problem = to_json(kv.val, out[key])) return problem;
      }
      return {};
    case msgpack::type::BIN: return "a binary value (the protocol sends none)";
    case msgpack::type::EXT: return "an extension value (the protocol sends none)";
  }
  return "an unknown msgpack type";
}

// Reading typed fields out of the event map: each reader leaves `out` alone when the key is
// absent and returns a problem when it is there with the wrong type or out of range.
using Problem = std::optional<std::string>;

const json* find(const json& map, const char* key) {
  auto it = map.find(key);
  return it == map.end() ? nullptr : &*it;
}

Problem read_string(const json& map, const char* key, std::string& out) {
  const json* v = find(map, key);
  if (!v) return {};
  if (!v->is_string()) return fmt::format("'{}' is {}, not a string", key, v->type_name());
  out = v->get<std::string>();
  return {};
}

Problem read_int(const json& v, const std::string& what, std::int64_t low, std::int64_t high, std::int64_t& out) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(high)) return fmt::format("{} = {} is above {}", what, u, high);
    out = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    out = v.get<std::int64_t>();
  } else {
    return fmt::format("{} is {}, not an integer", what, v.type_name());
  }
  if (out < low || out > high) return fmt::format("{} = {} is outside [{}, {}]", what, out, low, high);
  return {};
}

Problem read_number(const json& v, const std::string& what, double& out) {
  if (!v.is_number()) return fmt::format("{} is {}, not a number", what, v.type_name());
  out = v.get<double>();
  return {};
}

constexpr std::int64_t kMaxToken = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kMaxCount = std::numeric_limits<std::int64_t>::max();

Problem read_token(const json& v, const std::string& what, std::int32_t& out) {
  std::int64_t id = 0;
  if (auto p = read_int(v, what, 0, kMaxToken, id)) return p;
  out = static_cast<std::int32_t>(id);
  return {};
}

Problem read_tokens(const json& map, std::vector<std::int32_t>& out) {
  const json* v = find(map, "tokens");
  if (!v) return {};
  if (!v->is_array()) return fmt::format("'tokens' is {}, not an array", v->type_name());
  out.resize(v->size());
  for (std::size_t i = 0; i < v->size(); ++i) {
    if (auto p = read_token((*v)[i], fmt::format("tokens[{}]", i), out[i])) return p;
  }
  return {};
}

Problem read_logprob(const json& v, const std::string& where, TokenLogprob& out) {
  if (!v.is_object()) return where + " is not a map";
  const json* token = find(v, "token");
  const json* logprob = find(v, "logprob");
  if (!token || !logprob) return where + " lacks 'token' or 'logprob'";
  if (auto p = read_token(*token, where + ".token", out.token)) return p;
  if (auto p = read_number(*logprob, where + ".logprob", out.logprob)) return p;
  const json* top = find(v, "top");
  if (!top) return {};
  if (!top->is_array()) return where + ".top is not an array";
  for (std::size_t i = 0; i < top->size(); ++i) {
    const json& pair = (*top)[i];
    const std::string at = fmt::format("{}.top[{}]", where, i);
    if (!pair.is_array() || pair.size() != 2) return at + " is not a [token, logprob] pair";
    auto& [alt_token, alt_logprob] = out.top.emplace_back();
    if (auto p = read_token(pair[0], at, alt_token)) return p;
    if (auto p = read_number(pair[1], at, alt_logprob)) return p;
  }
  return {};
}

Problem read_logprobs(const json& map, std::vector<TokenLogprob>& out) {
  const json* v = find(map, "logprobs");
  if (!v) return {};
  if (!v->is_array()) return fmt::format("'logprobs' is {}, not an array", v->type_name());
  out.resize(v->size());
  for (std::size_t i = 0; i < v->size(); ++i) {
    if (auto p = read_logprob((*v)[i], fmt::format("logprobs[{}]", i), out[i])) return p;
  }
  return {};
}

Problem read_id(const json& map, std::optional<RequestId>& out) {
  const json* v = find(map, "id");
  if (!v) return {};
  if (v->is_string()) {
    out = v->get<std::string>();
    return {};
  }
  std::int64_t number = 0;
  if (auto p = read_int(*v, "'id'", std::numeric_limits<std::int64_t>::min(), kMaxCount, number)) {
    return "'id' is neither a string nor a 64-bit integer";
  }
  out = number;
  return {};
}

Problem read_usage(const json& map, std::optional<Usage>& out) {
  const json* v = find(map, "usage");
  if (!v) return {};
  if (!v->is_object()) return "'usage' is not a map";
  Usage usage;
  for (auto [key, field] : {std::pair{"prompt_tokens", &usage.prompt_tokens},
                            std::pair{"completion_tokens", &usage.completion_tokens},
                            std::pair{"cached_tokens", &usage.cached_tokens}}) {
    if (const json* count = find(*v, key)) {
      if (auto p = read_int(*count, std::string("usage.") + key, 0, kMaxCount, *field)) return p;
    }
  }
  out = usage;
  return {};
}

Problem read_timings(const json& map, std::optional<Timings>& out) {
  const json* v = find(map, "timings");
  if (!v) return {};
  if (!v->is_object()) return "'timings' is not a map";
  Timings timings;
  for (auto [key, field] : {std::pair{"queue_ms", &timings.queue_ms}, std::pair{"ttft_ms", &timings.ttft_ms},
                            std::pair{"total_ms", &timings.total_ms}}) {
    if (const json* ms = find(*v, key)) {
      if (auto p = read_number(*ms, std::string("timings.") + key, *field)) return p;
    }
  }
  out = timings;
  return {};
}

Problem read_finish(const json& map, std::optional<FinishReason>& out) {
  std::string reason;
  if (!find(map, "finish_reason")) return "a final event without 'finish_reason'";
  if (auto p = read_string(map, "finish_reason", reason)) return p;
  for (auto r : {FinishReason::stop, FinishReason::length, FinishReason::tool_calls, FinishReason::abort,
                 FinishReason::error}) {
    if (reason == to_string(r)) {
      out = r;
      return {};
    }
  }
  return "unknown finish_reason '" + reason + "'";
}

// The request's error, in a final event: {"code", "message"}.
Problem read_error_map(const json& map, ServeEvent& e) {
  const json* v = find(map, "error");
  if (!v) return {};
  if (!v->is_object()) return "'error' is not a map";
  if (auto p = read_string(*v, "code", e.error_code)) return "error." + *p;
  return read_string(*v, "message", e.error_message);
}

Problem read_event(const json& map, ServeEvent& e) {
  std::string kind;
  if (!find(map, "event")) return "a map without 'event'";
  if (auto p = read_string(map, "event", kind)) return p;
  if (kind == "token") {
    e.kind = EventKind::token;
  } else if (kind == "final") {
    e.kind = EventKind::final;
  } else if (kind == "error") {
    e.kind = EventKind::error;
  } else if (kind == "status") {
    e.kind = EventKind::status;
  } else {
    return "unknown event '" + kind + "'";
  }
  if (auto p = read_id(map, e.id)) return p;
  if ((e.kind == EventKind::token || e.kind == EventKind::final) && !e.id) return "a " + kind + " event without 'id'";
  if (auto p = read_tokens(map, e.tokens)) return p;
  if (auto p = read_string(map, "text", e.text)) return p;
  if (auto p = read_logprobs(map, e.logprobs)) return p;
  if (e.kind == EventKind::final) {
    if (auto p = read_finish(map, e.finish_reason)) return p;
    if (auto p = read_string(map, "stop", e.stop)) return p;
    if (auto p = read_usage(map, e.usage)) return p;
    if (auto p = read_timings(map, e.timings)) return p;
    if (auto p = read_error_map(map, e)) return p;
  }
  if (e.kind == EventKind::error) {
    if (auto p = read_string(map, "code", e.error_code)) return p;
    if (auto p = read_string(map, "message", e.error_message)) return p;
  }
  return {};
}

}  // namespace

std::variant<ServeEvent, BadEvent> decode_event(std::span<const std::byte> frame) {
  if (frame.empty()) return BadEvent{"an empty frame (a keepalive, not an event)"};
  if (frame.size() > kMaxEventBytes) {
    return BadEvent{fmt::format("a frame of {} bytes, above the limit of {}", frame.size(), kMaxEventBytes)};
  }
  auto unpacked = messages::unpack_untrusted(frame, "event");
  if (auto* error = std::get_if<messages::DecodeError>(&unpacked)) return BadEvent{error->detail};
  const msgpack::object& root = std::get<msgpack::object_handle>(unpacked).get();
  if (root.type != msgpack::type::MAP) return BadEvent{"a frame that is not a msgpack map"};
  ServeEvent event;
  if (auto problem = to_json(root, event.fields)) return BadEvent{*problem};
  if (auto problem = read_event(event.fields, event)) return BadEvent{*problem};
  return event;
}

// ---- the socket -----------------------------------------------------------------------------

std::variant<ServeClient, std::string> ServeClient::connect(const std::string& endpoint,
                                                            const std::optional<actors::curve::ClientKeys>& curve) {
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  // Long enough for a last abort to leave when the client exits, short enough not to hang an
  // exit when the server is gone.
  socket.set(zmq::sockopt::linger, 1000);
  // Detects a server that vanished without closing the connection (the protocol's advice).
  socket.set(zmq::sockopt::heartbeat_ivl, 5000);
  socket.set(zmq::sockopt::heartbeat_timeout, 15000);
  if (curve) actors::curve::set_client_options(socket, *curve);
  try {
    socket.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return fmt::format("cannot connect to '{}': {} (give tcp://HOST:PORT or ipc://PATH)", endpoint, e.what());
  }
  return ServeClient(endpoint, std::move(context), std::move(socket));
}

bool ServeClient::send(const std::string& frame) {
  return socket_.send(zmq::buffer(frame), zmq::send_flags::dontwait).has_value();
}

bool ServeClient::send_generate(const GenerateRequest& request) { return send(encode_generate(request)); }
bool ServeClient::send_abort(const RequestId& id, const std::string& api_key) {
  return send(encode_abort(id, api_key));
}
bool ServeClient::send_status(const StatusRequest& request) { return send(encode_status(request)); }

Received ServeClient::receive(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    std::vector<zmq::pollitem_t> items{{socket_.handle(), 0, ZMQ_POLLIN, 0}};
    if (zmq::poll(items, std::max(left, std::chrono::milliseconds(0))) == 0) return NoEvent{};
    zmq::message_t frame;
    if (!socket_.recv(frame, zmq::recv_flags::dontwait)) continue;
    const auto received_at = Clock::now();
    if (frame.more()) {
      // Drain the rest, so the next receive starts at a message boundary.
      while (frame.more() && socket_.recv(frame, zmq::recv_flags::dontwait)) {
      }
      return BadEvent{"a message of several frames (the protocol sends one frame per event)"};
    }
    if (frame.size() == 0) continue;  // a keepalive
    auto decoded = decode_event(std::span(static_cast<const std::byte*>(frame.data()), frame.size()));
    if (auto* bad = std::get_if<BadEvent>(&decoded)) return *bad;
    auto& event = std::get<ServeEvent>(decoded);
    event.received_at = received_at;
    return std::move(event);
  }
}

}  // namespace mqlm::tools
