#include "actors/runtime/zap_handler.hpp"

#include <spdlog/spdlog.h>

#include <array>
#include <iterator>
#include <stdexcept>
#include <string_view>
#include <vector>
#include <zmq_addon.hpp>

namespace mqlm::actors {
namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
constexpr std::string_view kZapVersion = "1.0";
// A refused key is logged again after this long.
constexpr std::int64_t kLogIntervalNs = 60'000'000'000;
// Keys remembered for the log's limit; past it, a refusal of a key not remembered is counted
// but not logged until old entries expire (so a stream of fresh keys cannot flood the log).
constexpr std::size_t kMaxRememberedKeys = 1024;
// Requests answered per call, so a storm of handshakes cannot hold the owner's loop.
constexpr int kMaxAnswersPerCall = 256;

// RFC 27's request frames, after the REP envelope.
enum RequestFrame : std::size_t { kVersion, kRequestId, kDomain, kAddress, kIdentity, kMechanism, kCredentials };

std::string text_of(const zmq::message_t& frame) { return frame.to_string(); }

}  // namespace

ZapHandler::ZapHandler(zmq::context_t& context, std::optional<std::set<std::string>> allowed_clients,
                       std::string domain)
    : socket_(context, zmq::socket_type::rep),
      allowed_clients_(std::move(allowed_clients)),
      domain_(std::move(domain)) {
  socket_.set(zmq::sockopt::linger, 0);
  try {
    socket_.bind(kZapEndpoint);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error(std::string("cannot start the CURVE authenticator (ZAP handler at ") + kZapEndpoint +
                             "): " + e.what() + "; a ZeroMQ context has one handler");
  }
}

void ZapHandler::answer_waiting(std::int64_t now_ns) {
  for (int i = 0; i < kMaxAnswersPerCall; ++i) {
    std::vector<zmq::message_t> request;
    if (!zmq::recv_multipart(socket_, std::back_inserter(request), zmq::recv_flags::dontwait)) return;
    const ZapVerdict verdict = answer_one(request);
    if (verdict.allowed) {
      ++allowed_;
    } else {
      ++refused_;
      log_refusal(verdict, request.size() > kAddress ? text_of(request[kAddress]) : std::string(), now_ns);
    }
  }
}

// The reply is sent whatever the request held: a REP socket that does not answer takes no more.
ZapVerdict ZapHandler::answer_one(const std::vector<zmq::message_t>& request) {
  ZapVerdict verdict;
  std::string status_text;
  const bool curve = request.size() == kCredentials + 1 && text_of(request[kVersion]) == kZapVersion &&
                     text_of(request[kMechanism]) == "CURVE" && request[kCredentials].size() == curve::kKeyBytes;
  if (!curve) {
    status_text = "only CURVE clients are served here";
  } else {
    verdict.client_key = curve::z85_key(text_of(request[kCredentials]));
    const bool our_domain = text_of(request[kDomain]) == domain_;
    verdict.allowed = our_domain && (!allowed_clients_ || allowed_clients_->contains(verdict.client_key));
    status_text = verdict.allowed ? "OK" : our_domain ? "unknown client key" : "not a domain this handler serves";
  }
  std::array<zmq::const_buffer, 6> reply = {
      zmq::buffer(kZapVersion),
      request.size() > kRequestId ? zmq::buffer(request[kRequestId].data(), request[kRequestId].size())
                                  : zmq::const_buffer(),
      zmq::buffer(std::string_view(verdict.allowed ? "200" : "400")),
      zmq::buffer(status_text),
      verdict.allowed ? zmq::buffer(verdict.client_key) : zmq::const_buffer(),
      zmq::const_buffer(),  // metadata: none
  };
  zmq::send_multipart(socket_, reply, zmq::send_flags::dontwait);
  return verdict;
}

void ZapHandler::log_refusal(const ZapVerdict& verdict, const std::string& address, std::int64_t now_ns) {
  const std::string key = verdict.client_key.empty() ? std::string("(not CURVE)") : verdict.client_key;
  auto seen = last_logged_ns_.find(key);
  if (seen != last_logged_ns_.end() && now_ns - seen->second < kLogIntervalNs) return;
  if (seen == last_logged_ns_.end() && last_logged_ns_.size() >= kMaxRememberedKeys) {
    std::erase_if(last_logged_ns_, [&](const auto& entry) { return now_ns - entry.second >= kLogIntervalNs; });
    if (last_logged_ns_.size() >= kMaxRememberedKeys) return;
  }
  last_logged_ns_[key] = now_ns;
  spdlog::warn(
      "refused a CURVE handshake from {} to {} (client key {}: {}); {} refused so far, each key logged at most "
      "once a minute",
      address.empty() ? "an unknown address" : address, domain_, key,
      verdict.client_key.empty() ? "not a CURVE client" : "not an allowed client", refused_);
}

}  // namespace mqlm::actors
