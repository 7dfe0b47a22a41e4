// CURVE keys (ZeroMQ's CurveZMQ): the files `mqlm keygen NAME` writes and the gateway and the
// clients read, and the socket options that use them. Keys are Z85 text, 40 characters for 32
// bytes.
//
//   NAME.key  the key pair, mode 0600: comment lines (#), then "public-key Z85" and "secret-key Z85"
//   NAME.pub  the public key: comment lines, then the key alone on a line
//
// A file of allowed client keys is any number of NAME.pub files put together: one key per line,
// blank lines and # comments ignored (no Z85 key starts with '#'). A directory stands for every *.pub file in it.
//
// Every function here takes bad input from outside (a damaged or hand-edited file): it answers
// with a message that names the file and says what to do, never with an exception. A secret key
// file that others than its owner may read (any group or other permission bit) is refused, as
// ssh refuses such a private key: the key is no longer secret, so make a new one (or chmod 600).
#pragma once

#include <set>
#include <string>
#include <variant>
#include <zmq.hpp>

namespace mqlm::actors::curve {

inline constexpr std::size_t kKeyBytes = 32;
inline constexpr std::size_t kZ85KeyChars = 40;
// The ZAP domains of CURVE server sockets (set_server_options): the gateway's client port, and the
// inboxes of actors linked over tcp:// (actors/runtime/links.hpp).
inline constexpr const char* kZapDomain = "mqlm-clients";
inline constexpr const char* kLinkZapDomain = "mqlm-links";

// Z85 text of each key (kZ85KeyChars characters).
struct KeyPair {
  std::string public_key;
  std::string secret_key;
};

// A problem with a key file, said for its user.
struct KeyError {
  std::string message;
};

// Whether this libzmq was built with CURVE (libsodium).
bool available();

// A fresh key pair from libsodium's random source.
KeyPair generate();

// Writes NAME.key (mode 0600) and NAME.pub for `pair` beside `base` (a path without the
// suffix). Refuses, writing nothing, when either file exists already.
std::variant<std::monostate, KeyError> write_key_files(const std::string& base, const KeyPair& pair);

// A NAME.key file: its two keys, checked to belong together.
std::variant<KeyPair, KeyError> read_key_pair(const std::string& path);
// A NAME.pub file: exactly one public key.
std::variant<std::string, KeyError> read_public_key(const std::string& path);
// A file of public keys (one per line) or a directory of *.pub files; at least one key.
std::variant<std::set<std::string>, KeyError> read_allowed_clients(const std::string& path);

// The 32 bytes a Z85 key stands for; the key must be valid (as every key read above is).
std::string key_bytes(const std::string& z85);
// Z85 text of 32 key bytes.
std::string z85_key(const std::string& bytes);

// What a client needs to connect to a CURVE server: the server's public key and a pair of its own.
struct ClientKeys {
  std::string server_public_key;
  KeyPair client;
};

// A client's keys: the server's NAME.pub and the client's own NAME.key.
std::variant<ClientKeys, KeyError> read_client_keys(const std::string& server_public_file,
                                                    const std::string& client_key_file);

// Makes `socket` a CURVE server with `keys`, its handshakes checked by the ZAP handler of its
// context (actors/runtime/zap_handler.hpp), in `domain`, and refused when there is none.
// Call before it binds.
void set_server_options(zmq::socket_t& socket, const KeyPair& keys, const char* domain = kZapDomain);
// Makes `socket` a CURVE client. Call before it connects.
void set_client_options(zmq::socket_t& socket, const ClientKeys& keys);

}  // namespace mqlm::actors::curve
