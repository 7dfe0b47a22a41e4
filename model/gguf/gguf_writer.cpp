#include "model/gguf/gguf_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace mqlm::model::gguf {

namespace {

std::uint64_t align_up(std::uint64_t value, std::uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

class ByteSink {
 public:
  std::vector<std::byte> bytes;

  template <typename T>
  void put(T value) {
    auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& text) {
    put<std::uint64_t>(text.size());
    auto* p = reinterpret_cast<const std::byte*>(text.data());
    bytes.insert(bytes.end(), p, p + text.size());
  }
  void put_array(const MetadataArray& array) {
    put<std::uint32_t>(static_cast<std::uint32_t>(array.element_type()));
    put<std::uint64_t>(array.size());
    std::visit(
        [this](const auto& values) {
          for (const auto& value : values) put_element(value);
        },
        array.elements);
  }
  void put_value(const MetadataValue& value) {
    std::visit([this](const auto& v) { put_element(v); }, value);
  }

 private:
  template <typename T>
  void put_element(const T& value) {
    if constexpr (std::is_same_v<T, std::string>) {
      put_string(value);
    } else if constexpr (std::is_same_v<T, MetadataArray>) {
      put_array(value);
    } else if constexpr (std::is_same_v<T, bool>) {
      put<std::uint8_t>(value ? 1 : 0);
    } else {
      put<T>(value);
    }
  }
};

// Buffers small writes and passes large ones straight to the kernel; remembers the first failure.
class FileSink {
 public:
  explicit FileSink(int fd) : fd_(fd) { buffer_.reserve(kBufferBytes); }

  void write(std::span<const std::byte> bytes) {
    if (failed()) return;
    // What is buffered goes first: a large piece written straight through must not overtake it.
    if (bytes.size() >= kDirectBytes || buffer_.size() + bytes.size() > kBufferBytes) flush();
    if (bytes.size() >= kDirectBytes) {
      write_all(bytes);
    } else {
      buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
    }
  }
  void flush() {
    write_all(buffer_);
    buffer_.clear();
  }
  bool failed() const { return error_ != 0; }
  int error() const { return error_; }
  std::uint64_t written() const { return written_; }

 private:
  static constexpr std::size_t kBufferBytes = std::size_t{4} << 20;
  static constexpr std::size_t kDirectBytes = std::size_t{1} << 20;  // larger pieces skip the copy

  void write_all(std::span<const std::byte> bytes) {
    while (!bytes.empty() && !failed()) {
      ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error_ = n < 0 ? errno : EIO;
        return;
      }
      written_ += static_cast<std::uint64_t>(n);
      bytes = bytes.subspan(static_cast<std::size_t>(n));
    }
  }

  int fd_;
  std::vector<std::byte> buffer_;
  std::uint64_t written_ = 0;
  int error_ = 0;
};

}  // namespace

GgufWriter::GgufWriter(std::uint32_t version) : version_(version) {
  if (version != 2 && version != 3) throw std::invalid_argument("GgufWriter writes GGUF versions 2 and 3");
}

