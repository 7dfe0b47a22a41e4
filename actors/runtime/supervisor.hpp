// The supervisor actor: starts its children in order and stops them in reverse, probes each
// with Heartbeats on a timer, and notices a child whose thread died (ActorExited) or that
// stopped answering (no HeartbeatAck within the timeout). It reports either as ActorFailed to
// report_to and in the log, and restarts a dead child if its policy says so. A child that hangs
// cannot be restarted in-process (a thread cannot be killed): it is reported, and the process's
// own supervisor (systemd, Kubernetes) decides.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "actors/runtime/actor_thread.hpp"

namespace mqlm::actors {

struct RestartPolicy {
  bool restart_on_death = false;
  std::uint32_t max_restarts = 3;
};

struct ChildSpec {
  std::string name;
  std::function<std::unique_ptr<Actor>()> make;
  RestartPolicy restart;
};

struct SupervisorConfig {
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{5000};
  std::string report_to;  // receives ActorFailed; empty: the log only
};

class Supervisor final : public Actor {
 public:
  Supervisor(zmq::context_t& context, std::shared_ptr<const Topology> topology, std::vector<ChildSpec> children,
             SupervisorConfig config);
  void on_start(Context& ctx) override;
  void on_message(Context& ctx, messages::Message& message) override;
  void on_stop(Context& ctx) override;

 private:
  struct Child {
    ChildSpec spec;
    std::unique_ptr<ActorThread> thread;
    std::int64_t last_ack_ns = 0;
    std::uint32_t restarts = 0;
    bool alive = false;
    bool unresponsive = false;
  };
  void start_child(Context& ctx, Child& child);
  void heartbeat(Context& ctx);
  void child_died(Context& ctx, Child& child, const std::string& reason);
  void report(Context& ctx, const Child& child, messages::ActorFailure failure, const std::string& detail,
              bool restarted);
  Child* find(const std::string& name);

  zmq::context_t& context_;
  std::shared_ptr<const Topology> topology_;
  std::vector<Child> children_;
  SupervisorConfig config_;
  std::uint64_t heartbeat_seq_ = 0;
};

}  // namespace mqlm::actors
