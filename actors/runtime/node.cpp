#include "actors/runtime/node.hpp"

#include "actors/runtime/links.hpp"

namespace mqlm::actors {

Node::Node(NodeConfig config) {
  Topology topology = std::move(config.topology);
  topology.add(kSupervisorName);
  for (const auto& spec : config.actors) topology.add(spec.name);
  if (topology.link_keys) topology.add(kLinkAuthenticatorName);
  if (!config.trace_file.empty() && topology.trace_endpoint.empty()) {
    topology.trace_endpoint = "inproc://mqlm/trace";
  }
  topology_ = std::make_shared<const Topology>(std::move(topology));
  if (!config.trace_file.empty()) recorder_.emplace(context_, topology_->trace_endpoint, config.trace_file);
  if (topology_->link_keys) link_authenticator_ = start_link_authenticator(context_, topology_);
  actors_ = std::move(config.actors);
  supervisor_config_ = config.supervisor;
}

void Node::start() {
  if (supervisor_) throw std::logic_error("node started twice");
  supervisor_ = std::make_unique<ActorThread>(
      context_, topology_, kSupervisorName,
      std::make_unique<Supervisor>(context_, topology_, std::move(actors_), supervisor_config_));
  supervisor_->start();
}

Node::~Node() { stop(); }

void Node::stop() {
  if (supervisor_) {
    supervisor_->stop();
    supervisor_.reset();
  }
  if (link_authenticator_) {
    link_authenticator_->stop();
    link_authenticator_.reset();
  }
  if (recorder_) recorder_->stop();
}

}  // namespace mqlm::actors
