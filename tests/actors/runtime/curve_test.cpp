// CURVE keys on disk (actors/runtime/curve_keys) and the ZAP handler (actors/runtime/zap_handler)
// guarding a real CURVE ROUTER over tcp:// on 127.0.0.1, with real clients.
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <zmq_addon.hpp>

#include "actors/runtime/curve_keys.hpp"
#include "actors/runtime/topology.hpp"
#include "actors/runtime/zap_handler.hpp"

namespace mqlm::actors {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A fresh folder for one test's files, removed after.
class KeyFolder {
 public:
  KeyFolder() : path_(fs::temp_directory_path() / ("mqlm-curve-" + std::to_string(::getpid()) + "-" + test_name())) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~KeyFolder() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  static std::string test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }
  fs::path path_;
};

// Written as a careful user writes a key file: readable by its owner only.
void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
}

template <typename T>
T value_of(std::variant<T, curve::KeyError> result) {
  if (auto* error = std::get_if<curve::KeyError>(&result)) {
    ADD_FAILURE() << error->message;
    return T{};
  }
  return std::get<T>(std::move(result));
}

template <typename T>
std::string error_of(const std::variant<T, curve::KeyError>& result) {
  const auto* error = std::get_if<curve::KeyError>(&result);
  return error != nullptr ? error->message : "(no error)";
}

TEST(CurveKeys, KeyFilesRoundTrip) {
  ASSERT_TRUE(curve::available());
  KeyFolder folder;
  const curve::KeyPair pair = curve::generate();
  EXPECT_EQ(pair.public_key.size(), curve::kZ85KeyChars);
  EXPECT_NE(pair.public_key, pair.secret_key);
  ASSERT_TRUE(std::holds_alternative<std::monostate>(curve::write_key_files(folder / "server", pair)));

  const curve::KeyPair read = value_of(curve::read_key_pair(folder / "server.key"));
  EXPECT_EQ(read.public_key, pair.public_key);
  EXPECT_EQ(read.secret_key, pair.secret_key);
  EXPECT_EQ(value_of(curve::read_public_key(folder / "server.pub")), pair.public_key);
  EXPECT_EQ(fs::status(folder / "server.key").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(curve::z85_key(curve::key_bytes(pair.public_key)), pair.public_key);
  EXPECT_EQ(curve::key_bytes(pair.public_key).size(), curve::kKeyBytes);
  // Key files take '#' for a comment because no key starts with it: the largest starts with '%'.
  EXPECT_EQ(curve::z85_key(std::string(curve::kKeyBytes, '\xff'))[0], '%');

  // Allowed clients: a .pub file, files put together with comments, a directory of .pub files.
  const curve::KeyPair other = curve::generate();
  ASSERT_TRUE(std::holds_alternative<std::monostate>(curve::write_key_files(folder / "other", other)));
  EXPECT_EQ(value_of(curve::read_allowed_clients(folder / "server.pub")), std::set<std::string>{pair.public_key});
  write_text(folder / "clients", "# the team\n\n  " + pair.public_key + "  \n# bob\n" + other.public_key + "\n");
  const std::set<std::string> both{pair.public_key, other.public_key};
  EXPECT_EQ(value_of(curve::read_allowed_clients(folder / "clients")), both);
  fs::create_directories(folder / "dir");
  fs::copy_file(folder / "server.pub", folder / "dir/a.pub");
  fs::copy_file(folder / "other.pub", folder / "dir/b.pub");
  fs::copy_file(folder / "server.key", folder / "dir/a.key");  // not a .pub: not read
  EXPECT_EQ(value_of(curve::read_allowed_clients(folder / "dir")), both);
}

TEST(CurveKeys, KeygenNeverOverwrites) {
  KeyFolder folder;
  write_text(folder / "taken.pub", "keep me\n");
  const auto refused = curve::write_key_files(folder / "taken", curve::generate());
  EXPECT_NE(error_of(refused).find("taken.pub exists already"), std::string::npos) << error_of(refused);
  EXPECT_FALSE(fs::exists(folder / "taken.key"));  // nothing written
  std::ifstream kept(folder / "taken.pub");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "keep me\n");

  ASSERT_TRUE(std::holds_alternative<std::monostate>(curve::write_key_files(folder / "once", curve::generate())));
  EXPECT_NE(error_of(curve::write_key_files(folder / "once", curve::generate())).find("once.key exists already"),
            std::string::npos);
}

