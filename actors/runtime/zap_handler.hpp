// A ZAP handler (ZeroMQ's authentication protocol, RFC 27) for sockets that serve CURVE: which
// clients may finish their handshake. libzmq asks it about every CURVE client of every socket of
// its context; the handler answers 200 (with the client's public key, Z85, as the user id) for a
// key it allows in its domain and 400 for any other, for another domain, and for any mechanism
// but CURVE.
//
// It is a REP socket bound at inproc://zeromq.zap.01 in the context of the sockets it guards, and
// it must be bound before they bind (a handshake that finds no handler is refused when the
// socket sets zap_enforce_domain, as curve::set_server_options does). It has no thread: whoever owns
// it polls socket() in its own loop and calls answer_waiting() when it is readable (the gateway
// does, beside its client socket, in a context of its own; the links' handler is an actor of its
// own, actors/runtime/links.hpp). One context has room for one handler.
//
// Refusals are counted, and logged at most once a minute per client key (a client that is
// refused reconnects, and asks again, every reconnect interval).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <zmq.hpp>

#include "actors/runtime/curve_keys.hpp"

namespace mqlm::actors {

// A client's CURVE handshake, and what the handler said to it.
struct ZapVerdict {
  bool allowed = false;
  std::string client_key;  // Z85; "" when the request carried none
};

class ZapHandler {
 public:
  // Binds the handler in `context` for the sockets of ZAP domain `domain`; allowed_clients: Z85
  // public keys, or none for any client that knows the server's key. Throws std::runtime_error
  // when the address is taken (another handler in this context).
  ZapHandler(zmq::context_t& context, std::optional<std::set<std::string>> allowed_clients,
             std::string domain = curve::kZapDomain);

  zmq::socket_ref socket() { return socket_; }

  // Answers every request waiting, without blocking. now_ns is the caller's clock, for the log's
  // once-a-minute limit.
  void answer_waiting(std::int64_t now_ns);

  std::uint64_t allowed() const { return allowed_; }
  std::uint64_t refused() const { return refused_; }

 private:
  ZapVerdict answer_one(const std::vector<zmq::message_t>& request);
  void log_refusal(const ZapVerdict& verdict, const std::string& address, std::int64_t now_ns);

  zmq::socket_t socket_;
  std::optional<std::set<std::string>> allowed_clients_;
  std::string domain_;
  std::uint64_t allowed_ = 0;
  std::uint64_t refused_ = 0;
  std::map<std::string, std::int64_t> last_logged_ns_;  // by client key; bounded
};

}  // namespace mqlm::actors
