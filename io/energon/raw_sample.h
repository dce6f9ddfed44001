// One sample of an Energon WebDataset as raw bytes: what EnergonDataset::read_sample returns and
// what the loader hands to decoding (JSON/text/image) and cooking. Mirrors energon's crude
// sample dict: __key__, __shard__, __restore_key__ = ("Webdataset", global_index),
// __subflavors__, plus one entry per part.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace vlm::io {

struct RawSample {
  std::string key;           // member path up to the first dot of its basename ("000123", "a/b")
  std::string shard;         // shard path relative to the dataset root, as in split.yaml
  int64_t global_index = -1; // index within the split's concatenated sample range
  // Part name -> bytes; the part name is everything after the key's dot ("jpg", "json",
  // "seg.mask.png"); decoders dispatch on its last dot component.
  std::map<std::string, std::string> parts;
  std::map<std::string, std::string> subflavors; // from dataset.yaml (metadatasets override)
  // Listed in split.yaml `exclude` as "<shard>/<key>": the sample occupies its index (it counts
  // as consumed) but must not be emitted. `parts` is then empty: its data is not read.
  bool excluded = false;
};

} // namespace vlm::io
