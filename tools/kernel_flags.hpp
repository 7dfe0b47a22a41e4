// Kernel shapes named on the command line (`mqlm bench kernels`, `mqlm generate`), parsed once
// so that every command reads them the same way.
#pragma once

#include <sstream>
#include <string>

#include "gpu/ops.hpp"
#include "tools/commands.hpp"

namespace mqlm::tools {

// --matvec-shape THREADSxROWS (e.g. 128x4): the whole-block vector kernel's workgroup.
inline gpu::ops::MatvecShape parse_matvec_shape(const std::string& text) {
  gpu::ops::MatvecShape shape;
  char x = 0;
  std::istringstream in(text);
  if (!(in >> shape.threads >> x >> shape.rows) || x != 'x' || shape.threads == 0 || shape.rows == 0 ||
      in.peek() != std::char_traits<char>::eof()) {
    throw CommandFailed("--matvec-shape wants THREADSxROWS, e.g. 128x4, not '" + text + "'");
  }
  return shape;
}

}  // namespace mqlm::tools
