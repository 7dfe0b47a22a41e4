#include "actors/runtime/supervisor.hpp"

#include <spdlog/spdlog.h>

namespace mqlm::actors {

using namespace messages;

namespace {
constexpr std::uint32_t kHeartbeatTimer = 1;
}

Supervisor::Supervisor(zmq::context_t& context, std::shared_ptr<const Topology> topology,
                       std::vector<ChildSpec> children, SupervisorConfig config)
    : context_(context), topology_(std::move(topology)), config_(config) {
  for (auto& spec : children) children_.push_back(Child{std::move(spec), nullptr, 0, 0, false, false});
}

void Supervisor::on_start(Context& ctx) {
  for (auto& child : children_) start_child(ctx, child);
  ctx.set_timer(kHeartbeatTimer, config_.heartbeat_interval, true);
}

void Supervisor::start_child(Context& ctx, Child& child) {
  if (child.thread) {
    child.thread->restart(child.spec.make());
  } else {
    child.thread = std::make_unique<ActorThread>(context_, topology_, child.spec.name, child.spec.make(), ctx.self());
    child.thread->start();
  }
  child.alive = true;
  child.unresponsive = false;
  child.last_ack_ns = ctx.now_ns();
  spdlog::debug("supervisor: started {}", child.spec.name);
}

void Supervisor::on_stop(Context& ctx) {
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    if (it->thread) it->thread->stop(std::chrono::seconds(30), ctx.self());
    it->alive = false;
  }
}

Supervisor::Child* Supervisor::find(const std::string& name) {
  for (auto& c : children_) {
    if (c.spec.name == name) return &c;
  }
  return nullptr;
}

void Supervisor::on_message(Context& ctx, Message& message) {
  if (const auto* timer = message.as<Timer>(); timer && timer->timer_id == kHeartbeatTimer) {
    heartbeat(ctx);
  } else if (message.as<HeartbeatAck>() != nullptr) {
    if (Child* child = find(message.envelope.from)) {
      child->last_ack_ns = ctx.now_ns();
      if (child->unresponsive) spdlog::info("supervisor: {} answers again", child->spec.name);
      child->unresponsive = false;
    }
  } else if (const auto* exited = message.as<ActorExited>()) {
    Child* child = find(exited->actor);
    if (child != nullptr && child->alive && child->thread && child->thread->finished()) {
      child_died(ctx, *child, exited->reason);
    }
  }
}

void Supervisor::heartbeat(Context& ctx) {
  ++heartbeat_seq_;
  for (auto& child : children_) {
    if (!child.alive) continue;
    // A thread that ended without managing to say so is noticed here.
    if (child.thread->finished()) {
      child_died(ctx, child, child.thread->join().reason);
      continue;
    }
    ctx.send(child.spec.name, Heartbeat{heartbeat_seq_});
    auto silent = std::chrono::nanoseconds(ctx.now_ns() - child.last_ack_ns);
    if (!child.unresponsive && silent > config_.heartbeat_timeout) {
      child.unresponsive = true;
      report(ctx, child, ActorFailure::unresponsive,
             "no heartbeat answer for " +
                 std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()) + " ms",
             false);
    }
  }
}

void Supervisor::child_died(Context& ctx, Child& child, const std::string& reason) {
  child.alive = false;
  child.thread->join();
  bool restart = child.spec.restart.restart_on_death && child.restarts < child.spec.restart.max_restarts;
  if (restart) {
    ++child.restarts;
    try {
      start_child(ctx, child);
    } catch (const std::exception& e) {
      spdlog::error("supervisor: restarting {} failed: {}", child.spec.name, e.what());
      restart = false;
    }
  }
  report(ctx, child, ActorFailure::died, reason, restart);
}

void Supervisor::report(Context& ctx, const Child& child, ActorFailure failure, const std::string& detail,
                        bool restarted) {
  spdlog::error("supervisor: {} {}: {}{}", child.spec.name,
                failure == ActorFailure::died ? "died" : "stopped answering", detail,
                restarted ? " (restarted)" : "");
  if (config_.report_to.empty()) return;
  ctx.send(config_.report_to, ActorFailed{child.spec.name, static_cast<std::uint8_t>(failure), detail,
                                          child.restarts, restarted});
}

}  // namespace mqlm::actors
