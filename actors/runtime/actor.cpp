#include "actors/runtime/actor.hpp"

#include <spdlog/spdlog.h>

namespace mqlm::actors {

using namespace messages;

std::int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Frames make_frames(const std::string& from, const std::string& to, const Payload& payload,
                   SendOptions options) {
  Envelope envelope;
  envelope.from = from;
  envelope.to = to;
  envelope.correlation_id = options.correlation_id;
  envelope.request_id = options.request_id;
  envelope.sent_ns = monotonic_ns();
  return encode(std::move(envelope), payload, std::move(options.blobs));
}

SendStatus Context::send(const std::string& to, Payload payload, SendOptions options) {
  WhenFull policy = when_full(kind_of(payload));
  return deliver(to, make_frames(self(), to, payload, std::move(options)), policy);
}

SendStatus Context::reply(const Message& to_message, Payload payload, Frames blobs) {
  return send(to_message.envelope.from, std::move(payload),
              SendOptions{to_message.envelope.correlation_id, to_message.envelope.request_id,
                          std::move(blobs)});
}

Dispatcher::Outcome Dispatcher::dispatch(Context& ctx, Frames frames) {
  DecodeResult decoded = decode(std::move(frames));
  if (auto* error = std::get_if<DecodeError>(&decoded)) {
    ++stats_.malformed;
    spdlog::warn("{}: dropped a message: {} ({})", name_, error->detail, error_code_name(error->code));
    // Answer only a sender we can name, and never an Error with an Error (no ping-pong).
    if (error->envelope && error->envelope->kind != Kind::Error) {
      ctx.send(error->envelope->from,
               messages::Error{static_cast<std::uint16_t>(error->code), error->detail,
                               static_cast<std::uint8_t>(error->envelope->kind)},
               SendOptions{error->envelope->correlation_id, error->envelope->request_id, {}});
    }
    return Outcome::malformed;
  }
  Message& message = std::get<Message>(decoded);
  ++stats_.handled;
  if (message.kind() == Kind::Stop) {
    if (stopping_) return Outcome::handled;  // the first Stop is the one answered
    stopping_ = true;
    stop_ = std::move(message);
    return Outcome::stop;
  }
  if (const auto* beat = message.as<Heartbeat>()) {
    ++stats_.heartbeats;
    ctx.reply(message, HeartbeatAck{beat->seq});
    return Outcome::handled;
  }
  actor_.on_message(ctx, message);
  return Outcome::handled;
}

}  // namespace mqlm::actors
