// Where every actor's inbox is, and the runtime's bounds. Configuration only: the same actor
// code runs over inproc:// (one process, the default), ipc:// or tcp:// (split processes).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/runtime/curve_keys.hpp"

namespace mqlm::actors {

struct Topology {
  // actor name -> inbox endpoint. Only listed actors are addressable: a message naming anyone
  // else is answered unknown_actor, so a hostile sender name cannot make us open sockets.
  std::map<std::string, std::string> endpoints;
  // Where every actor mirrors what it receives and sends; empty: no trace.
  std::string trace_endpoint;
  bool trace_blobs = true;  // false: blob frames are recorded as sizes only
  // CURVE on tcp:// links (actors/runtime/links.hpp): this process's key pair and, for each
  // participant whose inbox is on tcp://, the public key (Z85) of the process that binds it.
  // Without a key pair, tcp:// links are plain ZMTP.
  std::optional<curve::KeyPair> link_keys;
  std::map<std::string, std::string> inbox_keys;

  int mailbox_capacity = 1000;     // receiver's high-water mark (messages)
  int send_capacity = 100;         // each sender's high-water mark towards one peer
  std::size_t outbox_capacity = 10000;  // deferred messages kept per peer before dropping

  // Adds name at the default in-process address unless it already has one.
  void add(const std::string& name, std::optional<std::string> endpoint = std::nullopt);
  std::optional<std::string> endpoint_of(const std::string& name) const;
  bool knows(const std::string& name) const { return endpoints.contains(name); }
};

// inproc://mqlm/<name>
std::string default_endpoint(const std::string& name);

enum class Transport { inproc, ipc, tcp };
bool parse_transport(const std::string& text, Transport& out);
// A fresh address for name: inproc://mqlm/<name>, ipc://<tmp>/mqlm-<pid>-<name>, or tcp on
// 127.0.0.1 at a port free at the time of the call.
std::string make_endpoint(Transport transport, const std::string& name);

// Parses "name=endpoint" (as given on the command line), or "name=tcp://host:port@FILE": FILE is
// the public key file of the process that binds that inbox (key_file is "" without one). Only a
// tcp:// endpoint takes a key: an ipc:// path may hold '@' itself.
bool parse_address(const std::string& text, std::string& name, std::string& endpoint, std::string& key_file);

}  // namespace mqlm::actors
