// libFuzzer target: messages::decode() on arbitrary frames (layout in fuzz_frames.hpp).
//
// Beyond "no crash, leak, UB or hang" (the sanitizers and libFuzzer's limits see to those) it
// checks decode()'s contract: an error is one decode() can return, with a detail for the user;
// a decoded message has a known kind that matches its payload and survives re-encoding.
#include <cstdio>
#include <cstdlib>

#include "messages/codec.hpp"
#include "tests/fuzz/fuzz_frames.hpp"

namespace {

using namespace mqlm::messages;

[[noreturn]] void contract_broken(const char* what) {
  std::fprintf(stderr, "decode() contract broken: %s\n", what);
  std::abort();
}

bool same_envelope(const Envelope& a, const Envelope& b) {
  return a.kind == b.kind && a.version == b.version && a.from == b.from && a.to == b.to &&
         a.correlation_id == b.correlation_id && a.request_id == b.request_id && a.sent_ns == b.sent_ns;
}

void check_error(const DecodeError& error) {
  if (!is_decode_error_code(error.code)) contract_broken("an error code decode() never returns");
  if (error.detail.empty()) contract_broken("an error without detail");
}

void check_message(const Message& message) {
  if (!is_known_kind(static_cast<std::uint8_t>(message.kind()))) contract_broken("unknown kind decoded");
  if (kind_of(message.payload) != message.kind()) contract_broken("payload does not match the kind");
  DecodeResult again = decode(encode(message.envelope, message.payload));
  const auto* copy = std::get_if<Message>(&again);
  if (copy == nullptr) contract_broken("a decoded message does not decode after re-encoding");
  if (!same_envelope(copy->envelope, message.envelope)) contract_broken("envelope changed on re-encoding");
  if (pack_payload(copy->payload) != pack_payload(message.payload)) contract_broken("payload changed");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  DecodeResult result = decode(fuzz::split_frames(data, size));
  if (const auto* message = std::get_if<Message>(&result)) {
    check_message(*message);
  } else {
    check_error(std::get<DecodeError>(result));
  }
  return 0;
}
