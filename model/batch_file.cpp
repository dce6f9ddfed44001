#include "model/batch_file.h"

#include <cstring>

#include "io/state/safetensors.h"
#include "src/base/logging.h"

namespace vlm::model {

namespace {

Tensor read_key(const io::SafetensorsFile& f, const std::string& key) {
  VLM_CHECK(f.contains(key), f.path(), ": batch has no tensor '", key,
            "' (a batch needs input_ids, labels, position_ids, cu_seqlens)");
  const io::TensorInfo& info = f.get(key);
  Tensor t = Tensor::empty(info.shape, info.dtype);
  if (info.nbytes) std::memcpy(t.data_ptr(), info.data, info.nbytes);
  return t;
}

} // namespace

Batch read_batch_file(const std::string& path, bool vision) {
  io::SafetensorsFile f(path);
  Batch b;
  try {
    b = batch_from_labels(read_key(f, "input_ids"), read_key(f, "labels"),
                          read_key(f, "position_ids"), read_key(f, "cu_seqlens"));
  } catch (const Error& e) {
    if (std::strstr(e.what(), path.c_str())) throw;
    VLM_FAIL(path, ": ", e.what());
  }
  for (const char* key : {"pixel_values", "image_grid_thw"}) {
    if (!f.contains(key)) continue;
    if (!vision) {
      log_info(path, ": ignoring '", key, "' (a text-only model has no vision tower)");
      continue;
    }
    (std::string(key) == "pixel_values" ? b.pixel_values : b.image_grid_thw) = read_key(f, key);
  }
  return b;
}

} // namespace vlm::model
