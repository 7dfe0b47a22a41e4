// libFuzzer target: the gateway's client protocol (docs/protocol.md) on arbitrary frames, each
// input one frame as a client sends it.
//
// Beyond "no crash, leak, UB, hang or allocation past libFuzzer's limit" it checks the parser's
// contract: no exception; an api_key within its limit; a problem is malformed or invalid_request
// with a message; a request keeps every documented limit (one non-empty prompt of a known kind,
// validated sampling, bounded model, ids and turns) and its Submit survives the wire; and the
// events answering it encode to one msgpack map whose "id" is the client's id as given.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "actors/gateway/client_protocol.hpp"
#include "model/sampling/sampling_params.hpp"
#include "tests/fuzz/fuzz_support.hpp"
#include "tests/fuzz/msgpack_round_trip.hpp"

namespace {

using namespace mqlm::actors::client_protocol;
using mqlm::messages::RequestError;

[[noreturn]] void contract_broken(std::string_view what) { mqlm::fuzz::contract_broken("client protocol", what); }

// An event as a client reads it: one map, its "event" a string and its "id" the one given.
void check_event(const std::string& frame, const std::optional<ClientId>& id) {
  msgpack::object_handle handle = msgpack::unpack(frame.data(), frame.size());
  const msgpack::object& root = handle.get();
  if (root.type != msgpack::type::MAP) contract_broken("an event that is not a map");
  bool has_event = false, has_id = false;
  for (const msgpack::object_kv& kv : std::span(root.via.map.ptr, root.via.map.size)) {
    const std::string key = kv.key.as<std::string>();
    if (key == "event") has_event = kv.val.type == msgpack::type::STR;
    if (key != "id") continue;
    has_id = true;
    if (!id) contract_broken("an id in the event of a request without one");
    const bool same = std::holds_alternative<std::string>(*id)
                          ? kv.val.type == msgpack::type::STR && kv.val.as<std::string>() == std::get<std::string>(*id)
                          : kv.val.as<std::int64_t>() == std::get<std::int64_t>(*id);
    if (!same) contract_broken("the event's id is not the client's");
  }
  if (!has_event) contract_broken("an event without its kind");
  if (id && !has_id) contract_broken("an event without the request's id");
}

void check_problem(const RequestProblem& problem) {
  if (problem.code != RequestError::malformed && problem.code != RequestError::invalid_request) {
    contract_broken("a problem that is neither malformed nor invalid_request");
  }
  if (problem.message.empty()) contract_broken("a problem without a message");
  check_event(encode_error_event(problem.code, problem.message, problem.id), problem.id);
}

void check_prompt(const mqlm::messages::Submit& submit) {
  using mqlm::messages::PromptKind;
  switch (static_cast<PromptKind>(submit.prompt_kind)) {
    case PromptKind::text:
      if (submit.text.empty() || !submit.tokens.empty() || !submit.chat.empty()) contract_broken("text prompt");
      break;
    case PromptKind::tokens:
      if (submit.tokens.empty() || submit.tokens.size() > kMaxPromptTokens) contract_broken("token prompt size");
      for (std::int32_t token : submit.tokens) {
        if (token < 0) contract_broken("a negative token id accepted");
      }
      break;
    case PromptKind::chat:
      if (submit.chat.empty() || submit.chat.size() > kMaxChatTurns) contract_broken("chat prompt size");
      for (const auto& turn : submit.chat) {
        if (turn.role.empty() || turn.role.size() > kMaxRoleBytes) contract_broken("a chat role out of bounds");
      }
      break;
    default: contract_broken("an unknown prompt kind");
  }
}

void check_generate(const GenerateRequest& request) {
  const auto& submit = request.submit;
  if (submit.model.size() > kMaxModelNameBytes) contract_broken("a model name past the limit");
  check_prompt(submit);
  if (auto error = mqlm::model::validate(submit.sampling)) contract_broken("sampling that does not validate");
  if (!mqlm::fuzz::survives_msgpack(submit)) contract_broken("the Submit changed on the wire");
  mqlm::messages::TokenEvent tokens{{7, 8}, "hi", {}};
  check_event(encode_token_event(request.id, tokens, submit.sampling.logprobs), request.id);
  mqlm::messages::FinalEvent final_event;
  mqlm::actors::front_end::GatheredOutput gathered{{7, 8}, "hi", {}, "", {}};
  check_event(encode_final_event(request.id, final_event, gathered, false), request.id);
}

void check_admin(const AdminRequest& request) {
  if (request.model.size() > kMaxModelNameBytes) contract_broken("an admin model name past the limit");
  if ((request.op == AdminOp::load || request.op == AdminOp::unload) && request.model.empty()) {
    contract_broken("load or unload without a model");
  }
  if (request.if_idle && request.op != AdminOp::unload) contract_broken("if_idle on other than unload");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ClientRequest request;
  std::string api_key;
  try {
    request = parse_request(std::span(reinterpret_cast<const std::byte*>(data), size), &api_key);
  } catch (const std::exception& e) {
    contract_broken(std::string("parse_request threw: ") + e.what());
  } catch (...) {
    contract_broken("parse_request threw");
  }
  if (api_key.size() > kMaxApiKeyBytes) contract_broken("an api_key past the limit");
  if (const auto* problem = std::get_if<RequestProblem>(&request)) check_problem(*problem);
  if (const auto* generate = std::get_if<GenerateRequest>(&request)) check_generate(*generate);
  if (const auto* admin = std::get_if<AdminRequest>(&request)) check_admin(*admin);
  if (const auto* status = std::get_if<StatusRequest>(&request)) {
    check_event(encode_json_event("status", status->id, nlohmann::json::object()), status->id);
  }
  if (const auto* abort = std::get_if<AbortRequest>(&request)) {
    check_event(encode_json_event("aborted", abort->id, nlohmann::json::object()), abort->id);
  }
  return 0;
}