TEST(CurveKeys, BadFilesAreRefusedWithWhatIsWrong) {
  KeyFolder folder;
  const curve::KeyPair pair = curve::generate();
  ASSERT_TRUE(std::holds_alternative<std::monostate>(curve::write_key_files(folder / "k", pair)));
  auto refusal = [&](const std::variant<curve::KeyPair, curve::KeyError>& result, const std::string& says) {
    EXPECT_NE(error_of(result).find(says), std::string::npos) << "wanted '" << says << "' in: " << error_of(result);
  };

  refusal(curve::read_key_pair(folder / "missing.key"), "missing.key: No such file");
  write_text(folder / "short.key",
             "public-key " + pair.public_key + "\nsecret-key " + pair.secret_key.substr(1) + "\n");
  refusal(curve::read_key_pair(folder / "short.key"),
          "short.key:2: a key is 40 characters of Z85 text, this one has 39");
  std::string not_z85 = pair.secret_key;
  not_z85[7] = '~';  // outside Z85's alphabet
  write_text(folder / "bad.key", "public-key " + pair.public_key + "\nsecret-key " + not_z85 + "\n");
  refusal(curve::read_key_pair(folder / "bad.key"), "bad.key:2: not Z85 text");
  write_text(folder / "swapped.key", "secret-key " + pair.secret_key + "\npublic-key " + pair.public_key + "\n");
  refusal(curve::read_key_pair(folder / "swapped.key"), "wanted \"public-key KEY\"");
  write_text(folder / "mixed.key",
             "public-key " + curve::generate().public_key + "\nsecret-key " + pair.secret_key + "\n");
  refusal(curve::read_key_pair(folder / "mixed.key"), "is not the secret key's");
  refusal(curve::read_key_pair(folder / "k.pub"), "a key pair file has two lines");

  // Readable by others: refused, saying how to fix it.
  fs::permissions(folder / "k.key", fs::perms::group_read | fs::perms::others_read, fs::perm_options::add);
  refusal(curve::read_key_pair(folder / "k.key"), "others may read (mode 644)");
  refusal(curve::read_key_pair(folder / "k.key"), "chmod 600");
  fs::permissions(folder / "k.key", fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(value_of(curve::read_key_pair(folder / "k.key")).secret_key, pair.secret_key);

  // Public keys: a secret key where public keys go, two keys for one, no key at all, a bad line.
  EXPECT_NE(error_of(curve::read_public_key(folder / "k.key")).find("give public keys (NAME.pub) here"),
            std::string::npos);
  write_text(folder / "two.pub", pair.public_key + "\n" + curve::generate().public_key + "\n");
  EXPECT_NE(error_of(curve::read_public_key(folder / "two.pub")).find("holds one key"), std::string::npos);
  write_text(folder / "empty", "# nobody yet\n");
  EXPECT_NE(error_of(curve::read_allowed_clients(folder / "empty")).find("names no client key"), std::string::npos);
  write_text(folder / "typo", pair.public_key + "\n" + pair.public_key + "x\n");
  EXPECT_NE(error_of(curve::read_allowed_clients(folder / "typo")).find("typo:2: a key is 40 characters"),
            std::string::npos);
  EXPECT_NE(error_of(curve::read_allowed_clients(folder / "nowhere")).find("nowhere: No such file"), std::string::npos);
  EXPECT_NE(error_of(curve::read_client_keys(folder / "k.pub", folder / "missing.key")).find("missing.key"),
            std::string::npos);
}

// ---- the ZAP handler, with a real CURVE server and real clients ----------------------------------

struct Client {
  std::string name;
  zmq::socket_t socket;
};

// A CURVE ROUTER guarded by a ZAP handler, polled from this thread as the gateway's loop polls it.
class CurveServer {
 public:
  CurveServer(std::optional<std::set<std::string>> allowed, bool with_handler = true)
      : keys_(curve::generate()), endpoint_(make_endpoint(Transport::tcp, "curve")) {
    if (with_handler) zap_.emplace(context_, std::move(allowed));
    router_ = zmq::socket_t(context_, zmq::socket_type::router);
    router_.set(zmq::sockopt::linger, 0);
    curve::set_server_options(router_, keys_);
    router_.bind(endpoint_);
  }

  // A client that sends its name once connected (with CURVE keys, or in the clear).
  Client& connect(const std::string& name, const std::optional<curve::KeyPair>& keys) {
    Client& client = clients_.emplace_back(Client{name, zmq::socket_t(context_, zmq::socket_type::dealer)});
    client.socket.set(zmq::sockopt::linger, 0);
    if (keys) curve::set_client_options(client.socket, {keys_.public_key, *keys});
    client.socket.connect(endpoint_);
    client.socket.send(zmq::buffer(name), zmq::send_flags::dontwait);
    return client;
  }

  // Polls the handler and the router until `done` or the deadline; what the router received,
  // as name -> the User-Id libzmq gave the message (the client's key, from the ZAP answer).
  template <typename Done>
  void serve_until(Done done, std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    while (!done() && Clock::now() < deadline) {
      std::vector<zmq::pollitem_t> items{{router_.handle(), 0, ZMQ_POLLIN, 0}};
      if (zap_) items.push_back({zap_->socket().handle(), 0, ZMQ_POLLIN, 0});
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(20));
      if (zap_) zap_->answer_waiting(Clock::now().time_since_epoch().count());
      zmq::message_t routing, body;
      while (router_.recv(routing, zmq::recv_flags::dontwait)) {
        (void)router_.recv(body, zmq::recv_flags::dontwait);
        received_[body.to_string()] = body.gets("User-Id");
      }
    }
  }

  ZapHandler& zap() { return *zap_; }
  const std::map<std::string, std::string>& received() const { return received_; }
  zmq::context_t& context() { return context_; }

 private:
  zmq::context_t context_;
  curve::KeyPair keys_;
  std::string endpoint_;
  std::optional<ZapHandler> zap_;
  zmq::socket_t router_;
  std::list<Client> clients_;
  std::map<std::string, std::string> received_;
};

