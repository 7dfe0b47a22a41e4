#include "actors/runtime/topology.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>

namespace mqlm::actors {

std::string default_endpoint(const std::string& name) { return "inproc://mqlm/" + name; }

void Topology::add(const std::string& name, std::optional<std::string> endpoint) {
  if (endpoint) {
    endpoints[name] = *endpoint;
  } else {
    endpoints.try_emplace(name, default_endpoint(name));
  }
}

std::optional<std::string> Topology::endpoint_of(const std::string& name) const {
  auto it = endpoints.find(name);
  if (it == endpoints.end()) return std::nullopt;
  return it->second;
}

bool parse_transport(const std::string& text, Transport& out) {
  if (text == "inproc") out = Transport::inproc;
  else if (text == "ipc") out = Transport::ipc;
  else if (text == "tcp") out = Transport::tcp;
  else return false;
  return true;
}

namespace {
int free_tcp_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("cannot open a socket to find a free port");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot find a free TCP port on 127.0.0.1");
  }
  ::close(fd);
  return ntohs(address.sin_port);
}
}  // namespace

std::string make_endpoint(Transport transport, const std::string& name) {
  switch (transport) {
    case Transport::inproc: return default_endpoint(name);
    case Transport::ipc:
      return "ipc://" + (std::filesystem::temp_directory_path() /
                         ("mqlm-" + std::to_string(::getpid()) + "-" + name)).string();
    case Transport::tcp: return "tcp://127.0.0.1:" + std::to_string(free_tcp_port());
  }
  return default_endpoint(name);
}

bool parse_address(const std::string& text, std::string& name, std::string& endpoint, std::string& key_file) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) return false;
  name = text.substr(0, eq);
  endpoint = text.substr(eq + 1);
  key_file.clear();
  if (endpoint.starts_with("tcp://")) {
    // A host and port never hold '@'; the file's path may.
    if (auto at = endpoint.find('@'); at != std::string::npos) {
      key_file = endpoint.substr(at + 1);
      endpoint.resize(at);
      if (key_file.empty()) return false;
    }
  }
  return endpoint.find("://") != std::string::npos;
}

}  // namespace mqlm::actors
