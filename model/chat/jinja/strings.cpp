#include "model/chat/jinja/strings.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>

namespace mqlm::model::jinja {

bool is_python_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= '\x1c' && c <= '\x1f');
}

std::string python_strip(std::string_view text, const std::optional<std::string>& chars, bool left, bool right) {
  auto strippable = [&](char c) { return chars ? chars->find(c) != std::string::npos : is_python_space(c); };
  std::size_t begin = 0, end = text.size();
  while (left && begin < end && strippable(text[begin])) ++begin;
  while (right && end > begin && strippable(text[end - 1])) --end;
  return std::string(text.substr(begin, end - begin));
}

namespace {

std::vector<std::string> split_on_whitespace(std::string_view text, std::int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (from_right) {
    std::size_t end = text.size();
    while (true) {
      while (end > 0 && is_python_space(text[end - 1])) --end;
      if (end == 0) break;
      if (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) == maxsplit) {
        parts.emplace_back(text.substr(0, end));
        break;
      }
      std::size_t begin = end;
      while (begin > 0 && !is_python_space(text[begin - 1])) --begin;
      parts.emplace_back(text.substr(begin, end - begin));
      end = begin;
    }
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  std::size_t begin = 0;
  while (true) {
    while (begin < text.size() && is_python_space(text[begin])) ++begin;
    if (begin == text.size()) break;
    if (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) == maxsplit) {
      parts.emplace_back(text.substr(begin));
      break;
    }
    std::size_t end = begin;
    while (end < text.size() && !is_python_space(text[end])) ++end;
    parts.emplace_back(text.substr(begin, end - begin));
    begin = end;
  }
  return parts;
}

}  // namespace

std::vector<std::string> python_split(std::string_view text, const std::optional<std::string>& sep,
                                      std::int64_t maxsplit, bool from_right) {
  if (!sep) return split_on_whitespace(text, maxsplit, from_right);
  std::vector<std::string> parts;
  if (from_right) {
    std::size_t end = text.size();
    while (maxsplit < 0 || static_cast<std::int64_t>(parts.size()) < maxsplit) {
      std::size_t at = end >= sep->size() ? text.rfind(*sep, end - sep->size()) : std::string_view::npos;
      if (at == std::string_view::npos) break;
      parts.emplace_back(text.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    parts.emplace_back(text.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  std::size_t begin = 0;
  while (maxsplit < 0 || static_cast<std::int64_t>(parts.size()) < maxsplit) {
    std::size_t at = text.find(*sep, begin);
    if (at == std::string_view::npos) break;
    parts.emplace_back(text.substr(begin, at - begin));
    begin = at + sep->size();
  }
  parts.emplace_back(text.substr(begin));
  return parts;
}

std::vector<std::string> python_splitlines(std::string_view text) {
  std::vector<std::string> lines;
  std::size_t begin = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    std::size_t width = 0;
    if (c == '\n' || c == '\v' || c == '\f' || (c >= '\x1c' && c <= '\x1e')) width = 1;
    else if (c == '\r') width = i + 1 < text.size() && text[i + 1] == '\n' ? 2 : 1;
    else if (text.substr(i, 2) == "\xc2\x85") width = 2;
    else if (text.substr(i, 3) == "\xe2\x80\xa8" || text.substr(i, 3) == "\xe2\x80\xa9") width = 3;
    if (width == 0) continue;
    lines.emplace_back(text.substr(begin, i - begin));
    i += width - 1;
    begin = i + 1;
  }
  if (begin < text.size()) lines.emplace_back(text.substr(begin));
  return lines;
}

std::string python_replace(std::string_view text, std::string_view old, std::string_view replacement,
                           std::int64_t count) {
  std::string out;
  std::size_t begin = 0;
  std::int64_t done = 0;
  if (old.empty()) {  // between every character, and at both ends
    for (std::size_t i = 0; i <= text.size(); ++i) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      if (i < text.size()) out += text[i];
    }
    return out;
  }
  while (count < 0 || done < count) {
    std::size_t at = text.find(old, begin);
    if (at == std::string_view::npos) break;
    out.append(text.substr(begin, at - begin));
    out.append(replacement);
    begin = at + old.size();
    ++done;
  }
  out.append(text.substr(begin));
  return out;
}

std::string ascii_upper(std::string text) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

std::string ascii_lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string python_capitalize(std::string_view text) {
  std::string out = ascii_lower(std::string(text));
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string python_title(std::string_view text) {
  std::string out;
  bool previous_cased = false;
  for (char c : text) {
    bool letter = std::isalpha(static_cast<unsigned char>(c)) != 0;
    out += letter ? static_cast<char>(previous_cased ? std::tolower(static_cast<unsigned char>(c))
                                                     : std::toupper(static_cast<unsigned char>(c)))
                  : c;
    previous_cased = letter;
  }
  return out;
}

}  // namespace mqlm::model::jinja
