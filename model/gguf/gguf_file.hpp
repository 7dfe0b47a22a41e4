// Reading a GGUF file (v2 or v3, little-endian): its metadata, its tensor infos and views of
// their data in the memory-mapped file.
//
// The file is untrusted. Every count, length, type, dimension and offset is checked against the
// bytes left before it is used, so a truncated, corrupted or hostile file gives a GgufError
// (what was wrong and the byte offset of the field) rather than a crash, a hang or an
// allocation the file's size does not bound (parsed metadata takes at most a few times the
// bytes it was read from). Tensor data is not read at open: it stays in the mapping, and its
// ranges have been checked to lie in the file, aligned and without overlap.
//
// The mapping assumes the file does not shrink while it is open (another process truncating it
// would fault on access, as with any mapped file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "model/gguf/gguf_types.hpp"
#include "model/gguf/mapped_file.hpp"

namespace mqlm::model::gguf {

struct MetadataEntry {
  std::string key;
  MetadataValue value;
  std::uint64_t offset = 0;  // where the entry (its key) begins in the file
};

struct TensorInfo {
  std::string name;
  TensorType type = TensorType::f32;
  // dims[0] is the contiguous one: a (rows, k) row-major matrix has dims {k, rows}.
  std::vector<std::uint64_t> dims;
  std::uint64_t offset = 0;       // of its data, counted from GgufFile::data_offset()
  std::uint64_t bytes = 0;        // size of its data
  std::uint64_t info_offset = 0;  // where its tensor info begins in the file

  std::uint64_t elements() const;
  std::uint64_t row_length() const { return dims.empty() ? 0 : dims[0]; }
  std::uint64_t rows() const;  // elements / row_length (1 for a vector)
};

// The weight type to compute the tensor with, or an error naming the tensor, its type and the
// types mqlm computes with (gpu::all_weight_types) when it is one mqlm recognises but does not
// compute with (IQ2_XS, TQ1_0, ...).
GgufResult<gpu::WeightType> weight_type(const TensorInfo& tensor);

class GgufFile {
 public:
  // Maps the file and parses it. The error's detail starts with the path when the file could
  // not be opened at all.
  static GgufResult<GgufFile> open(const std::filesystem::path& path);
  // Parses bytes held in memory (tests, the fuzzer); the file keeps them.
  static GgufResult<GgufFile> parse(std::vector<std::byte> bytes);

  std::uint32_t version() const { return version_; }
  std::uint64_t file_size() const { return bytes_.size(); }
  std::uint32_t alignment() const { return alignment_; }
  std::uint64_t data_offset() const { return data_offset_; }

  // Metadata in file order, and by key.
  const std::vector<MetadataEntry>& metadata() const { return metadata_; }
  const MetadataEntry* find(std::string_view key) const;

  // The value when it is present with exactly type T (one of MetadataValue's alternatives).
  template <typename T>
  const T* get(std::string_view key) const {
    const MetadataEntry* entry = find(key);
    return entry ? std::get_if<T>(&entry->value) : nullptr;
  }
  // The elements when the value is an array of exactly T.
  template <typename T>
  const std::vector<T>* get_array(std::string_view key) const {
    const auto* array = get<MetadataArray>(key);
    return array ? std::get_if<std::vector<T>>(&array->elements) : nullptr;
  }
  // Lenient numeric getters, since writers differ in the integer widths they choose: any integer
  // type whose value fits, any float type. nullopt when absent, of another type or out of range.
  std::optional<std::uint64_t> get_uint(std::string_view key) const;
  std::optional<std::int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<std::string_view> get_string(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  // The error to return when a getter found nothing usable: "metadata key K is missing" or
  // "metadata key K is a string, expected <expected>", at the entry's offset.
  GgufError key_error(std::string_view key, std::string_view expected) const;

  // Tensors in file order, and by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* tensor(std::string_view name) const;
  // The tensor's bytes in the mapping (checked at parse time to lie in the file).
  std::span<const std::byte> data(const TensorInfo& tensor) const;

 private:
  friend class GgufParser;
  GgufFile() = default;

  std::variant<std::vector<std::byte>, MappedFile> storage_;
  std::span<const std::byte> bytes_;  // of storage_; moving either keeps the bytes where they are
  std::uint32_t version_ = 0;
  std::uint32_t alignment_ = kDefaultAlignment;
  std::uint64_t data_offset_ = 0;
  std::vector<MetadataEntry> metadata_;
  std::map<std::string, std::size_t, std::less<>> metadata_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

}  // namespace mqlm::model::gguf
