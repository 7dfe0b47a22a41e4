#include "actors/front_end/api_keys.hpp"

#include <algorithm>

namespace mqlm::actors::front_end {
namespace {

bool equal_in_constant_time(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (std::size_t i = 0; i < a.size(); ++i) difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

// Every key is compared, so the time taken does not say which one matched.
bool among(std::string_view key, const std::vector<std::string>& keys) {
  bool found = false;
  for (const auto& candidate : keys) found = equal_in_constant_time(key, candidate) || found;
  return found;
}

}  // namespace

ApiKeys::ApiKeys(std::vector<std::string> keys, std::vector<std::string> admin_keys)
    : keys_(std::move(keys)), admin_keys_(std::move(admin_keys)) {
  std::erase(keys_, std::string{});
  std::erase(admin_keys_, std::string{});
}

ApiKeys::Verdict ApiKeys::check(std::string_view key, bool admin_operation) const {
  if (!any()) return Verdict::allowed;
  const bool admin = among(key, admin_keys_);
  if (!admin && !among(key, keys_)) return Verdict::unauthorized;
  if (admin_operation && !admin && !admin_keys_.empty()) return Verdict::forbidden;
  return Verdict::allowed;
}

ApiKeys read_api_keys(const ActorOptions& options) {
  auto list = [&](const char* key) {
    const std::string text = text_option(options, key, "");
    std::vector<std::string> keys;
    for (std::string_view item : split_option(text, ',')) keys.emplace_back(item);
    return keys;
  };
  std::vector<std::string> keys = list("api_keys");
  keys.push_back(text_option(options, "api_key", ""));
  return ApiKeys(std::move(keys), list("admin_api_keys"));
}

}  // namespace mqlm::actors::front_end
