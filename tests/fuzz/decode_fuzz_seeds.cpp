// Writes the decode() fuzzer's seed corpus: every catalog type's sample, encoded, without and
// with blob frames, laid out as the fuzzer reads its input (fuzz_frames.hpp).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "messages/codec.hpp"
#include "tests/fuzz/fuzz_frames.hpp"
#include "tests/messages/message_samples.hpp"

int main(int argc, char** argv) {
  using namespace mqlm::messages;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SEED_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);

  Envelope envelope;
  envelope.from = "client-7";
  envelope.to = "gpu.worker_0";
  envelope.correlation_id = 77;
  envelope.request_id = 12;
  envelope.sent_ns = 1'700'000'000'000'000'000;

  int written = 0;
  for (const Payload& payload : samples::all_sample_payloads()) {
    const std::vector<std::vector<std::string>> blob_sets{{}, {"blob-0", std::string("\0\xff", 2)}};
    for (std::size_t variant = 0; variant < blob_sets.size(); ++variant) {
      Frames blobs;
      for (const std::string& blob : blob_sets[variant]) blobs.emplace_back(blob.data(), blob.size());
      std::vector<std::string> frames;
      for (const zmq::message_t& frame : encode(envelope, payload, std::move(blobs))) {
        frames.emplace_back(static_cast<const char*>(frame.data()), frame.size());
      }
      const std::string name = std::string(kind_name(kind_of(payload))) + "-" + std::to_string(variant);
      std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
      out << fuzz::join_frames(frames);
      if (!out) {
        std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
        return 1;
      }
      ++written;
    }
  }
  std::printf("wrote %d seeds to %s\n", written, dir.c_str());
  return 0;
}
