// `mqlm keygen NAME`: a CURVE key pair for the ZeroMQ client port or for a process's links to the
// others of a split deployment (docs/protocol.md, "Security: CURVE over tcp://"): NAME.key (both
// keys, mode 0600: keep it where it is used) and NAME.pub (the public key: give it to the other
// side). Never overwrites a file.
#include <iostream>

#include "actors/runtime/curve_keys.hpp"
#include "tools/commands.hpp"

namespace mqlm::tools {

namespace curve = actors::curve;

void add_keygen_command(CLI::App& app) {
  auto name = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("keygen",
                                 "make a CURVE key pair for the ZeroMQ client port or a process's tcp:// links: "
                                 "NAME.key (secret, mode 0600) and NAME.pub (public)");
  cmd->add_option("NAME", *name, "the files' path without .key and .pub (server, clients/alice, ...)")->required();
  cmd->callback([name] {
    if (!curve::available()) {
      throw CommandFailed("this libzmq was built without CURVE (libsodium): no keys can be made or used", 1);
    }
    if (name->empty() || name->back() == '/') throw CommandFailed("NAME names the files, not a folder: " + *name, 2);
    const auto written = curve::write_key_files(*name, curve::generate());
    if (const auto* error = std::get_if<curve::KeyError>(&written)) throw CommandFailed(error->message, 1);
    std::cout << "wrote " << *name << ".key (secret: keep it private) and " << *name << ".pub (public)\n";
  });
}

}  // namespace mqlm::tools
