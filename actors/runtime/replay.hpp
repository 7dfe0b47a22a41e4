// Replay: a fresh instance of one actor is fed, in order, every message its recorded instance
// took from its inbox (timers included), with the recorded time as "now"; what it sends is
// compared with what the recorded instance sent. The envelope's send timestamp is the only
// field not compared: it is the runtime's, not the actor's.
#pragma once

#include <string>
#include <vector>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/trace.hpp"

namespace mqlm::actors {

struct ReplayReport {
  std::size_t inbox_messages = 0;
  std::size_t recorded_sends = 0;
  std::size_t replayed_sends = 0;
  std::vector<std::string> differences;  // the first few, for people
  std::size_t difference_count = 0;
  bool same() const { return difference_count == 0; }
};

ReplayReport replay_actor(const std::vector<TraceRecord>& trace, const std::string& actor_name, Actor& actor);

// One line about a recorded message: kind, peer, ids and payload.
std::string describe_record(const TraceRecord& record);

}  // namespace mqlm::actors
