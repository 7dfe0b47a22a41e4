// Message traces: every message an actor takes from its inbox (timers included) and every
// message it sends, mirrored to a recorder that writes one file. `mqlm trace show` prints it;
// replay reruns one actor on its recorded inbox (actors/replay.hpp).
//
// File: the 8 bytes "MQLMTRC1", then records, each a little-endian u32 length and a msgpack
// array (TraceRecord). A trace file is read as untrusted input: a bad one is an error naming the
// offset, never a crash.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "messages/codec.hpp"

namespace mqlm::actors {

enum class Direction : std::uint8_t { in = 0, out = 1 };

struct TraceRecord {
  std::int64_t at_ns = 0;        // when the actor took it from its inbox, or sent it
  std::uint8_t direction = 0;    // Direction
  std::string actor;             // whose inbox or outbox
  std::string peer;              // the sender (in) or the recipient (out)
  std::uint8_t kind = 0;         // 0 when the envelope did not decode
  std::uint64_t request_id = 0;
  std::uint8_t status = 0;       // SendStatus of an out record
  std::vector<std::string> frames;        // as on the wire; blob frames empty if left out
  std::vector<std::uint64_t> blob_sizes;  // the size of every blob frame
  bool blobs_left_out = false;
  MSGPACK_DEFINE(at_ns, direction, actor, peer, kind, request_id, status, frames, blob_sizes,
                 blobs_left_out);

  Direction dir() const { return static_cast<Direction>(direction); }
  // The frames to decode: blobs left out come back as zero-filled frames of their size.
  messages::Frames to_frames() const;
};

inline constexpr std::string_view kTraceMagic = "MQLMTRC1";

// Builds a record from frames about to be sent or just received (copies them).
TraceRecord make_trace_record(Direction direction, const std::string& actor, std::int64_t at_ns,
                              const messages::Frames& frames, bool keep_blobs, std::uint8_t status = 0);

// An actor's connection to the recorder. Recording blocks rather than drops once the recorder's
// high-water mark is reached: a trace with holes cannot be replayed.
class TraceTap {
 public:
  TraceTap(zmq::context_t& context, const std::string& endpoint, bool keep_blobs);
  void record(Direction direction, const std::string& actor, std::int64_t at_ns,
              const messages::Frames& frames, std::uint8_t status = 0);

 private:
  zmq::socket_t socket_;
  bool keep_blobs_;
};

// The recorder: a thread that binds the trace endpoint and appends every record to a file.
class TraceRecorder {
 public:
  TraceRecorder(zmq::context_t& context, std::string endpoint, std::filesystem::path file);
  ~TraceRecorder();
  // Call after every actor has stopped: writes what is still on its way, then closes the file.
  void stop();
  std::uint64_t records_written() const { return written_; }

 private:
  void run(std::promise<void> ready);

  zmq::context_t& context_;
  std::string endpoint_;
  std::filesystem::path file_;
  std::thread thread_;
  std::uint64_t written_ = 0;  // read only after join
  bool stopped_ = false;
};

struct TraceReadError {
  std::uint64_t offset = 0;
  std::string detail;
};

// Reads a whole trace file.
std::variant<std::vector<TraceRecord>, TraceReadError> read_trace(const std::filesystem::path& file);

}  // namespace mqlm::actors
