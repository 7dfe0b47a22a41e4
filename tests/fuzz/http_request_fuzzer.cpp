// libFuzzer target: the HTTP transport's reading of one request (http::parse_request, the same
// Beast parser, limits and decoding as its sockets use) on arbitrary bytes, under small limits
// so that inputs reach them.
//
// Beyond "no crash, leak, UB, hang or allocation past libFuzzer's limit" it checks the reader's
// contract: no exception; a refusal is one of the statuses the transport answers (400, 413, 415,
// 431); a request has a method and a path, a body within the limit and of the length its one
// Content-Length says (no second reading of where a request ends, which request smuggling
// needs), no encoded body and no transfer coding but chunked, and headers no longer than the
// header limit allows.
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "actors/http/http_transport.hpp"
#include "tests/fuzz/fuzz_support.hpp"

namespace {

using namespace mqlm::actors::http;

[[noreturn]] void contract_broken(std::string_view what) { mqlm::fuzz::contract_broken("HTTP request", what); }

TransportConfig small_limits() {
  TransportConfig config;
  config.max_body_bytes = 4096;
  config.max_header_bytes = 2048;
  return config;
}

bool same_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if ((a[i] | 0x20) != (b[i] | 0x20)) return false;
  }
  return true;
}

// A Content-Length's numbers (RFC 9110 lets a list of one number repeated stand for it), each the
// one seen before.
void read_lengths(std::string_view value, std::optional<std::uint64_t>& length) {
  while (true) {
    while (value.starts_with(' ') || value.starts_with('\t')) value.remove_prefix(1);
    std::uint64_t n = 0;
    const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (error != std::errc()) contract_broken("a Content-Length not a number");
    if (length && *length != n) contract_broken("two different Content-Lengths accepted");
    length = n;
    value.remove_prefix(static_cast<std::size_t>(end - value.data()));
    while (value.starts_with(' ') || value.starts_with('\t')) value.remove_prefix(1);
    if (value.empty()) return;
    if (!value.starts_with(',')) contract_broken("a Content-Length not a list of numbers");
    value.remove_prefix(1);
  }
}

void check_length(const Request& req) {
  bool chunked = false;
  std::optional<std::uint64_t> length;
  for (const auto& [name, value] : req.headers) {
    if (same_ignoring_case(name, "Transfer-Encoding")) {
      if (!same_ignoring_case(value, "chunked")) contract_broken("a transfer coding other than chunked accepted");
      chunked = true;
    }
    if (same_ignoring_case(name, "Content-Length")) read_lengths(value, length);
  }
  if (chunked && length) contract_broken("both Transfer-Encoding and Content-Length accepted");
  if (length && *length != req.body.size()) contract_broken("a body not of its Content-Length");
}

void check_request(const Request& req, const TransportConfig& config) {
  if (req.method.empty()) contract_broken("a request without a method");
  if (req.body.size() > config.max_body_bytes) contract_broken("a body past the limit");
  std::size_t header_bytes = req.method.size() + req.path.size();
  for (const auto& [name, value] : req.headers) header_bytes += name.size() + value.size();
  // Boost 1.74's Beast applies header_limit to the request line and to the fields each, not to
  // both together: what it bounds is twice the limit.
  if (header_bytes > 2 * config.max_header_bytes) contract_broken("headers past the limit");
  const std::string encoding = req.get_header_value("Content-Encoding");
  if (!encoding.empty() && !same_ignoring_case(encoding, "identity")) contract_broken("an encoded body accepted");
  check_length(req);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const TransportConfig config = small_limits();
  std::variant<Request, int> result;
  try {
    result = parse_request(std::string_view(reinterpret_cast<const char*>(data), size), config);
  } catch (const std::exception& e) {
    contract_broken(std::string("an exception: ") + e.what());
  }
  if (const int* status = std::get_if<int>(&result)) {
    if (*status != 400 && *status != 413 && *status != 415 && *status != 431) contract_broken("an unknown status");
    return 0;
  }
  check_request(std::get<Request>(result), config);
  return 0;
}
