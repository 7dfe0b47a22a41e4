// The front end's core, shared by every protocol that brings requests to the scheduler (the
// gateway's ZeroMQ client protocol, the http actor's OpenAI API). After czmq's pattern: the core
// owns the tables and the conversations with the other actors; a protocol adapter only turns its
// wire format into calls here and the core's answers (a FrontEndPort) back into its wire format.
//
//   adapter ──open / abort / ask_status / ask_admin──▶ core ──Submit / Abort / StatusQuery──▶ scheduler
//   adapter ◀──token / final / status / admin answer── core ◀──TokenEvent / FinalEvent / StatusReport──
//                                                        core ──LoadRequest / UnloadRequest / ModelsQuery──▶ enforcer
//                                                        core ──ClearCache──▶ cache-writer
//
// What it owns: the request table (the request id the scheduler knows -> who asked, under which
// name), the callers' connections, the questions waiting for the scheduler, the enforcer or the
// cache-writer; the scheduler's liveness (heartbeats, and every open request failed with
// unavailable when it falls silent); Drain; and ending every request it opened with exactly one
// final: the scheduler's, or its own when the caller went away, the scheduler fell silent or the
// server stops.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "actors/front_end/events.hpp"
#include "actors/runtime/actor.hpp"
#include "actors/runtime/actor_options.hpp"
#include "messages/cache.hpp"
#include "messages/codec.hpp"
#include "messages/models.hpp"
#include "messages/serving.hpp"

namespace mqlm::actors::front_end {

// A request as a caller sends it is at most this long: a Submit made from it stays under the
// payload limit of the scheduler's decoder (messages::DecodeLimits::max_payload_bytes, 1 MiB).
inline constexpr std::size_t kMaxRequestBytes = 1'000'000;
static_assert(kMaxRequestBytes + 16 * 1024 <= messages::DecodeLimits{}.max_payload_bytes,
              "a Submit built from the largest request must still decode at the scheduler");

// What one request may hold, whatever its protocol.
inline constexpr std::size_t kMaxModelNameBytes = 256;
inline constexpr std::size_t kMaxPromptTokens = std::size_t{1} << 18;
inline constexpr std::size_t kMaxChatTurns = 4096;
inline constexpr std::size_t kMaxRoleBytes = 64;

// The core's own timer; an adapter's timers take other ids and reach FrontEndPort::on_timer.
inline constexpr std::uint32_t kCoreTickTimer = 1;

// A caller's name for a request, an integer or a string, echoed as the caller gave it.
using ClientId = std::variant<std::int64_t, std::string>;

// Who asked, and where the answers go.
struct Caller {
  std::string connection;       // the routing id of the caller's connection to the adapter's ROUTER
  std::optional<ClientId> id;   // the caller's name for the request, when its protocol has one
  bool delimited = false;       // the connection frames messages after an empty delimiter (REQ)
};

// The questions that go to the enforcer (the model pool), the cache-writer (ClearCache) or the
// scheduler (Tokenize), as
// they are sent; and their answers.
// Tokenize goes to the scheduler, which has the tokenizers.
using AdminQuestion = std::variant<messages::LoadRequest, messages::UnloadRequest, messages::ModelsQuery,
                                   messages::ClearCache, messages::Tokenize>;
using AdminAnswer = std::variant<messages::LoadAnswer, messages::UnloadAnswer, messages::ModelsReport,
                                 messages::CacheCleared, messages::Tokenized>;

struct OpenRequest {
  Caller caller;
  std::string model;        // as the caller named it ("": the server's default)
  bool stream = true;
  bool logprobs = false;
  GatheredOutput gathered;  // for callers that do not stream
  bool accepted = false;    // the scheduler took it (a token, or a barrier answered after it)
  bool gone = false;        // the caller went away: Abort sent, events dropped until the final
  bool abort_sent = false;
};

// What a protocol adapter does with the core's answers. Each call writes to the caller's
// connection; a connection found gone meanwhile is reported with FrontEnd::connection_gone.
class FrontEndPort {
 public:
  virtual ~FrontEndPort() = default;
  virtual void send_token(Context& ctx, const OpenRequest& request, const messages::TokenEvent& event) = 0;
  // The request's one final (also of a request refused before it opened); not called for a
  // request whose caller is gone.
  virtual void send_final(Context& ctx, const OpenRequest& request, const messages::FinalEvent& event) = 0;
  // Every request that ends, refused, finished or cut off, gone or not.
  virtual void request_ended(const messages::FinalEvent&) {}
  // The scheduler took the request into its queue (FrontEndConfig::confirm_acceptance): `report`
  // is its answer to a StatusQuery sent after the Submit, so no refusal can come any more.
  virtual void send_accepted(Context&, const OpenRequest&, const messages::StatusReport&) {}
  // memory: the enforcer's report, when the server has one and it answered in time.
  virtual void send_status(Context& ctx, const Caller& caller, const messages::StatusReport& report,
                           const messages::ModelsReport* memory) = 0;
  virtual void send_admin_answer(Context& ctx, const Caller& caller, const AdminAnswer& answer) = 0;
  // A status or admin question that has no answer.
  virtual void send_error(Context& ctx, const Caller& caller, messages::RequestError code,
                          const std::string& message) = 0;
  // A connection with requests open that was sent nothing for FrontEndConfig::keepalive.
  virtual void send_keepalive(Context&, const Caller&) {}
  // A timer the adapter set itself (any id but kCoreTickTimer) fired.
  virtual void on_timer(Context&, std::uint32_t /*timer_id*/) {}
};

struct FrontEndConfig {
  std::string name;           // in log lines: "gateway", "http"
  std::string self;           // in error texts: "the gateway", "the http actor"
  std::string admin_noun;     // in error texts: "admin requests", "admin calls"
  std::string scheduler = "scheduler";
  std::string enforcer;       // "": the server has no model pool (admin questions are refused)
  std::string cache_writer;   // "": the server keeps no KV pages beyond the GPU (clears are refused)
  std::size_t max_requests = 4096;
  std::size_t max_pending_status = 64;
  std::chrono::milliseconds heartbeat{200};
  std::chrono::milliseconds unavailable{800};
  std::optional<std::chrono::milliseconds> keepalive;  // none: the adapter keeps its callers alive
  // After each batch of Submits, a StatusQuery whose answer tells the requests' callers that the
  // scheduler took them (FrontEndPort::send_accepted).
  bool confirm_acceptance = false;
};

// An interval option in whole milliseconds, at least 1 and at most `high`; `fallback` when not
// given. std::invalid_argument naming kind and key otherwise.
std::chrono::milliseconds milliseconds_option(std::string_view kind, const ActorOptions& options,
                                              const std::string& key, std::chrono::milliseconds fallback,
                                              std::uint64_t high);

// A config with the defaults, naming the front end `name` in log lines, `self` and `admin_noun`
// in error texts.
FrontEndConfig named_config(std::string name, std::string self, std::string admin_noun);

// The options of the core every front end takes (key=value, as `mqlm node` passes them):
//   scheduler=NAME      the scheduler actor; default scheduler
//   enforcer=NAME       the memory enforcer; default none
//   cache_writer=NAME   the KV prefix cache's cache-writer; default none
//   max_requests=N      requests open at once; default 4096
//   heartbeat_ms=N      how often the scheduler is sent a Heartbeat; default 200
//   unavailable_ms=N    the scheduler's silence that fails open requests; default 800
// Intervals are at most ms_high. Throws std::invalid_argument naming the front end, the option
// and what is wrong with it.
void read_core_options(const ActorOptions& options, std::uint64_t ms_high, FrontEndConfig& config);

class FrontEnd {
 public:
  FrontEnd(FrontEndConfig config, FrontEndPort& port) : config_(std::move(config)), port_(port) {}

