// The actors this binary can run by kind name, for `mqlm node` and `mqlm trace replay`.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "actors/runtime/actor.hpp"
#include "actors/runtime/actor_options.hpp"

namespace mqlm::actors {

// Throws std::invalid_argument naming the unknown kind or the bad option.
std::unique_ptr<Actor> make_actor(const std::string& kind, const ActorOptions& options);
std::vector<std::string> actor_kinds();

// Parses "key=value"; false if malformed.
bool parse_option(const std::string& text, std::string& key, std::string& value);

}  // namespace mqlm::actors
