// libFuzzer target: the safetensors header parser (io/state/safetensors.h). The input is a whole file;
// when it opens, every tensor's bytes are read, so an offset that the header check let past the
// end of the mapping shows up as an ASan report or a SEGV.
#include "io/state/safetensors.h"
#include "tools/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = vlm::fuzz::write_scratch("safetensors", data, size);
  vlm::fuzz::expect_only_vlm_errors([&] {
    vlm::io::SafetensorsFile f(path);
    for (const std::string& name : f.names()) {
      const vlm::io::TensorInfo& t = f.get(name);
      // The byte count must agree with dtype x shape (what consumers memcpy by).
      size_t expect = vlm::dtype_size(t.dtype);
      for (int64_t d : t.shape) expect *= size_t(d);
      if (expect != t.nbytes) {
        std::fprintf(stderr, "FINDING: tensor '%s': %zu bytes for a shape of %zu bytes\n",
                     name.c_str(), t.nbytes, expect);
        std::abort();
      }
      vlm::fuzz::touch(t.data, t.nbytes);
    }
    for (const auto& [k, v] : f.metadata()) vlm::fuzz::touch(v.data(), v.size());
  });
  return 0;
}