  const FrontEndConfig& config() const { return config_; }
  std::size_t open_requests() const { return requests_.size(); }
  bool draining() const { return draining_; }
  std::uint64_t served() const { return served_; }
  std::uint64_t dropped_events() const { return dropped_events_; }

  // Starts the liveness clocks and the tick timer.
  void start(Context& ctx);
  // Cuts off every open request (Abort to the scheduler, shutting_down to its caller) and every
  // waiting question.
  void stop(Context& ctx);

  // ---- what callers ask ---------------------------------------------------------------------
  // Whether `caller` has a request of its name open on its connection.
  bool is_open(const Caller& caller) const;
  void open(Context& ctx, Caller caller, messages::Submit submit, bool stream);
  // The final of a request that never opened.
  void refuse(Context& ctx, const Caller& caller, messages::RequestError code, std::string message, bool logprobs);
  // The caller's abort of its request; an unknown one is ignored (it may have just finished).
  void abort(Context& ctx, const Caller& caller);
  void ask_status(Context& ctx, Caller caller, bool trim);
  void ask_admin(Context& ctx, Caller caller, AdminQuestion question);

  // A connection found gone (a send failed): its requests are aborted in settle().
  void connection_gone(const std::string& connection) { gone_connections_.insert(connection); }
  void sent_to(const std::string& connection, std::int64_t now_ns);
  // After every handler: connections found gone are settled, and with confirm_acceptance the
  // requests opened meanwhile get their barrier.
  void settle(Context& ctx);

  // ---- what the other actors say --------------------------------------------------------------
  // Handles the front end's messages (the scheduler's, the enforcer's, the cache-writer's,
  // errors, Drain, the tick); anything else is logged at debug level.
  void on_message(Context& ctx, messages::Message& message);

 private:
  struct Connection {
    std::map<std::optional<ClientId>, std::uint64_t> open;  // the caller's name -> request id
    bool delimited = false;
    std::int64_t last_sent_ns = 0;
  };

