// The SSD tier of the KV prefix cache: one file per page in one directory, which is also the
// index (rebuilt by scanning the headers at start). A page is its metadata and an opaque blob
// (its K and V); every read is checked against a hash, and a file that fails any check is
// deleted, since a cache can always recompute what it lost. Least recently used pages are
// evicted to keep the sum of file sizes under a limit.
//
// Owned by the cache-writer actor's I/O thread alone: not thread-safe, no locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace mqlm::actors {

// A page's metadata, kept in the file header and in the index.
struct StoredPage {
  std::string model;            // owner model id (<= 256 bytes)
  std::uint64_t model_key = 0;  // identity of the model's weights (mixed into key already)
  std::uint64_t key = 0;        // the page's chained prefix key
  std::uint64_t parent = 0;     // the previous page's key, 0 for a first page
  std::uint32_t page_size = 0;  // tokens per page
  std::vector<std::int32_t> tokens;  // (page_size) the page's tokens
  std::uint64_t data_bytes = 0;      // size of the blob
};

class SsdStore {
 public:
  // `directory` is created if missing; `max_bytes` bounds the sum of file sizes. Scans the
  // headers (not the data): temporaries and files whose header does not parse are deleted, the
  // rest form the index, oldest mtime least recently used. Throws std::runtime_error if the
  // directory cannot be created or listed.
  SsdStore(std::filesystem::path directory, std::uint64_t max_bytes);

  struct WriteResult {
    bool ok = false;
    std::string error;  // names the path and the system's reason
    std::uint64_t file_bytes = 0;
    std::uint64_t evicted_pages = 0, evicted_bytes = 0;
  };
  // Writes one page whole or not at all (temporary file, then rename), evicting least recently
  // used pages first until it fits. A page larger than max_bytes is refused. Never throws;
  // leaves no partial file. A key already stored is replaced. page.data_bytes is ignored: the
  // size of `data` is what is stored.
  WriteResult write(const StoredPage& page, std::span<const std::byte> data);

  enum class ReadStatus { ok, missing, corrupt, failed };
  struct ReadResult {
    ReadStatus status = ReadStatus::missing;
    StoredPage page;
    std::vector<std::byte> data;
    std::string error;  // why, for corrupt and failed
  };
  // Reads and checks a page and marks it most recently used. A file that fails a check is
  // deleted and dropped from the index (`corrupt`); I/O errors are `failed`.
  ReadResult read(std::uint64_t key);
  // Reads a run of pages, `threads` files at a time (an SSD serves several reads at once): the
  // results of keys[0], keys[1], ... up to and including the first that is not ok (missing,
  // corrupt or failed), each as read() would answer it.
  std::vector<ReadResult> read_run(std::span<const std::uint64_t> keys, unsigned threads);

  bool contains(std::uint64_t key) const { return index_.contains(key); }
  const StoredPage* find(std::uint64_t key) const;  // the index's metadata, or nullptr
  std::uint64_t bytes() const { return bytes_; }     // sum of the index's file sizes
  std::size_t pages() const { return index_.size(); }
  std::uint64_t max_bytes() const { return max_bytes_; }
  const std::filesystem::path& directory() const { return directory_; }

  // Deletes every page file; returns the bytes released (file sizes).
  std::uint64_t clear();

  // Where a key's page file is (or would be): `<directory>/<key in 16 hex digits>.kvpage`.
  std::filesystem::path page_path(std::uint64_t key) const;

 private:
  struct Entry {
    StoredPage page;
    std::uint64_t file_bytes = 0;
    std::list<std::uint64_t>::iterator recency;  // its place in recency_
  };

  void scan();
  void insert(StoredPage page, std::uint64_t file_bytes);
  void forget(std::uint64_t key);
  ReadResult corrupt(std::uint64_t key, std::string reason);
  struct FileRead;
  FileRead read_file(std::uint64_t key, std::uint64_t expected_bytes) const;
  ReadResult settle(std::uint64_t key, FileRead read);

  std::filesystem::path directory_;
  std::uint64_t max_bytes_;
  std::uint64_t bytes_ = 0;
  std::unordered_map<std::uint64_t, Entry> index_;
  std::list<std::uint64_t> recency_;  // keys, least recently used first
};

}  // namespace mqlm::actors
