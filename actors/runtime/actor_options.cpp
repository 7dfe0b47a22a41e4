#include "actors/runtime/actor_options.hpp"

#include <algorithm>
#include <charconv>
#include <stdexcept>

#include <fmt/format.h>

namespace mqlm::actors {

void check_option_names(std::string_view kind, const ActorOptions& options,
                        std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : options) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      throw std::invalid_argument(fmt::format("actor {} has no option '{}' (it takes: {})", kind, key,
                                              known.size() == 0 ? "none" : fmt::format("{}", fmt::join(known, ", "))));
    }
  }
}

std::uint64_t parse_number_option(std::string_view kind, std::string_view key, std::string_view text,
                                  std::uint64_t low, std::uint64_t high) {
  std::uint64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size() || value < low || value > high) {
    throw std::invalid_argument(
        fmt::format("{} option {}={}: want a whole number from {} to {}", kind, key, text, low, high));
  }
  return value;
}

std::uint64_t number_option(std::string_view kind, const ActorOptions& options, const std::string& key,
                            std::uint64_t fallback, std::uint64_t low, std::uint64_t high) {
  auto it = options.find(key);
  return it == options.end() ? fallback : parse_number_option(kind, key, it->second, low, high);
}

double fraction_option(std::string_view kind, const ActorOptions& options, const std::string& key, double fallback) {
  auto it = options.find(key);
  if (it == options.end()) return fallback;
  const std::string& text = it->second;
  double value = 0.0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || !(value > 0.0 && value <= 1.0)) {
    throw std::invalid_argument(
        fmt::format("{} option {}={}: give a fraction above 0 and at most 1 (e.g. 0.85)", kind, key, text));
  }
  return value;
}

std::string text_option(const ActorOptions& options, const std::string& key, std::string fallback) {
  auto it = options.find(key);
  return it == options.end() ? fallback : it->second;
}

std::vector<std::string_view> split_option(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  while (!text.empty()) {
    const auto at = text.find(separator);
    parts.push_back(text.substr(0, at));
    text = at == std::string_view::npos ? std::string_view{} : text.substr(at + 1);
  }
  return parts;
}

namespace {

// NAME=VALUE;NAME2=VALUE2 -> {NAME: VALUE, ...}; `form` names the pair for errors ("ID=PATH").
std::map<std::string, std::string> parse_pairs(std::string_view kind, std::string_view key, std::string_view text,
                                               std::string_view form) {
  std::map<std::string, std::string> pairs;
  for (std::string_view entry : split_option(text, ';')) {
    const auto equals = entry.find('=');
    if (equals == std::string_view::npos || equals == 0 || equals + 1 == entry.size()) {
      throw std::invalid_argument(fmt::format("{} option {}={}: '{}' is not {} (a non-empty name without '=' or "
                                              "';', then its value)",
                                              kind, key, text, entry, form));
    }
    const std::string name(entry.substr(0, equals));
    if (!pairs.emplace(name, std::string(entry.substr(equals + 1))).second) {
      throw std::invalid_argument(fmt::format("{} option {}={} names '{}' twice", kind, key, text, name));
    }
  }
  return pairs;
}

}  // namespace

std::map<std::string, std::filesystem::path> parse_model_list(std::string_view kind, std::string_view text) {
  std::map<std::string, std::filesystem::path> models;
  for (auto& [id, path] : parse_pairs(kind, "models", text, "ID=PATH")) models.emplace(id, path);
  if (models.empty()) throw std::invalid_argument(fmt::format("{} option models= is empty: give ID=PATH;ID2=PATH2", kind));
  return models;
}

std::map<std::string, std::string> pair_list_option(std::string_view kind, const ActorOptions& options,
                                                    const std::string& key) {
  auto it = options.find(key);
  return it == options.end() ? std::map<std::string, std::string>{} : parse_pairs(kind, key, it->second, "NAME=VALUE");
}

std::map<std::string, std::string> aliases_option(std::string_view kind, const ActorOptions& options,
                                                  const std::map<std::string, std::filesystem::path>& models) {
  std::map<std::string, std::string> aliases = pair_list_option(kind, options, "aliases");
  for (const auto& [alias, id] : aliases) {
    if (models.contains(alias)) {
      throw std::invalid_argument(
          fmt::format("{} option aliases=: '{}' is a model's id already, so it cannot be an alias", kind, alias));
    }
    if (!models.contains(id)) {
      throw std::invalid_argument(
          fmt::format("{} option aliases=: alias '{}' names model '{}', which is not configured", kind, alias, id));
    }
  }
  return aliases;
}

}  // namespace mqlm::actors
