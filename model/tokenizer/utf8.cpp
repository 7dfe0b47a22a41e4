#include "model/tokenizer/utf8.hpp"

#include <cstdint>

namespace mqlm::model::utf8 {
namespace {

struct Lead {
  std::size_t length;                      // 0: not a lead byte
  std::uint8_t second_low, second_high;    // the range the second byte must fall in
};

// Table 3-7 of the Unicode standard: the second byte's range depends on the lead byte (this is
// what excludes overlong forms, surrogates and code points past U+10FFFF).
Lead lead_of(std::uint8_t byte) {
  if (byte < 0x80) return {1, 0, 0};
  if (byte >= 0xC2 && byte <= 0xDF) return {2, 0x80, 0xBF};
  if (byte == 0xE0) return {3, 0xA0, 0xBF};
  if (byte == 0xED) return {3, 0x80, 0x9F};
  if (byte >= 0xE1 && byte <= 0xEF) return {3, 0x80, 0xBF};
  if (byte == 0xF0) return {4, 0x90, 0xBF};
  if (byte == 0xF4) return {4, 0x80, 0x8F};
  if (byte >= 0xF1 && byte <= 0xF3) return {4, 0x80, 0xBF};
  return {0, 0, 0};
}

}  // namespace

Scan scan(std::string_view bytes) {
  const auto lead = lead_of(static_cast<std::uint8_t>(bytes[0]));
  if (lead.length == 0) return {Status::invalid, 1};
  for (std::size_t i = 1; i < lead.length; ++i) {
    if (i == bytes.size()) return {Status::incomplete, i};
    const auto byte = static_cast<std::uint8_t>(bytes[i]);
    const auto low = i == 1 ? lead.second_low : std::uint8_t{0x80};
    const auto high = i == 1 ? lead.second_high : std::uint8_t{0xBF};
    if (byte < low || byte > high) return {Status::invalid, i};
  }
  return {Status::complete, lead.length};
}

std::size_t symbol_length(std::string_view bytes) {
  const auto s = scan(bytes);
  return s.status == Status::complete ? s.length : 1;
}

void append_code_point(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string to_valid(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  while (!bytes.empty()) {
    const auto s = scan(bytes);
    if (s.status == Status::complete) {
      out.append(bytes.substr(0, s.length));
    } else {
      out.append(kReplacement);
    }
    bytes.remove_prefix(s.length);
  }
  return out;
}

}  // namespace mqlm::model::utf8
