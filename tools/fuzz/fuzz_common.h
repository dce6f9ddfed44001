// Shared helpers of the libFuzzer targets (tools/fuzz/fuzz_*.cpp, built by tools/fuzz/build.sh).
// The project's readers take file paths, so each input is written to a per-process scratch file
// first. A vlm::Error is the expected outcome of bad input; any other exception is a finding
// and aborts, so libFuzzer keeps the input.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <typeinfo>

#include "io/text/tokenizer.h"
#include "src/base/check.h"

namespace vlm::fuzz {

// A scratch file in /dev/shm when it exists (no disk traffic per execution), else TMPDIR or /tmp.
inline const std::string& scratch_path(const char* tag) {
  static const std::string path = [&] {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : tmp ? tmp : "/tmp";
    return dir + "/vlm_fuzz_" + tag + "_" + std::to_string(getpid());
  }();
  return path;
}

// The real tokenizer that VLM_FUZZ_TOKENIZER names (loaded once), or null when it is unset.
inline const io::Tokenizer* env_tokenizer() {
  static const std::optional<io::Tokenizer> tok = []() -> std::optional<io::Tokenizer> {
    const char* path = std::getenv("VLM_FUZZ_TOKENIZER");
    if (!path || !*path) return std::nullopt;
    return io::Tokenizer::from_file(path);
  }();
  return tok ? &*tok : nullptr;
}

// Writes the input to the scratch file (truncating the previous one) and returns its path.
inline const std::string& write_scratch(const char* tag, const uint8_t* data, size_t size) {
  const std::string& path = scratch_path(tag);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

// Runs body; a vlm::Error is fine, anything else is reported with its type and aborts.
template <typename F> void expect_only_vlm_errors(F&& body) {
  try {
    body();
  } catch (const vlm::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FINDING: uncaught %s: %s\n", typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "FINDING: uncaught non-std exception\n");
    std::abort();
  }
}

// Reads every byte of [p, p + n) so ASan sees out-of-bounds views; the sum defeats the optimizer.
inline void touch(const void* p, size_t n) {
  const volatile uint8_t* b = static_cast<const volatile uint8_t*>(p);
  uint8_t acc = 0;
  for (size_t i = 0; i < n; i++) acc = uint8_t(acc + b[i]);
  static volatile uint8_t sink;
  sink = acc;
}

} // namespace vlm::fuzz