  // A status waits for the scheduler's report and, when the server has an enforcer, its memory
  // report too; an enforcer that does not answer in unavailable_ms is left out.
  struct PendingStatus {
    Caller caller;
    std::int64_t asked_ns = 0;
    std::optional<messages::StatusReport> report;
    std::optional<messages::ModelsReport> memory;
    bool wants_memory = false;
  };

  struct PendingAdmin {
    Caller caller;
    bool clear_cache = false;
    std::int64_t asked_ns = 0;
    bool to_scheduler = false;  // a Tokenize: the scheduler's silence fails it, as it fails requests
  };

  using RequestIt = std::map<std::uint64_t, OpenRequest>::iterator;
  using StatusIt = std::map<std::uint64_t, PendingStatus>::iterator;

  std::optional<std::pair<messages::RequestError, std::string>> admin_refusal(const AdminQuestion& question) const;
  bool went(Context& ctx, const Caller& caller, SendStatus status, const std::string& role, const std::string& peer);
  void send_barrier(Context& ctx);

  void on_token(Context& ctx, std::uint64_t request_id, messages::TokenEvent event);
  void on_final(Context& ctx, std::uint64_t request_id, const messages::FinalEvent& event);
  void finish(Context& ctx, RequestIt it, const messages::FinalEvent& event);
  void on_status_report(Context& ctx, std::uint64_t correlation_id, const messages::StatusReport& report);
  void on_models_report(Context& ctx, std::uint64_t correlation_id, const messages::ModelsReport& report);
  void answer_status_if_complete(Context& ctx, StatusIt it, bool gave_up);
  void on_admin_answer(Context& ctx, std::uint64_t correlation_id, const AdminAnswer& answer);
  void on_runtime_error(Context& ctx, const messages::Envelope& envelope, const messages::Error& error);
  void on_drain(Context& ctx, bool abort_running, messages::Message message);
  void answer_drains_if_done(Context& ctx);

  void on_tick(Context& ctx);
  void answer_late_statuses(Context& ctx, std::int64_t now);
  void give_up_on_enforcer(Context& ctx, std::int64_t now);
  void give_up_on_cache_writer(Context& ctx, std::int64_t now);
  bool clears_pending() const;
  void keep_connections_alive(Context& ctx, std::int64_t now);
  bool scheduler_silent(std::int64_t now) const;
  std::string silence_message(std::int64_t now) const;
  void fail_all_unavailable(Context& ctx);
  void send_abort(Context& ctx, std::uint64_t request_id, messages::AbortReason reason);

  FrontEndConfig config_;
  FrontEndPort& port_;
  std::map<std::uint64_t, OpenRequest> requests_;          // by the request id the scheduler knows
  std::map<std::string, Connection> connections_;          // connections with requests open
  std::map<std::uint64_t, PendingStatus> pending_status_;  // by correlation id
  std::map<std::uint64_t, PendingAdmin> pending_admin_;    // by correlation id
  std::map<std::uint64_t, std::vector<std::uint64_t>> barriers_;  // correlation id -> requests it settles
  std::vector<std::uint64_t> unbarriered_;                 // opened since the last barrier was sent
  std::set<std::string> gone_connections_;
  std::vector<messages::Message> drains_;                  // Drains to answer once no request is open
  bool draining_ = false;
  std::uint64_t next_request_id_ = 0;
  std::uint64_t next_correlation_id_ = 0;
  std::uint64_t heartbeat_seq_ = 0;
  std::int64_t last_heard_ns_ = 0;
  std::int64_t cache_writer_heard_ns_ = 0;
  std::int64_t last_heartbeat_ns_ = 0;
  std::int64_t tick_ns_ = 0;
  std::int64_t last_tick_ns_ = 0;
  std::uint64_t served_ = 0;
  std::uint64_t dropped_events_ = 0;
};

// An actor that is a front end: the other actors' messages go to its core, which answers through
// the adapter deriving from it (a FrontEndPort); the adapter adds the socket its callers use.
class FrontEndActor : public Actor, protected FrontEndPort {
 public:
  void on_message(Context& ctx, messages::Message& message) final;

 protected:
  explicit FrontEndActor(FrontEndConfig config) : core_(std::move(config), *this) {}
  // The ZeroMQ context the adapter's sockets are made from; throws when there is none (replay).
  zmq::context_t& live_context(Context& ctx) const;
  // Sends `frames` to the caller `connection` on the adapter's ROUTER (ZMQ_ROUTER_MANDATORY),
  // without waiting. A connection that is gone (EHOSTUNREACH) or has stopped reading (its queue
  // is full) is reported to the core, which settles it as gone once the current handler is done
  // (not here, so that no caller sees the core's tables change under it); false then.
  bool send_routed(zmq::socket_t& router, const std::string& connection, messages::Frames frames);

  FrontEnd core_;
};

}  // namespace mqlm::actors::front_end
