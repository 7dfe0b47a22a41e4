// Writing a GGUF file (v3 by default): metadata in the order first set, tensors in the order
// added, each tensor's data aligned to general.alignment (32 unless that key says otherwise).
//
// Tensor data is produced while writing, in pieces of any size, so a model larger than memory
// can be written from a few repeated buffers with large sequential writes.
// Misuse (a duplicate tensor, dims that do not fit the type, data of the wrong size) is a bug
// and throws std::invalid_argument / std::logic_error; failing to write the file is an error value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/gguf/gguf_types.hpp"

namespace mqlm::model::gguf {

class GgufWriter {
 public:
  using Emit = std::function<void(std::span<const std::byte>)>;
  // Produces a tensor's bytes, exactly its size in all, through emit.
  using TensorData = std::function<void(const Emit& emit)>;

  explicit GgufWriter(std::uint32_t version = 3);

  // Sets a key; setting it again replaces the value and keeps its place.
  void set(const std::string& key, MetadataValue value);
  // dims[0] is the contiguous one: a (rows, k) matrix has dims {k, rows}.
  void add_tensor(std::string name, TensorType type, std::vector<std::uint64_t> dims, TensorData data);
  void add_tensor(std::string name, TensorType type, std::vector<std::uint64_t> dims, std::vector<std::byte> bytes);

  std::uint64_t file_size() const;
  // Writes to a temporary file beside `path` and renames it, so `path` is never half written.
  // The error names the path, the byte it failed at and the system's reason.
  std::optional<GgufError> write(const std::filesystem::path& path) const;
  // The whole file in memory (tests, fuzzer seeds: small files).
  std::vector<std::byte> to_bytes() const;

 private:
  struct Tensor {
    std::string name;
    TensorType type;
    std::vector<std::uint64_t> dims;
    std::uint64_t bytes;
    TensorData data;
  };

  std::uint32_t alignment() const;
  std::vector<std::byte> header() const;  // everything before the data section, padding included
  void emit_file(const Emit& emit) const;

  std::uint32_t version_;
  std::vector<std::pair<std::string, MetadataValue>> metadata_;
  std::vector<Tensor> tensors_;
};

}  // namespace mqlm::model::gguf
