#include "src/core/varlen.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/gated_delta.h"
#include "src/base/check.h"
#include "src/core/stream.h"

namespace vlm {

// The device images of one set of offsets, per (device, stream, what).
struct VarlenDeviceCache {
  std::mutex mutex;
  std::map<std::tuple<int, void*, std::string>, Tensor> images;
  std::atomic<int64_t> chunks{-1}; // of the offsets image, once built
};

namespace {

// Layouts made with the same offsets share their device data while one of the last
// kRetainedLayouts distinct offsets (a batch, its vision tower's, a self-check's) is among them.
constexpr size_t kRetainedLayouts = 8;

std::atomic<uint64_t> g_uploads{0};

struct Retained {
  std::mutex mutex;
  std::deque<std::pair<std::vector<int32_t>, std::shared_ptr<VarlenDeviceCache>>> recent; // newest
};

// Never destroyed: its device buffers must not be freed after the CUDA runtime has shut down.
Retained& retained() {
  static Retained* r = new Retained;
  return *r;
}

std::shared_ptr<VarlenDeviceCache> cache_for(const std::vector<int32_t>& offsets) {
  Retained& r = retained();
  std::shared_ptr<VarlenDeviceCache> evicted; // freed after the lock is released
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = std::find_if(r.recent.begin(), r.recent.end(),
                         [&](const auto& entry) { return entry.first == offsets; });
  if (it != r.recent.end()) {
    auto entry = std::move(*it);
    r.recent.erase(it);
    r.recent.push_front(std::move(entry));
    return r.recent.front().second;
  }
  r.recent.emplace_front(offsets, std::make_shared<VarlenDeviceCache>());
  if (r.recent.size() > kRetainedLayouts) {
    evicted = std::move(r.recent.back().second);
    r.recent.pop_back();
  }
  return r.recent.front().second;
}

template <typename T> std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> bytes(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

} // namespace

VarlenLayout VarlenLayout::of(const Tensor& cu_seqlens, int64_t tokens) {
  VLM_CHECK(cu_seqlens.defined() && cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 2 &&
                (cu_seqlens.dtype() == DType::i32 || cu_seqlens.dtype() == DType::i64),
            "varlen layout: cu_seqlens must be [docs + 1] i32 or i64 with docs >= 1, got ",
            cu_seqlens.defined() ? cu_seqlens.desc() : std::string("nothing"));
  const std::vector<double> v = cu_seqlens.to_doubles();
  VLM_CHECK(v[0] == 0, "varlen layout: cu_seqlens[0] must be 0, got ", v[0]);
  std::vector<int32_t> offsets(v.size());
  VarlenLayout out;
  for (size_t d = 1; d < v.size(); d++) {
    VLM_CHECK(v[d] >= v[d - 1], "varlen layout: cu_seqlens must be non-decreasing, but cu_seqlens[",
              d, "] = ", v[d], " < cu_seqlens[", d - 1, "] = ", v[d - 1]);
    offsets[d] = int32_t(v[d]);
    out.max_length = std::max(out.max_length, int64_t(v[d] - v[d - 1]));
  }
  VLM_CHECK(int64_t(v.back()) == tokens, "varlen layout: cu_seqlens ends at ", v.back(),
            " but the batch has ", tokens, " tokens");
  out.cu_seqlens = Tensor::from_vector(offsets, {int64_t(offsets.size())});
  out.docs = int64_t(offsets.size()) - 1;
  out.tokens = tokens;
  out.device_cache = cache_for(offsets);
  return out;
}

VarlenLayout VarlenLayout::single(int64_t tokens) {
  return of(Tensor::from_vector(std::vector<int32_t>{0, int32_t(tokens)}, {2}), tokens);
}

Tensor VarlenLayout::device_image(Device device, const std::string& key,
                                  const std::function<std::vector<uint8_t>()>& make) const {
  VLM_CHECK(device_cache, "varlen layout: device data needs a layout made by VarlenLayout::of");
  VLM_CHECK(device.is_cuda(), "varlen layout: device data is for CUDA devices, got ", device.str());
  // Per stream: the upload is ordered before the work queued on this stream only.
  const Stream stream = current_stream(device);
  auto id = std::make_tuple(device.index, stream.handle(), key);
  std::lock_guard<std::mutex> lock(device_cache->mutex);
  if (auto it = device_cache->images.find(id); it != device_cache->images.end()) return it->second;
  const std::vector<uint8_t> bytes = make();
  Tensor image;
  if (bytes.empty()) {
    image = Tensor::empty({0}, DType::u8, device);
  } else {
    // The pinned block is reused only after the copy (queued on this device's current stream).
    DeviceGuard on(device);
    Tensor staging = Tensor::empty_pinned({int64_t(bytes.size())}, DType::u8);
    std::memcpy(staging.data_ptr(), bytes.data(), bytes.size());
    image = staging.to(device);
    g_uploads.fetch_add(1, std::memory_order_relaxed);
  }
  device_cache->images.emplace(std::move(id), image);
  return image;
}

kernels::VarlenOffsets VarlenLayout::device_offsets(Device device) const {
  const Tensor image = device_image(device, "offsets", [&] {
    int64_t chunks = 0;
    std::vector<uint8_t> bytes = as_bytes(kernels::varlen_offsets_image(
        cu_seqlens.data<int32_t>(), docs, kernels::kGatedDeltaChunk, &chunks));
    device_cache->chunks.store(chunks);
    return bytes;
  });
  const auto* base = static_cast<const int32_t*>(image.data_ptr());
  kernels::VarlenOffsets o;
  o.cu_seqlens = base;
  o.chunk_starts = base + docs + 1;
  o.docs = docs;
  o.chunk = kernels::kGatedDeltaChunk;
  o.chunks = device_cache->chunks.load();
  return o;
}

kernels::TileList VarlenLayout::attention_tiles(Device device,
                                                const kernels::TileSpec& spec) const {
  const Tensor image = device_image(device, "attention tiles: " + spec.str(), [&] {
    return as_bytes(kernels::make_tiles(cu_seqlens.data<int32_t>(), docs, spec));
  });
  return {static_cast<const kernels::Tile*>(image.data_ptr()),
          int64_t(image.numel()) / int64_t(sizeof(kernels::Tile)), spec};
}

uint64_t VarlenLayout::device_uploads() { return g_uploads.load(std::memory_order_relaxed); }

} // namespace vlm
