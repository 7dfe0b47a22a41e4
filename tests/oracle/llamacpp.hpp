// What the tests that use llama.cpp as the oracle share (link mqlm_llamacpp): starting it once per
// process, a scratch folder for the files, and llama-quantize's work into a file.
#pragma once

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

#include <unistd.h>

#include <ggml-backend.h>
#include <llama.h>

namespace mqlm::testing {

// llama.cpp's CPU backends, loaded once per process; its log only where it reports an error.
inline void start_llamacpp() {
  static const bool started = [] {
    llama_log_set(
        [](ggml_log_level level, const char* text, void*) {
          if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
        },
        nullptr);
    ggml_backend_load_all_from_path(MQLM_LLAMACPP_LIB);
    llama_backend_init();
    return true;
  }();
  (void)started;
}

// A folder of this process's own under the temporary directory (`name` and the process id), removed
// with everything in it: where a test writes the files both engines load.
class ScratchFolder {
 public:
  explicit ScratchFolder(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path_);
  }
  ~ScratchFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// llama_model_quantize(in, out) to file type `ftype` (every matrix in its main type where `pure`);
// throws std::runtime_error where llama.cpp fails.
inline void quantize_with_llamacpp(const std::filesystem::path& in, const std::filesystem::path& out, llama_ftype ftype,
                                   bool pure, int threads) {
  llama_model_quantize_params params = llama_model_quantize_default_params();
  params.ftype = ftype;
  params.pure = pure;
  params.nthread = threads;
  if (llama_model_quantize(in.c_str(), out.c_str(), &params) != 0) {
    throw std::runtime_error("llama_model_quantize of " + in.string() + " to " + out.string() + " failed");
  }
}

}  // namespace mqlm::testing
