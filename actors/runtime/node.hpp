// One process's share of a deployment: the ZeroMQ context, the topology, the trace recorder if
// asked for, the link authenticator when the topology has link keys (links.hpp: it starts with
// the node, before any inbox binds), and a supervisor that runs this process's actors. start()
// starts them in order (participants that are not actors, like a tool's Mailbox, open between
// construction and start); stop() (or destruction) stops them in reverse, then the link
// authenticator, then closes the trace.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "actors/runtime/actor_thread.hpp"
#include "actors/runtime/supervisor.hpp"
#include "actors/runtime/trace.hpp"

namespace mqlm::actors {

inline constexpr const char* kSupervisorName = "supervisor";

struct NodeConfig {
  Topology topology;              // every participant's address, here and elsewhere
  std::vector<ChildSpec> actors;  // the actors this process runs, in start order
  SupervisorConfig supervisor;
  std::filesystem::path trace_file;  // empty: no trace
};

class Node {
 public:
  explicit Node(NodeConfig config);
  ~Node();
  void start();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  void stop();
  zmq::context_t& context() { return context_; }
  std::shared_ptr<const Topology> topology() const { return topology_; }

 private:
  zmq::context_t context_;
  std::shared_ptr<const Topology> topology_;
  std::optional<TraceRecorder> recorder_;
  std::unique_ptr<ActorThread> link_authenticator_;
  std::vector<ChildSpec> actors_;
  SupervisorConfig supervisor_config_;
  std::unique_ptr<ActorThread> supervisor_;
};

}  // namespace mqlm::actors
