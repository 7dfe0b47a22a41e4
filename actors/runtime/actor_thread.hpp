// The live runtime of one actor: a thread, its inbox socket (PULL, bounded by the topology's
// mailbox capacity) and its loop. Modelled on czmq's zactor: start returns once the actor is
// ready; stop is a Stop message through the same inbox, so everything queued before it is
// handled first, and returns once the thread has finished and joined. The inbox is bound by
// start() in the caller's thread and handed to the actor's thread (thread start is the memory
// barrier ZeroMQ asks for when a socket changes threads).
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/topology.hpp"

namespace mqlm::actors {

struct ActorExit {
  bool clean = false;     // ended by Stop
  std::string reason;     // what ended it otherwise
  ActorStats stats;
  OutboxCounters outbox;
};

class ActorThread {
 public:
  // report_to: the actor told with ActorExited if this one's thread ends without a Stop.
  ActorThread(zmq::context_t& context, std::shared_ptr<const Topology> topology, std::string name,
              std::unique_ptr<Actor> actor, std::string report_to = {});
  ~ActorThread();
  ActorThread(const ActorThread&) = delete;
  ActorThread& operator=(const ActorThread&) = delete;

  // Returns once the inbox is bound and on_start has run; throws what went wrong otherwise.
  void start();
  // Sends Stop (waiting for room in a full mailbox) and waits for the thread to finish.
  // False if it did not finish in time (it is then left running, and said so in the log).
  bool stop(std::chrono::milliseconds timeout = std::chrono::seconds(30), const std::string& from = "control");
  // True once the thread has ended, whether stopped or died.
  bool finished() const;
  // Runs a fresh actor on the same mailbox after the thread ended: what was queued for the dead
  // instance goes to the new one, and peers keep their connections.
  void restart(std::unique_ptr<Actor> actor);
  // Joins a finished thread and returns how it ended.
  ActorExit join();

  const std::string& name() const { return name_; }

 private:
  zmq::context_t& context_;
  std::shared_ptr<const Topology> topology_;
  std::string name_;
  std::unique_ptr<Actor> actor_;
  std::string report_to_;
  zmq::socket_t inbox_;  // bound by start(), then used only by the actor's thread
  std::thread thread_;
  std::shared_future<ActorExit> exit_;
  bool joined_ = false;
};

}  // namespace mqlm::actors