TEST(CurveZap, AllowedKeysAreServedOthersRefusedAndCounted) {
  const curve::KeyPair alice = curve::generate(), mallory = curve::generate();
  CurveServer server(std::set<std::string>{alice.public_key});
  server.connect("alice", alice);
  server.connect("mallory", mallory);
  server.connect("plain", std::nullopt);
  server.serve_until([&] { return server.received().contains("alice") && server.zap().refused() >= 1; },
                     std::chrono::seconds(10));
  ASSERT_TRUE(server.received().contains("alice"));
  EXPECT_EQ(server.received().at("alice"), alice.public_key);  // the ZAP answer's user id
  EXPECT_GE(server.zap().allowed(), 1u);
  EXPECT_GE(server.zap().refused(), 1u);
  // Whatever else arrives while the refused clients keep trying: nothing from them.
  server.serve_until([] { return false; }, std::chrono::milliseconds(500));
  EXPECT_FALSE(server.received().contains("mallory"));
  EXPECT_FALSE(server.received().contains("plain"));
  EXPECT_EQ(server.received().size(), 1u);
}

TEST(CurveZap, WithoutAListAnyClientThatKnowsTheServerKeyIsServed) {
  CurveServer server(std::nullopt);
  server.connect("anyone", curve::generate());
  server.connect("plain", std::nullopt);
  server.serve_until([&] { return server.received().contains("anyone"); }, std::chrono::seconds(10));
  EXPECT_TRUE(server.received().contains("anyone"));
  server.serve_until([] { return false; }, std::chrono::milliseconds(300));
  EXPECT_FALSE(server.received().contains("plain"));
  EXPECT_EQ(server.zap().refused(), 0u);  // a plain client never reaches the handler
}

TEST(CurveZap, WithoutAHandlerEveryHandshakeIsRefused) {
  CurveServer server(std::nullopt, /*with_handler=*/false);
  server.connect("anyone", curve::generate());
  server.serve_until([] { return false; }, std::chrono::milliseconds(500));
  EXPECT_TRUE(server.received().empty());
}

