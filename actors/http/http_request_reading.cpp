#include "actors/http/http_request_reading.hpp"

#include <algorithm>

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

namespace mqlm::actors::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

std::string_view view(beast::string_view text) { return {text.data(), text.size()}; }

std::string value_of(const Fields& fields, std::string_view name) {
  for (const auto& [key, value] : fields) {
    if (same_ignoring_case(key, name)) return value;
  }
  return {};
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX decoded (a malformed escape is kept as it is); in a query, '+' is a space.
std::string percent_decoded(std::string_view text, bool query) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '%' && i + 2 < text.size()) {
      const int high = hex_digit(text[i + 1]);
      const int low = hex_digit(text[i + 2]);
      if (high >= 0 && low >= 0) {
        out += static_cast<char>(high * 16 + low);
        i += 2;
        continue;
      }
    }
    out += (query && c == '+') ? ' ' : c;
  }
  return out;
}

Fields query_params(std::string_view query) {
  Fields params;
  while (!query.empty()) {
    const std::size_t end = std::min(query.find('&'), query.size());
    const std::string_view pair = query.substr(0, end);
    const std::size_t equals = pair.find('=');
    if (!pair.empty()) {
      params.emplace_back(percent_decoded(pair.substr(0, equals), true),
                          equals == std::string_view::npos ? "" : percent_decoded(pair.substr(equals + 1), true));
    }
    query.remove_prefix(std::min(end + 1, query.size()));
  }
  return params;
}

}  // namespace

bool same_ignoring_case(std::string_view a, std::string_view b) {
  return beast::iequals(beast::string_view(a.data(), a.size()), beast::string_view(b.data(), b.size()));
}

void fill_request(const bhttp::request_header<>& header, Request& req) {
  req.method = std::string(view(header.method_string()));
  const std::string_view target = view(header.target());
  const std::size_t question = target.find('?');
  req.path = percent_decoded(target.substr(0, question), false);
  if (question != std::string_view::npos) req.params = query_params(target.substr(question + 1));
  for (const auto& field : header) req.headers.emplace_back(view(field.name_string()), view(field.value()));
}

std::optional<int> refused_coding(const Request& req) {
  const std::string encoding = req.get_header_value("Content-Encoding");
  if (!encoding.empty() && !same_ignoring_case(encoding, "identity")) return 415;
  for (const auto& [name, value] : req.headers) {
    if (same_ignoring_case(name, "Transfer-Encoding") && !same_ignoring_case(value, "chunked")) return 400;
  }
  return std::nullopt;
}

std::string Request::get_header_value(std::string_view name) const { return value_of(headers, name); }
std::string Request::get_param_value(std::string_view name) const {
  for (const auto& [key, value] : params) {
    if (key == name) return value;
  }
  return {};
}

std::variant<Request, int> parse_request(std::string_view raw, const TransportConfig& config) {
  bhttp::request_parser<bhttp::string_body> parser;
  parser.eager(true);
  parser.header_limit(static_cast<std::uint32_t>(config.max_header_bytes));
  parser.body_limit(config.max_body_bytes);
  boost::system::error_code ec;
  std::size_t used = 0;
  while (!ec && !parser.is_done() && used < raw.size()) {
    used += parser.put(boost::asio::buffer(raw.data() + used, raw.size() - used), ec);
    if (ec == bhttp::error::need_more) break;
  }
  // Beast's put_eof takes a parser that has had something: with nothing it would end an empty
  // message, a request without a method.
  if (!ec && !parser.is_done() && parser.got_some()) parser.put_eof(ec);
  if (ec == bhttp::error::header_limit) return 431;
  if (ec == bhttp::error::body_limit) return 413;
  if (ec || !parser.is_done()) return 400;
  Request req;
  fill_request(parser.get(), req);
  if (auto status = refused_coding(req)) return *status;
  req.body = std::move(parser.get().body());
  return req;
}

}  // namespace mqlm::actors::http
