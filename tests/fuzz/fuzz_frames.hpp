// How the decode() fuzzer turns one flat input into ZeroMQ frames, and back (for its seeds).
//
// The input is a run of records, each a 2-byte little-endian length then that many bytes, one
// frame per record. A length that overruns the input takes what is left; a single byte left
// over is a frame of its own. So every input is some list of frames, and a valid message is
// easy to write as a seed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <zmq.hpp>

namespace mqlm::messages::fuzz {

inline std::vector<zmq::message_t> split_frames(const std::uint8_t* data, std::size_t size) {
  std::vector<zmq::message_t> frames;
  std::size_t at = 0;
  while (at < size) {
    std::size_t length = size - at;
    if (length >= 2) {
      length = std::min<std::size_t>(data[at] | (std::size_t{data[at + 1]} << 8), size - at - 2);
      at += 2;
    }
    frames.emplace_back(data + at, length);
    at += length;
  }
  return frames;
}

// Frames of at most 65535 bytes each, laid out as split_frames reads them.
inline std::string join_frames(const std::vector<std::string>& frames) {
  std::string out;
  for (const std::string& frame : frames) {
    out += static_cast<char>(frame.size() & 0xff);
    out += static_cast<char>((frame.size() >> 8) & 0xff);
    out += frame;
  }
  return out;
}

}  // namespace mqlm::messages::fuzz
