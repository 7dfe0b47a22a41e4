// Python's str methods that templates and filters share (ASCII case rules: Python's own apply
// Unicode's, which conversations rarely need in these places).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mqlm::model::jinja {

bool is_python_space(char c);  // str.isspace for ASCII: " \t\n\r\v\f" and \x1c-\x1f
// str.strip / lstrip / rstrip: `chars` nullopt strips whitespace.
std::string python_strip(std::string_view text, const std::optional<std::string>& chars, bool left, bool right);
// str.split(sep, maxsplit) (sep nullopt: runs of whitespace); rsplit when `from_right`.
std::vector<std::string> python_split(std::string_view text, const std::optional<std::string>& sep,
                                      std::int64_t maxsplit, bool from_right);
std::vector<std::string> python_splitlines(std::string_view text);
std::string python_replace(std::string_view text, std::string_view old, std::string_view replacement,
                           std::int64_t count);
std::string ascii_upper(std::string text);
std::string ascii_lower(std::string text);
std::string python_capitalize(std::string_view text);  // first character upper, the rest lower
std::string python_title(std::string_view text);       // str.title: each run of letters capitalised

}  // namespace mqlm::model::jinja
