// UTF-8 as the tokenizers need it: cutting text into characters while tolerating invalid bytes,
// and turning arbitrary bytes into valid UTF-8 (each maximal ill-formed subpart becomes one
// U+FFFD, the practice Unicode recommends and browsers follow).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mqlm::model::utf8 {

enum class Status {
  complete,    // a well-formed character of `length` bytes
  incomplete,  // the `length` bytes are a well-formed start, cut off by the end of the input
  invalid,     // the first `length` bytes (at least 1) are an ill-formed sequence
};

struct Scan {
  Status status = Status::invalid;
  std::size_t length = 0;
};

// What starts `bytes` (which must not be empty), by Unicode's table of well-formed sequences.
Scan scan(std::string_view bytes);

// Bytes of the character at the start of `bytes`, or 1 where it is not a whole valid character:
// how text is cut into the symbols that merges start from.
std::size_t symbol_length(std::string_view bytes);

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

void append_code_point(std::string& out, char32_t code_point);

// `bytes` with every ill-formed part (an unfinished character at the end included) replaced.
std::string to_valid(std::string_view bytes);

}  // namespace mqlm::model::utf8
