// libFuzzer target: the tar reader (io/energon/tar.h). The input is a whole tar file: it is scanned into
// samples as .tar.idx building does, then each sample's byte range is read member by member as
// the Energon reader does, data included.
#include "io/energon/tar.h"
#include "tools/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = vlm::fuzz::write_scratch("tar", data, size);
  vlm::fuzz::expect_only_vlm_errors([&] {
    vlm::io::ReadOnlyFile file(path);
    uint64_t end = 0;
    std::vector<vlm::io::TarSample> samples = vlm::io::scan_tar_samples(file, 0, file.size(), &end);
    for (size_t i = 0; i < samples.size(); i++) {
      uint64_t range_end = i + 1 < samples.size() ? samples[i + 1].offset : end;
      // Each sample on its own, so one bad range does not hide the others.
      vlm::fuzz::expect_only_vlm_errors([&] {
        vlm::io::TarRangeReader reader(file, samples[i].offset, range_end, 4096);
        vlm::io::TarMember m;
        while (reader.next(&m)) {
          std::string_view key, part;
          if (vlm::io::tar_is_meta_name(m.name) || !vlm::io::tar_split_name(m.name, &key, &part))
            continue;
          std::string bytes = reader.read_data(m);
          vlm::fuzz::touch(bytes.data(), bytes.size());
        }
      });
    }
  });
  // The raw range reader over the whole file, without the sample grouping.
  vlm::fuzz::expect_only_vlm_errors([&] {
    vlm::io::ReadOnlyFile file(path);
    vlm::io::TarRangeReader reader(file, 0, file.size());
    vlm::io::TarMember m;
    while (reader.next(&m))
      if (m.is_regular()) reader.read_data(m);
  });
  return 0;
}