// What libzmq's sessions send the handler (RFC 27), sent here by hand: the answers' frames, and
// the log's once-a-minute limit per key.
class ZapConversation {
 public:
  explicit ZapConversation(std::set<std::string> allowed) : zap_(context_, std::move(allowed)) {
    asker_.connect("inproc://zeromq.zap.01");
    previous_ = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("zap-test", log_));
  }
  ~ZapConversation() { spdlog::set_default_logger(previous_); }

  // The answer's frames to one request, handled at now_s.
  std::vector<std::string> ask(const std::string& id, const std::string& mechanism, const std::string& credentials,
                               std::int64_t now_s, const std::string& domain = curve::kZapDomain) {
    const std::vector<std::string> request{"1.0", id, domain, "192.0.2.7", "", mechanism, credentials};
    std::vector<zmq::const_buffer> frames;
    for (const std::string& frame : request) frames.push_back(zmq::buffer(frame));
    (void)zmq::send_multipart(asker_, frames);
    zmq::pollitem_t item{zap_.socket().handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::seconds(5));
    zap_.answer_waiting(now_s * 1'000'000'000);
    std::vector<zmq::message_t> reply;
    (void)zmq::recv_multipart(asker_, std::back_inserter(reply));
    std::vector<std::string> answer;
    for (const auto& frame : reply) answer.push_back(frame.to_string());
    return answer;
  }

  std::size_t log_lines() const { return log_->last_raw().size(); }
  const ZapHandler& zap() const { return zap_; }

 private:
  zmq::context_t context_;
  ZapHandler zap_;
  zmq::socket_t asker_{context_, zmq::socket_type::req};
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> log_ = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  std::shared_ptr<spdlog::logger> previous_;
};

TEST(CurveZap, AnswersAsRfc27SaysAndLogsEachKeyOnceAMinute) {
  const curve::KeyPair alice = curve::generate(), mallory = curve::generate();
  ZapConversation zap({alice.public_key});
  EXPECT_EQ(zap.ask("r1", "CURVE", curve::key_bytes(alice.public_key), 0),
            (std::vector<std::string>{"1.0", "r1", "200", "OK", alice.public_key, ""}));
  EXPECT_EQ(zap.ask("r2", "CURVE", curve::key_bytes(mallory.public_key), 0),
            (std::vector<std::string>{"1.0", "r2", "400", "unknown client key", "", ""}));
  EXPECT_EQ(zap.ask("r3", "PLAIN", "user", 0),
            (std::vector<std::string>{"1.0", "r3", "400", "only CURVE clients are served here", "", ""}));
  EXPECT_EQ(zap.ask("r4", "CURVE", "short", 0)[2], "400");
  EXPECT_EQ(zap.log_lines(), 2u);  // mallory; not CURVE
  // Alice's key in another ZAP domain (the links', say): not this handler's to let in.
  EXPECT_EQ(zap.ask("r4b", "CURVE", curve::key_bytes(alice.public_key), 0, curve::kLinkZapDomain),
            (std::vector<std::string>{"1.0", "r4b", "400", "not a domain this handler serves", "", ""}));
  EXPECT_EQ(zap.log_lines(), 3u);

  // Mallory again within the minute: counted, not logged; after it: logged again.
  EXPECT_EQ(zap.ask("r5", "CURVE", curve::key_bytes(mallory.public_key), 59)[2], "400");
  EXPECT_EQ(zap.log_lines(), 3u);
  EXPECT_EQ(zap.ask("r6", "CURVE", curve::key_bytes(mallory.public_key), 61)[2], "400");
  EXPECT_EQ(zap.log_lines(), 4u);
  EXPECT_EQ(zap.zap().refused(), 6u);
  EXPECT_EQ(zap.zap().allowed(), 1u);
}

TEST(CurveZap, OneHandlerPerContext) {
  CurveServer server(std::nullopt);
  try {
    ZapHandler second(server.context(), std::nullopt);
    ADD_FAILURE() << "a second handler bound";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("a ZeroMQ context has one handler"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mqlm::actors
