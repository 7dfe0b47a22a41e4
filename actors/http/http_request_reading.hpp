// How the transport reads a request's header into a Request, shared by its sockets
// (http_transport.cpp) and parse_request (http_request_reading.cpp). It lives apart from the
// transport's coroutines so that the fuzzer's clang++ 14 build, which cannot emit those
// coroutines under its sanitizers ("Cannot represent a difference across sections"), can
// instrument the parsing whole.
#pragma once

#include <optional>
#include <string_view>

#include <boost/beast/http/message.hpp>

#include "actors/http/http_transport.hpp"

namespace mqlm::actors::http {

bool same_ignoring_case(std::string_view a, std::string_view b);

// The request line and headers as a Request (the body comes later): the path and the query's
// names and values percent-decoded.
void fill_request(const boost::beast::http::request_header<>& header, Request& req);

// The status for a body the transport does not read, before any of it is: 415 for one that is
// compressed (Content-Encoding: bodies are never decompressed) and 400 for a Transfer-Encoding
// other than chunked alone, whose length Beast would take from Content-Length or as none while
// a proxy in front might read it otherwise (request smuggling).
std::optional<int> refused_coding(const Request& req);

}  // namespace mqlm::actors::http
