// Writes the HTTP request fuzzer's seed corpus: requests as clients send them (a GET with a
// query, POSTs with a Content-Length and chunked, pipelined pairs) and the ones the transport
// refuses (a gzip body, conflicting lengths, a header or body past the fuzzer's limits).
#include <string>
#include <utility>
#include <vector>

#include "tests/fuzz/fuzz_support.hpp"

namespace {

std::string post(std::string_view path, std::string_view body, std::string_view extra = "") {
  return "POST " + std::string(path) + " HTTP/1.1\r\nHost: localhost:8080\r\nAuthorization: Bearer k\r\n" +
         std::string(extra) + "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + std::string(body);
}

}  // namespace

int main(int argc, char** argv) {
  const auto dir = mqlm::fuzz::seed_dir(argc, argv);
  if (dir.empty()) return 2;
  const std::string chat = R"({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]})";
  const std::string get = "GET /ready?model=tiny%2Dq8&x=a+b HTTP/1.1\r\nHost: localhost\r\n\r\n";
  const std::string chunked =
      "POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\n{\"mod\r\n1a;ext=1\r\nel\": \"tiny\", \"prompt\": \"x\"}\r\n0\r\nTrailer: t\r\n\r\n";
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"get", get},
      {"get-http10", "GET /health HTTP/1.0\r\n\r\n"},
      {"post-chat", post("/v1/chat/completions", chat)},
      {"post-chunked", chunked},
      {"pipelined-gets", get + "GET /v1/models HTTP/1.1\r\nHost: h\r\n\r\n"},
      {"pipelined-posts", post("/tokenize", R"({"content": "a"})") + post("/detokenize", R"({"tokens": [1]})")},
      {"options", "OPTIONS /v1/chat/completions HTTP/1.1\r\nOrigin: http://a\r\n"
                  "Access-Control-Request-Method: POST\r\n\r\n"},
      {"gzip", post("/v1/completions", "\x1f\x8b\x08", "Content-Encoding: gzip\r\n")},
      {"two-lengths", post("/v1/completions", "{}", "Content-Length: 3\r\n")},
      {"cut-header", "POST /v1/completions HTTP/1.1\r\nContent-Len"},
      {"big-header", "GET / HTTP/1.1\r\nX-Big: " + std::string(3000, 'a') + "\r\n\r\n"},
      {"big-body", post("/v1/completions", std::string(5000, ' '))},
  };
  for (const auto& [name, bytes] : seeds) {
    if (!mqlm::fuzz::write_seed(dir, name, bytes)) return 1;
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  return 0;
}
