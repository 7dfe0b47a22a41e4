// The cache-writer's I/O thread: it owns the SSD tier (SsdStore) and does every file operation,
// so the actor's loop never waits on a disk. The actor posts jobs; results come back in a queue,
// and a byte on an inproc PAIR socket (which the actor watches) says there are some.
//
// Reads and clears go before queued writes: a request waiting on its prefix does not wait behind
// the pages being written. Writes and barriers go in order: a barrier answers once every write
// queued before it is done.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "actors/cache_writer/ssd_store.hpp"

namespace mqlm::actors {

struct CacheIoOptions {
  std::filesystem::path directory;  // the SSD tier
  std::uint64_t max_bytes = 0;
  bool fail_writes = false;         // fault injection: every write fails as on a full disk
};

struct WriteJob {
  StoredPage page;
  zmq::message_t data;  // shares the hot tier's frame: the bytes stay alive until written
};
struct ReadJob {
  std::uint64_t lookup = 0;
  std::vector<std::uint64_t> keys;  // read in order until the first that is missing or bad
};
struct ClearJob {
  std::uint64_t id = 0;
};
struct BarrierJob {
  std::uint64_t id = 0;
};

struct WriteDone {
  std::uint64_t key = 0;
  std::string model;
  bool ok = false;
  std::string error;
};
struct ReadDone {
  std::uint64_t lookup = 0;
  std::vector<SsdStore::ReadResult> pages;  // in order; the last may be missing, corrupt or failed
};
struct ClearDone {
  std::uint64_t id = 0;
  std::uint64_t bytes = 0;
  std::uint32_t pages = 0;
  std::string error;
};
struct BarrierDone {
  std::uint64_t id = 0;
};
struct IoResult {
  std::variant<WriteDone, ReadDone, ClearDone, BarrierDone> done;
  std::uint64_t ssd_bytes = 0;  // the tier after the job
  std::uint32_t ssd_pages = 0;
};

class CacheIo {
 public:
  // Opens the store (scanning the directory) in the thread that calls it, so a bad directory is
  // an error at start; `notify` is the endpoint of the actor's PAIR socket.
  CacheIo(CacheIoOptions options, zmq::context_t& context, const std::string& notify);
  ~CacheIo();  // stop(false) if not stopped
  CacheIo(const CacheIo&) = delete;
  CacheIo& operator=(const CacheIo&) = delete;

  void write(WriteJob job);
  void read(ReadJob job);
  void clear(ClearJob job);
  void barrier(BarrierJob job);
  // Takes queued writes out (those of `model`, or all): their frames are released here. Returns
  // how many.
  std::uint32_t drop_writes(const std::optional<std::string>& model);
  std::vector<IoResult> take_results();
  // Ends the thread: with finish_writes, after the queued writes; else dropping them.
  void stop(bool finish_writes);

  std::uint64_t ssd_bytes() const;
  std::uint32_t ssd_pages() const;
  std::uint64_t ssd_limit() const { return options_.max_bytes; }

 private:
  void run(zmq::context_t& context, std::string notify);
  IoResult handle(WriteJob& job);
  IoResult handle(ReadJob& job);
  IoResult handle(ClearJob& job);
  IoResult handle(BarrierJob& job);

  CacheIoOptions options_;
  SsdStore store_;  // touched only by the thread, after construction
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::variant<ReadJob, ClearJob>> urgent_;
  std::deque<std::variant<WriteJob, BarrierJob>> writes_;
  std::vector<IoResult> results_;
  std::uint64_t ssd_bytes_ = 0;
  std::uint32_t ssd_pages_ = 0;
  bool stopping_ = false, finish_writes_ = false;
  std::thread thread_;
};

}  // namespace mqlm::actors
