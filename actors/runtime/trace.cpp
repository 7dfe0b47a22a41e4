#include "actors/runtime/trace.hpp"

#include <array>
#include <cstring>

#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

namespace mqlm::actors {
namespace {

constexpr int kTapHighWaterMark = 100000;
constexpr std::uint32_t kMaxRecordBytes = 1u << 31;

std::string frame_string(const zmq::message_t& frame) {
  return std::string(static_cast<const char*>(frame.data()), frame.size());
}

}  // namespace

messages::Frames TraceRecord::to_frames() const {
  messages::Frames out;
  out.reserve(frames.size());
  for (std::size_t i = 0; i < frames.size(); ++i) {
    if (blobs_left_out && i >= 2 && i - 2 < blob_sizes.size()) {
      zmq::message_t zeros(blob_sizes[i - 2]);
      std::memset(zeros.data(), 0, zeros.size());
      out.push_back(std::move(zeros));
    } else {
      out.emplace_back(frames[i].data(), frames[i].size());
    }
  }
  return out;
}

TraceRecord make_trace_record(Direction direction, const std::string& actor, std::int64_t at_ns,
                              const messages::Frames& frames, bool keep_blobs, std::uint8_t status) {
  TraceRecord record;
  record.at_ns = at_ns;
  record.direction = static_cast<std::uint8_t>(direction);
  record.actor = actor;
  record.status = status;
  record.blobs_left_out = !keep_blobs;
  if (!frames.empty()) {
    auto envelope = messages::decode_envelope(std::span<const std::byte>(
        static_cast<const std::byte*>(frames[0].data()), frames[0].size()));
    if (auto* e = std::get_if<messages::Envelope>(&envelope)) {
      record.kind = static_cast<std::uint8_t>(e->kind);
      record.request_id = e->request_id;
      record.peer = direction == Direction::in ? e->from : e->to;
    } else if (auto* err = std::get_if<messages::DecodeError>(&envelope); err && err->envelope) {
      record.kind = static_cast<std::uint8_t>(err->envelope->kind);
      record.request_id = err->envelope->request_id;
      record.peer = direction == Direction::in ? err->envelope->from : err->envelope->to;
    }
  }
  for (std::size_t i = 0; i < frames.size(); ++i) {
    bool blob = i >= 2;
    if (blob) record.blob_sizes.push_back(frames[i].size());
    record.frames.push_back(blob && !keep_blobs ? std::string{} : frame_string(frames[i]));
  }
  return record;
}

TraceTap::TraceTap(zmq::context_t& context, const std::string& endpoint, bool keep_blobs)
    : socket_(context, zmq::socket_type::push), keep_blobs_(keep_blobs) {
  socket_.set(zmq::sockopt::sndhwm, kTapHighWaterMark);
  socket_.set(zmq::sockopt::linger, 5000);
  socket_.connect(endpoint);
}

void TraceTap::record(Direction direction, const std::string& actor, std::int64_t at_ns,
                      const messages::Frames& frames, std::uint8_t status) {
  msgpack::sbuffer buffer;
  msgpack::pack(buffer, make_trace_record(direction, actor, at_ns, frames, keep_blobs_, status));
  socket_.send(zmq::buffer(buffer.data(), buffer.size()), zmq::send_flags::none);
}

TraceRecorder::TraceRecorder(zmq::context_t& context, std::string endpoint, std::filesystem::path file)
    : context_(context), endpoint_(std::move(endpoint)), file_(std::move(file)) {
  std::promise<void> ready;
  auto started = ready.get_future();
  thread_ = std::thread(&TraceRecorder::run, this, std::move(ready));
  try {
    started.get();
  } catch (...) {
    thread_.join();
    throw;
  }
}

TraceRecorder::~TraceRecorder() { stop(); }

void TraceRecorder::stop() {
  if (stopped_) return;
  stopped_ = true;
  zmq::socket_t control(context_, zmq::socket_type::push);
  control.set(zmq::sockopt::linger, 1000);
  control.connect(endpoint_);
  control.send(zmq::message_t{}, zmq::send_flags::none);  // an empty frame: no more records
  thread_.join();
}

void TraceRecorder::run(std::promise<void> ready) {
  std::ofstream out;
  zmq::socket_t inbox(context_, zmq::socket_type::pull);
  try {
    out.open(file_, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("cannot write trace file " + file_.string());
    out.write(kTraceMagic.data(), kTraceMagic.size());
    inbox.set(zmq::sockopt::rcvhwm, kTapHighWaterMark);
    inbox.set(zmq::sockopt::linger, 0);
    inbox.bind(endpoint_);
  } catch (...) {
    ready.set_exception(std::current_exception());
    return;
  }
  ready.set_value();

  auto write = [&](const zmq::message_t& record) {
    std::uint32_t size = static_cast<std::uint32_t>(record.size());
    std::array<char, 4> length{static_cast<char>(size), static_cast<char>(size >> 8),
                               static_cast<char>(size >> 16), static_cast<char>(size >> 24)};
    out.write(length.data(), 4);
    out.write(static_cast<const char*>(record.data()), record.size());
    ++written_;
  };
  bool stopping = false;
  while (true) {
    zmq::message_t record;
    // After the stop marker, records still on their way from other pipes are taken until the
    // inbox has been quiet for a moment.
    if (stopping) {
      zmq::pollitem_t item{inbox.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(200)) == 0) break;
    }
    if (!inbox.recv(record, zmq::recv_flags::none)) continue;
    if (record.size() == 0) {
      stopping = true;
      continue;
    }
    write(record);
  }
  out.flush();
  if (!out) spdlog::error("trace: writing {} failed (disk full?)", file_.string());
}

std::variant<std::vector<TraceRecord>, TraceReadError> read_trace(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return TraceReadError{0, "cannot open " + file.string()};
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.size() < kTraceMagic.size() || data.compare(0, kTraceMagic.size(), kTraceMagic) != 0) {
    return TraceReadError{0, "not an mqlm trace (no MQLMTRC1 header)"};
  }
  std::vector<TraceRecord> records;
  std::size_t offset = kTraceMagic.size();
  while (offset < data.size()) {
    if (data.size() - offset < 4) return TraceReadError{offset, "truncated record length"};
    const auto* p = reinterpret_cast<const unsigned char*>(data.data() + offset);
    std::uint32_t size = p[0] | (p[1] << 8) | (p[2] << 16) | (std::uint32_t{p[3]} << 24);
    if (size > kMaxRecordBytes || size > data.size() - offset - 4) {
      return TraceReadError{offset, "record of " + std::to_string(size) + " bytes runs past the end"};
    }
    const char* body = data.data() + offset + 4;
    try {
      std::size_t used = 0;
      auto handle = msgpack::unpack(body, size, used, nullptr, nullptr,
                                    msgpack::unpack_limit(size, size, size, size, 0, 8));
      if (used != size) return TraceReadError{offset, "record has trailing bytes"};
      TraceRecord record;
      handle.get().convert(record);
      if (record.direction > 1) return TraceReadError{offset, "record direction out of range"};
      records.push_back(std::move(record));
    } catch (const std::exception& e) {
      return TraceReadError{offset, std::string("bad record: ") + e.what()};
    }
    offset += 4 + size;
  }
  return records;
}

}  // namespace mqlm::actors
