// The options an actor kind is built with ("key=value" from `mqlm node --set`, `mqlm serve`,
// `mqlm trace replay`), and the one way every kind reads them, so that a misspelt key or a
// number out of range is refused alike whichever actor it was meant for.
#pragma once

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace mqlm::actors {

using ActorOptions = std::map<std::string, std::string>;

// Throws std::invalid_argument naming the first key `kind` does not take, and those it does.
void check_option_names(std::string_view kind, const ActorOptions& options,
                        std::initializer_list<std::string_view> known);

// `text` as a decimal whole number in [low, high], with nothing before or after it; otherwise
// std::invalid_argument naming kind, key, the text and the range.
std::uint64_t parse_number_option(std::string_view kind, std::string_view key, std::string_view text,
                                  std::uint64_t low, std::uint64_t high);

// The option's number, or `fallback` when it is not given.
std::uint64_t number_option(std::string_view kind, const ActorOptions& options, const std::string& key,
                            std::uint64_t fallback, std::uint64_t low = 0,
                            std::uint64_t high = std::numeric_limits<std::uint64_t>::max());

// The option's fraction in (0, 1], or `fallback` when it is not given; std::invalid_argument
// naming kind, key and the text otherwise.
double fraction_option(std::string_view kind, const ActorOptions& options, const std::string& key, double fallback);

// The option's text, or `fallback` when it is not given.
std::string text_option(const ActorOptions& options, const std::string& key, std::string fallback);

// "a,b,,c" -> {"a", "b", "", "c"}; "a," -> {"a"}; "" -> {}.
std::vector<std::string_view> split_option(std::string_view text, char separator);

// The model list every actor of the model pool takes as option models=ID=PATH;ID2=PATH2 (ids not
// empty, without '=' or ';'); std::invalid_argument naming kind for a malformed, repeated or
// empty list.
std::map<std::string, std::filesystem::path> parse_model_list(std::string_view kind, std::string_view text);

// Option `key` as NAME=VALUE;NAME2=VALUE2 (names not empty, without '=' or ';', each once; values
// not empty); {} when it is not given. std::invalid_argument naming kind and key otherwise.
std::map<std::string, std::string> pair_list_option(std::string_view kind, const ActorOptions& options,
                                                    const std::string& key);

// Option aliases=NAME=ID;NAME2=ID2: other names clients may use for configured models. Returns
// alias -> id; an alias that is an id, or names a model that is not configured, is refused.
std::map<std::string, std::string> aliases_option(std::string_view kind, const ActorOptions& options,
                                                  const std::map<std::string, std::filesystem::path>& models);

}  // namespace mqlm::actors
