#include "actors/runtime/mailbox.hpp"

#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include "actors/runtime/links.hpp"

namespace mqlm::actors {

using namespace messages;

Mailbox::Mailbox(zmq::context_t& context, std::shared_ptr<const Topology> topology, std::string name)
    : topology_(std::move(topology)),
      name_(std::move(name)),
      inbox_(context, zmq::socket_type::pull),
      outbox_(context, *topology_) {
  inbox_.set(zmq::sockopt::rcvhwm, topology_->mailbox_capacity);
  inbox_.set(zmq::sockopt::linger, 0);
  bind_inbox(inbox_, *topology_, name_);
}

SendStatus Mailbox::send(const std::string& to, Payload payload, SendOptions options) {
  WhenFull policy = when_full(kind_of(payload));
  return outbox_.send(to, make_frames(name_, to, payload, std::move(options)), policy);
}

SendStatus Mailbox::send_raw(const std::string& to, Frames frames, WhenFull when_full) {
  return outbox_.send(to, std::move(frames), when_full);
}

std::optional<Message> Mailbox::receive(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    flush(std::chrono::milliseconds(0));
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    zmq::pollitem_t item{inbox_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::max(left, std::chrono::milliseconds(0))) == 0) return std::nullopt;
    Frames frames;
    if (!zmq::recv_multipart(inbox_, std::back_inserter(frames), zmq::recv_flags::dontwait)) continue;
    DecodeResult decoded = decode(std::move(frames));
    if (auto* message = std::get_if<Message>(&decoded)) return std::move(*message);
    ++malformed_;
    spdlog::warn("{}: skipped a message: {}", name_, std::get<DecodeError>(decoded).detail);
  }
}

bool Mailbox::flush(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (outbox_.flush() > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    auto items = outbox_.pending_poll_items();
    zmq::poll(items.data(), items.size(), left);
  }
  return true;
}

}  // namespace mqlm::actors
