#include "actors/runtime/links.hpp"

#include <spdlog/spdlog.h>

#include <optional>
#include <stdexcept>

#include "actors/runtime/zap_handler.hpp"

namespace mqlm::actors {
namespace {

constexpr std::uint32_t kZapWatch = 1;

// The key of the process that binds name's tcp:// inbox, when the links there are CURVE.
const std::string* secured_inbox_key(const Topology& topology, const std::string& name, const std::string& endpoint) {
  if (!topology.link_keys || !is_tcp_endpoint(endpoint)) return nullptr;
  auto key = topology.inbox_keys.find(name);
  if (key == topology.inbox_keys.end()) {
    // The command line refuses such a topology; a program that builds one has a bug.
    throw std::logic_error(name + "'s address " + endpoint + " has no public key, and the links over tcp:// are CURVE");
  }
  return &key->second;
}

class LinkAuthenticator final : public Actor {
 public:
  explicit LinkAuthenticator(std::set<std::string> senders) : senders_(std::move(senders)) {}

  void on_start(Context& ctx) override {
    zmq::context_t* context = ctx.zmq_context();
    if (context == nullptr) throw std::runtime_error("the link authenticator needs a live ZeroMQ context");
    zap_.emplace(*context, senders_, curve::kLinkZapDomain);
    ctx.watch(zap_->socket(), kZapWatch);
    spdlog::info("links over tcp:// are CURVE: {} keys may send to this process's tcp:// inboxes", senders_.size());
  }

  void on_message(Context&, messages::Message&) override {}

  void on_readable(Context& ctx, std::uint32_t watch_id) override {
    if (watch_id == kZapWatch && zap_) zap_->answer_waiting(ctx.now_ns());
  }

  void on_stop(Context& ctx) override {
    if (!zap_) return;
    spdlog::info("link authenticator stopped: {} CURVE link handshakes allowed, {} refused", zap_->allowed(),
                 zap_->refused());
    ctx.unwatch(kZapWatch);
    zap_.reset();
  }

 private:
  std::set<std::string> senders_;
  std::optional<ZapHandler> zap_;
};

}  // namespace

bool is_tcp_endpoint(const std::string& endpoint) { return endpoint.starts_with("tcp://"); }

void bind_inbox(zmq::socket_t& inbox, const Topology& topology, const std::string& name) {
  auto endpoint = topology.endpoint_of(name);
  if (!endpoint) throw std::runtime_error(name + " has no address in the topology");
  if (const std::string* key = secured_inbox_key(topology, name, *endpoint)) {
    if (*key != topology.link_keys->public_key) {
      throw std::runtime_error(name + "'s inbox is here, but its --address " + *endpoint + " names the key " + *key +
                               ", not this process's (" + topology.link_keys->public_key +
                               "): give that address the NAME.pub of this process's --link-key");
    }
    curve::set_server_options(inbox, *topology.link_keys, curve::kLinkZapDomain);
  }
  try {
    inbox.bind(*endpoint);
  } catch (const zmq::error_t& e) {
    inbox.close();
    throw std::runtime_error(name + " cannot bind its inbox at " + *endpoint + ": " + e.what());
  }
}

bool connect_to_inbox(zmq::socket_t& socket, const Topology& topology, const std::string& name) {
  auto endpoint = topology.endpoint_of(name);
  if (!endpoint) return false;
  if (const std::string* key = secured_inbox_key(topology, name, *endpoint)) {
    curve::set_client_options(socket, {*key, *topology.link_keys});
  }
  socket.connect(*endpoint);
  return true;
}

std::set<std::string> link_senders(const Topology& topology) {
  std::set<std::string> keys;
  for (const auto& [name, key] : topology.inbox_keys) keys.insert(key);
  if (topology.link_keys) keys.insert(topology.link_keys->public_key);
  return keys;
}

std::unique_ptr<ActorThread> start_link_authenticator(zmq::context_t& context,
                                                      std::shared_ptr<const Topology> topology) {
  if (!topology->link_keys) throw std::logic_error("a link authenticator without link keys");
  auto authenticator = std::make_unique<LinkAuthenticator>(link_senders(*topology));
  auto thread = std::make_unique<ActorThread>(context, std::move(topology), kLinkAuthenticatorName,
                                              std::move(authenticator));
  thread->start();
  return thread;
}

}  // namespace mqlm::actors