void GgufWriter::set(const std::string& key, MetadataValue value) {
  if (key == kAlignmentKey) {
    const auto* alignment = std::get_if<std::uint32_t>(&value);
    if (alignment == nullptr || *alignment == 0 || !std::has_single_bit(*alignment)) {
      throw std::invalid_argument("general.alignment must be a u32 power of two");
    }
  }
  for (auto& [existing, old] : metadata_) {
    if (existing == key) {
      old = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

void GgufWriter::add_tensor(std::string name, TensorType type, std::vector<std::uint64_t> dims, TensorData data) {
  for (const auto& t : tensors_) {
    if (t.name == name) throw std::invalid_argument("tensor " + name + " added twice");
  }
  const TensorTypeTraits* traits = tensor_type_traits(static_cast<std::uint32_t>(type));
  if (traits == nullptr || dims.empty() || dims.size() > kMaxDims || dims[0] % traits->block_elements != 0) {
    throw std::invalid_argument(fmt::format("tensor {}: {} dims [{}] do not fit type {}", name, dims.size(),
                                            fmt::join(dims, ", "), tensor_type_name(type)));
  }
  std::uint64_t elements = 1;
  for (auto d : dims) elements *= d;
  std::uint64_t bytes = elements / traits->block_elements * traits->block_bytes;
  tensors_.push_back(Tensor{std::move(name), type, std::move(dims), bytes, std::move(data)});
}

void GgufWriter::add_tensor(std::string name, TensorType type, std::vector<std::uint64_t> dims,
                            std::vector<std::byte> bytes) {
  auto owned = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  add_tensor(std::move(name), type, std::move(dims), [owned](const Emit& emit) { emit(*owned); });
}

std::uint32_t GgufWriter::alignment() const {
  for (const auto& [key, value] : metadata_) {
    if (key == kAlignmentKey) return std::get<std::uint32_t>(value);
  }
  return kDefaultAlignment;
}

std::vector<std::byte> GgufWriter::header() const {
  ByteSink out;
  out.put<std::uint32_t>(kMagic);
  out.put<std::uint32_t>(version_);
  out.put<std::uint64_t>(tensors_.size());
  out.put<std::uint64_t>(metadata_.size());
  for (const auto& [key, value] : metadata_) {
    out.put_string(key);
    out.put<std::uint32_t>(static_cast<std::uint32_t>(type_of(value)));
    out.put_value(value);
  }
  std::uint64_t offset = 0;
  for (const auto& t : tensors_) {
    out.put_string(t.name);
    out.put<std::uint32_t>(static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) out.put<std::uint64_t>(d);
    out.put<std::uint32_t>(static_cast<std::uint32_t>(t.type));
    out.put<std::uint64_t>(offset);
    offset = align_up(offset + t.bytes, alignment());
  }
  out.bytes.resize(align_up(out.bytes.size(), alignment()));
  return std::move(out.bytes);
}

std::uint64_t GgufWriter::file_size() const {
  std::uint64_t size = header().size();
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    size += tensors_[i].bytes;
    if (i + 1 < tensors_.size()) size = align_up(size, alignment());
  }
  return size;
}

// Padding follows every tensor but the last, so the file ends where the last tensor does.
void GgufWriter::emit_file(const Emit& emit) const {
  emit(header());
  const std::vector<std::byte> zeros(alignment());
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    std::uint64_t produced = 0;
    t.data([&](std::span<const std::byte> piece) {
      produced += piece.size();
      if (produced > t.bytes) throw std::logic_error("tensor " + t.name + ": more data than its dims take");
      emit(piece);
    });
    if (produced != t.bytes) {
      throw std::logic_error(fmt::format("tensor {}: {} bytes of data for dims that take {}", t.name, produced, t.bytes));
    }
    if (i + 1 < tensors_.size()) {
      emit(std::span(zeros).first(align_up(t.bytes, alignment()) - t.bytes));
    }
  }
}

std::vector<std::byte> GgufWriter::to_bytes() const {
  std::vector<std::byte> out;
  emit_file([&](std::span<const std::byte> piece) { out.insert(out.end(), piece.begin(), piece.end()); });
  return out;
}

std::optional<GgufError> GgufWriter::write(const std::filesystem::path& path) const {
  std::filesystem::path temporary = path;
  temporary += ".partial";
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return GgufError{0, fmt::format("cannot create {}: {}", temporary.string(), std::strerror(errno))};
  FileSink sink(fd);
  try {
    emit_file([&](std::span<const std::byte> piece) { sink.write(piece); });
  } catch (...) {  // a tensor that produced the wrong size: a bug, but leave no partial file
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  sink.flush();
  int error = sink.error();
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && ::rename(temporary.c_str(), path.c_str()) != 0) {
    error = errno;
    ::unlink(temporary.c_str());
    return GgufError{0, fmt::format("cannot rename {} to {}: {}", temporary.string(), path.string(), std::strerror(error))};
  }
  if (error != 0) {
    ::unlink(temporary.c_str());
    return GgufError{sink.written(), fmt::format("cannot write {}: {}", path.string(), std::strerror(error))};
  }
  return std::nullopt;
}

}  // namespace mqlm::model::gguf
