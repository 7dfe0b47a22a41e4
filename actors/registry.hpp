// The actors this binary can run by kind name, for `mqlm node` and `mqlm trace replay`.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/actor.hpp"

namespace mqlm::actors {

using ActorOptions = std::map<std::string, std::string>;

// Throws std::invalid_argument naming the unknown kind or the bad option.
std::unique_ptr<Actor> make_actor(const std::string& kind, const ActorOptions& options);
std::vector<std::string> actor_kinds();

// Parses "key=value"; false if malformed.
bool parse_option(const std::string& text, std::string& key, std::string& value);

}  // namespace mqlm::actors
