// The API keys a front end takes, the same on HTTP and on the ZeroMQ protocol: none (every
// request is allowed), or a set of keys of which some may be admin keys. With admin keys, only
// they may load, unload and clear caches; without, any key may.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime/actor_options.hpp"

namespace mqlm::actors::front_end {

class ApiKeys {
 public:
  ApiKeys() = default;
  ApiKeys(std::vector<std::string> keys, std::vector<std::string> admin_keys);

  enum class Verdict { allowed, unauthorized, forbidden };
  // Compares in time independent of where a wrong key differs.
  Verdict check(std::string_view key, bool admin_operation) const;
  bool any() const { return !keys_.empty() || !admin_keys_.empty(); }

 private:
  std::vector<std::string> keys_;
  std::vector<std::string> admin_keys_;
};

// A front end's key options (key=value, as `mqlm node` passes them): api_key=KEY, and
// api_keys=K1,K2 and admin_api_keys=K1,K2 (keys hold no commas).
ApiKeys read_api_keys(const ActorOptions& options);

}  // namespace mqlm::actors::front_end
