#include "actors/runtime/curve_keys.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace mqlm::actors::curve {
namespace {

constexpr const char* kPublicLabel = "public-key";
constexpr const char* kSecretLabel = "secret-key";
// Far more than any list of client keys (41 bytes each); a bound on what a path can make us read.
constexpr std::uintmax_t kMaxKeyFileBytes = 16 << 20;

// A line of a key file that is not blank or a comment, with its number for messages.
struct KeyLine {
  int number = 0;
  std::string text;
};

std::string trimmed(const std::string& line) {
  const auto first = line.find_first_not_of(" \t\r");
  if (first == std::string::npos) return {};
  return line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
}

std::variant<std::vector<KeyLine>, KeyError> read_key_lines(const std::string& path) {
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  if (error) return KeyError{path + ": " + error.message()};
  if (size > kMaxKeyFileBytes)
    return KeyError{path + ": too large for a key file (" + std::to_string(size) + " bytes)"};
  std::ifstream file(path);
  if (!file) return KeyError{path + ": cannot be read: " + std::strerror(errno)};
  std::vector<KeyLine> lines;
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    std::string text = trimmed(line);
    // '#' is a Z85 character, but never a key's first: 4 bytes are below 83 * 85^4, so a 5-character
    // group starts with Z85's character 82 ('%') at most, and '#' is its 84th.
    if (!text.empty() && text[0] != '#') lines.push_back({number, std::move(text)});
  }
  return lines;
}

// Why `text` is not a Z85 key, or nothing when it is one.
std::optional<std::string> key_problem(const std::string& text) {
  if (text.size() != kZ85KeyChars) {
    return "a key is " + std::to_string(kZ85KeyChars) + " characters of Z85 text, this one has " +
           std::to_string(text.size());
  }
  std::array<std::uint8_t, kKeyBytes> bytes{};
  if (zmq_z85_decode(bytes.data(), text.c_str()) == nullptr) return std::string("not Z85 text");
  return std::nullopt;
}

KeyError line_error(const std::string& path, const KeyLine& line, const std::string& problem) {
  return KeyError{path + ":" + std::to_string(line.number) + ": " + problem};
}

// "LABEL KEY" of a key pair file, or the problem with the line.
std::variant<std::string, KeyError> labelled_key(const std::string& path, const KeyLine& line, const char* label) {
  std::istringstream words(line.text);
  std::string first, key, extra;
  words >> first >> key >> extra;
  if (first != label || key.empty() || !extra.empty()) {
    return line_error(path, line, std::string("wanted \"") + label + " KEY\"; is this a file `mqlm keygen` wrote?");
  }
  if (auto problem = key_problem(key)) return line_error(path, line, *problem);
  return key;
}

// Others than the owner may read a secret key only by a mistake: the key is no longer secret.
std::optional<KeyError> exposed_secret(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) return KeyError{path + ": " + std::strerror(errno)};
  if ((status.st_mode & (S_IRWXG | S_IRWXO)) == 0) return std::nullopt;
  return KeyError{path + " holds a secret key that others may read (mode " +
                  fmt::format("{:o}", status.st_mode & 0777) +
                  "): make a new pair with `mqlm keygen`, or, if nobody else could have read it, chmod 600 " + path};
}

// Creates `path` holding `text` with `mode`, never replacing a file.
std::optional<KeyError> create_file(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return KeyError{path + ": cannot be created: " + std::strerror(errno)};
  const bool written = ::fchmod(fd, mode) == 0 &&
                       ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (written) return std::nullopt;
  ::unlink(path.c_str());
  return KeyError{path + ": cannot be written: " + std::strerror(saved)};
}

// Each key of a file of public keys, checked, added to `keys`.
std::optional<KeyError> add_public_keys(const std::string& path, std::set<std::string>& keys) {
  auto lines = read_key_lines(path);
  if (auto* error = std::get_if<KeyError>(&lines)) return *error;
  for (const KeyLine& line : std::get<std::vector<KeyLine>>(lines)) {
    if (line.text.starts_with(kSecretLabel) || line.text.starts_with(kPublicLabel)) {
      return line_error(path, line,
                        "a key pair file's line: give public keys (NAME.pub) here, and keep NAME.key "
                        "private");
    }
    if (auto problem = key_problem(line.text)) return line_error(path, line, *problem + " (one key per line)");
    keys.insert(line.text);
  }
  return std::nullopt;
}

}  // namespace

bool available() { return zmq_has("curve") != 0; }

KeyPair generate() {
  std::array<char, kZ85KeyChars + 1> public_key{}, secret_key{};
  if (zmq_curve_keypair(public_key.data(), secret_key.data()) != 0) {
    throw std::runtime_error(std::string("zmq_curve_keypair failed: ") + zmq_strerror(zmq_errno()));
  }
  return {public_key.data(), secret_key.data()};
}

