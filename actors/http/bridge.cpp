#include "actors/http/bridge.hpp"

#include <msgpack.hpp>

namespace mqlm::actors::http_bridge {

namespace {

// The bridge's two ends are no actors of the topology; the envelope names them for the codec.
constexpr const char* kBridgeName = "http-bridge";

}  // namespace

messages::Frames encode(const messages::Payload& payload, messages::Frames blobs) {
  messages::Envelope envelope;
  envelope.from = kBridgeName;
  envelope.to = kBridgeName;
  return messages::encode(std::move(envelope), payload, std::move(blobs));
}

std::optional<messages::Message> decode(messages::Frames frames) {
  auto decoded = messages::decode(std::move(frames));
  if (auto* message = std::get_if<messages::Message>(&decoded)) return std::move(*message);
  return std::nullopt;
}

zmq::message_t figures_frame(const http_status::HttpFigures& figures) {
  msgpack::sbuffer buffer;
  msgpack::pack(buffer, figures);
  return zmq::message_t(buffer.data(), buffer.size());
}

std::optional<http_status::HttpFigures> figures_of(const messages::Message& answer) {
  if (answer.blobs.size() != 1) return std::nullopt;
  const zmq::message_t& frame = answer.blobs.front();
  try {
    msgpack::object_handle handle = msgpack::unpack(static_cast<const char*>(frame.data()), frame.size());
    return handle.get().as<http_status::HttpFigures>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace mqlm::actors::http_bridge