std::variant<std::monostate, KeyError> write_key_files(const std::string& base, const KeyPair& pair) {
  const std::string key_path = base + ".key", pub_path = base + ".pub";
  for (const std::string& path : {key_path, pub_path}) {
    std::error_code error;
    if (std::filesystem::exists(path, error) || error) {
      return KeyError{path + " exists already: choose another name, or move it away first"};
    }
  }
  const std::string name = std::filesystem::path(base).filename().string();
  const std::string key_text = "# mqlm CURVE key pair '" + name + "' (made by mqlm keygen). Keep this file private.\n" +
                               kPublicLabel + " " + pair.public_key + "\n" + kSecretLabel + " " + pair.secret_key +
                               "\n";
  const std::string pub_text = "# mqlm CURVE public key '" + name +
                               "' (made by mqlm keygen): give it to the other side.\n" + pair.public_key + "\n";
  if (auto error = create_file(key_path, key_text, 0600)) return *error;
  if (auto error = create_file(pub_path, pub_text, 0644)) {
    ::unlink(key_path.c_str());
    return *error;
  }
  return std::monostate{};
}

std::variant<KeyPair, KeyError> read_key_pair(const std::string& path) {
  auto lines = read_key_lines(path);
  if (auto* error = std::get_if<KeyError>(&lines)) return *error;
  const auto& found = std::get<std::vector<KeyLine>>(lines);
  if (found.size() != 2) {
    return KeyError{path + ": a key pair file has two lines, \"" + kPublicLabel + " KEY\" and \"" + kSecretLabel +
                    " KEY\" (this one has " + std::to_string(found.size()) + "); make one with `mqlm keygen NAME`"};
  }
  auto public_key = labelled_key(path, found[0], kPublicLabel);
  if (auto* error = std::get_if<KeyError>(&public_key)) return *error;
  auto secret_key = labelled_key(path, found[1], kSecretLabel);
  if (auto* error = std::get_if<KeyError>(&secret_key)) return *error;
  if (auto exposed = exposed_secret(path)) return *exposed;
  KeyPair pair{std::get<std::string>(std::move(public_key)), std::get<std::string>(std::move(secret_key))};
  std::array<char, kZ85KeyChars + 1> derived{};
  if (zmq_curve_public(derived.data(), pair.secret_key.c_str()) != 0 || pair.public_key != derived.data()) {
    return KeyError{path + ": the public key is not the secret key's: the file was changed; make a new pair"};
  }
  return pair;
}

std::variant<std::string, KeyError> read_public_key(const std::string& path) {
  std::set<std::string> keys;
  if (auto error = add_public_keys(path, keys)) return *error;
  if (keys.size() != 1) {
    return KeyError{path + ": a public key file holds one key (NAME.pub from `mqlm keygen NAME`), this one " +
                    std::to_string(keys.size())};
  }
  return *keys.begin();
}

std::variant<std::set<std::string>, KeyError> read_allowed_clients(const std::string& path) {
  std::error_code error;
  std::vector<std::string> files;
  if (std::filesystem::is_directory(path, error)) {
    for (std::filesystem::directory_iterator it(path, error), end; !error && it != end; it.increment(error)) {
      if (it->path().extension() == ".pub") files.push_back(it->path().string());
    }
    if (error) return KeyError{path + ": " + error.message()};
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::set<std::string> keys;
  for (const std::string& file : files) {
    if (auto problem = add_public_keys(file, keys)) return *problem;
  }
  if (keys.empty()) {
    return KeyError{path +
                    " names no client key, so no client could connect: add their NAME.pub files (one key "
                    "per line, or *.pub files in a directory)"};
  }
  return keys;
}

std::string key_bytes(const std::string& z85) {
  std::string bytes(kKeyBytes, '\0');
  if (z85.size() != kZ85KeyChars ||
      zmq_z85_decode(reinterpret_cast<std::uint8_t*>(bytes.data()), z85.c_str()) == nullptr) {
    throw std::invalid_argument("key_bytes: not a Z85 key");
  }
  return bytes;
}

std::string z85_key(const std::string& bytes) {
  if (bytes.size() != kKeyBytes) throw std::invalid_argument("z85_key: a key is 32 bytes");
  std::array<char, kZ85KeyChars + 1> text{};
  zmq_z85_encode(text.data(), reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  return text.data();
}

std::variant<ClientKeys, KeyError> read_client_keys(const std::string& server_public_file,
                                                    const std::string& client_key_file) {
  auto server = read_public_key(server_public_file);
  if (auto* error = std::get_if<KeyError>(&server)) return *error;
  auto client = read_key_pair(client_key_file);
  if (auto* error = std::get_if<KeyError>(&client)) return *error;
  return ClientKeys{std::get<std::string>(std::move(server)), std::get<KeyPair>(std::move(client))};
}

void set_server_options(zmq::socket_t& socket, const KeyPair& keys, const char* domain) {
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, key_bytes(keys.secret_key));
  socket.set(zmq::sockopt::zap_domain, domain);
  // No handler to ask is a refusal, not a pass: the server is never open by accident. The option
  // is a draft in zmq.h 4.3 (ZMQ_ZAP_ENFORCE_DOMAIN) that libzmq 4.3 takes all the same; a libzmq
  // without it lets clients in when no handler is bound, and the gateway and the Node bind one first
  // anyway.
  constexpr int kZapEnforceDomain = 93;
  const int on = 1;
  (void)zmq_setsockopt(socket.handle(), kZapEnforceDomain, &on, sizeof on);
}

void set_client_options(zmq::socket_t& socket, const ClientKeys& keys) {
  socket.set(zmq::sockopt::curve_serverkey, key_bytes(keys.server_public_key));
  socket.set(zmq::sockopt::curve_publickey, key_bytes(keys.client.public_key));
  socket.set(zmq::sockopt::curve_secretkey, key_bytes(keys.client.secret_key));
}

}  // namespace mqlm::actors::curve
