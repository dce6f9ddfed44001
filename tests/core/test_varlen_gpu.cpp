// The device data of src/core/varlen.h on a GPU: each image (the offsets with their chunk starts,
// an attention tile list per spec) uploaded once per layout, device and stream, from pinned
// memory, and read back equal to what the host builds (kernels/varlen_offsets.h,
// kernels/attention_tiles.h); the attention, conv1d and gated delta ops reading it, a second
// forward + backward on the same layout uploading nothing, against the CPU ops; a launcher
// refusing a tile list of another spec; pageable uploads counted apart (kernels/gpu_runtime.h).
// Skips (exit 77) with the device query text when there is no device.
#include <catch2/catch.hpp>

#include "tests/skip.h"

#if VLM_WITH_CUDA

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/attention.h"
#include "kernels/gated_delta.h"
#include "kernels/gpu_runtime.h"
#include "src/core/autograd.h"
#include "src/core/ops.h"
#include "src/core/stream.h"
#include "src/core/varlen.h"
#include "tests/error_of.h"
#include "tests/gpu_testing.h"
#include "tests/gradcheck.h"

using namespace vlm;
namespace kc = vlm::kernels::cuda;

using vlm::testing::gpu;
using vlm::testing::kGpu;
using vlm::testing::leaf;
using vlm::testing::rel_err;
using vlm::testing::require_device;

namespace {

const std::vector<int32_t> kLengths = {0, 1, 64, 65, 0, 200, 7};

std::vector<int32_t> offsets_of(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu{0};
  for (int32_t l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

VarlenLayout layout_of(const std::vector<int32_t>& lengths) {
  const std::vector<int32_t> cu = offsets_of(lengths);
  return VarlenLayout::of(Tensor::from_vector(cu, {int64_t(cu.size())}), cu.back());
}

// `n` values of T at device address p, read back.
template <typename T> std::vector<T> read_back(const T* p, int64_t n) {
  std::vector<T> host(static_cast<size_t>(n));
  kc::memcpy_d2h(host.data(), p, size_t(n) * sizeof(T), current_stream(kGpu).handle());
  kc::stream_synchronize(current_stream(kGpu).handle());
  return host;
}

bool same_tiles(const std::vector<kernels::Tile>& a, const std::vector<kernels::Tile>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(kernels::Tile)) == 0);
}

} // namespace

TEST_CASE("gpu varlen: each device image uploaded once per layout and stream, from pinned memory",
          "[gpu]") {
  require_device();
  const VarlenLayout varlen = layout_of(kLengths);
  const std::vector<int32_t> cu = offsets_of(kLengths);
  const int64_t docs = int64_t(kLengths.size());
  kc::reset_launch_counts();
  const uint64_t uploads0 = VarlenLayout::device_uploads();

  const kernels::VarlenOffsets o = varlen.device_offsets(kGpu);
  int64_t chunks = 0;
  const std::vector<int32_t> want =
      kernels::varlen_offsets_image(cu.data(), docs, kernels::kGatedDeltaChunk, &chunks);
  CHECK(o.docs == docs);
  CHECK(o.chunks == chunks);
  CHECK(o.chunk == kernels::kGatedDeltaChunk);
  CHECK(read_back(o.cu_seqlens, docs + 1) == cu);
  CHECK(read_back(o.chunk_starts, docs) ==
        std::vector<int32_t>(want.begin() + docs + 1, want.end()));

  const kernels::TileSpec queries = kernels::tile_spec(64, true, true),
                          keys = kernels::tile_spec(32, true, false);
  const kernels::TileList q = varlen.attention_tiles(kGpu, queries);
  const kernels::TileList k = varlen.attention_tiles(kGpu, keys);
  CHECK(q.spec == queries);
  CHECK(k.spec == keys);
  CHECK(same_tiles(read_back(q.tiles, q.count), kernels::make_tiles(cu.data(), docs, queries)));
  CHECK(same_tiles(read_back(k.tiles, k.count), kernels::make_tiles(cu.data(), docs, keys)));
  CHECK(VarlenLayout::device_uploads() - uploads0 == 3);

  // Asked again, through a copy or a layout made again from the same offsets: the same buffers.
  const VarlenLayout copy = varlen, again = layout_of(kLengths);
  CHECK(copy.device_offsets(kGpu).cu_seqlens == o.cu_seqlens);
  CHECK(again.attention_tiles(kGpu, queries).tiles == q.tiles);
  CHECK(again.attention_tiles(kGpu, keys).tiles == k.tiles);
  CHECK(VarlenLayout::device_uploads() - uploads0 == 3);
  const kc::LaunchCounts c = kc::launch_counts();
  CHECK(c.h2d_copies == 3);
  CHECK(c.h2d_pageable == 0);

  // Another stream gets its own copy, ordered on that stream.
  const Stream s = Stream::create(kGpu);
  {
    StreamGuard on(s);
    const kernels::TileList qs = varlen.attention_tiles(kGpu, queries);
    CHECK(qs.tiles != q.tiles);
    CHECK(same_tiles(read_back(qs.tiles, qs.count), kernels::make_tiles(cu.data(), docs, queries)));
  }
  CHECK(VarlenLayout::device_uploads() - uploads0 == 4);
  kc::device_synchronize();
}

TEST_CASE("gpu varlen: attention, conv1d and the gated delta rule read the layout's device data, "
          "and a second forward and backward uploads nothing",
          "[gpu]") {
  require_device();
  setenv("VLM_ATTENTION_BACKEND", "own", 1);
  Rng rng(3);
  const int64_t T = offsets_of(kLengths).back(), H = 2, D = 32, C = 24, K = 4;
  const Tensor q = Tensor::randn({T, H, D}, rng), k = Tensor::randn({T, H, D}, rng),
               v = Tensor::randn({T, H, D}, rng), x = Tensor::randn({T, C}, rng),
               w = Tensor::randn({C, K}, rng, DType::f32, 0.5);
  // Gated delta inputs: unit q/k rows, log decays in [-2, -0.01], beta in (0, 1).
  Tensor gq, gk;
  {
    NoGradGuard no_grad;
    gq = l2_normalize(Tensor::randn({T, 1, 16}, rng), 1e-6);
    gk = l2_normalize(Tensor::randn({T, 1, 16}, rng), 1e-6);
  }
  const Tensor gv = Tensor::randn({T, 2, 16}, rng), gg = Tensor::uniform({T, 2}, rng, -2, -0.01),
               gb = Tensor::uniform({T, 2}, rng, 0, 1);

  const std::vector<Tensor> host_inputs{q, k, v, x, w, gq, gk, gv, gg, gb};
  std::vector<Tensor> gpu_inputs;
  for (const Tensor& t : host_inputs) gpu_inputs.push_back(gpu(t));

  // All three ops forward and backward on `inputs`: the outputs and the inputs' gradients.
  auto run = [&](const VarlenLayout& varlen, const std::vector<Tensor>& inputs) {
    std::vector<Tensor> leaves;
    for (const Tensor& t : inputs) leaves.push_back(leaf(t));
    const Tensor a = attention(leaves[0], leaves[1], leaves[2], varlen, true, 0.2);
    const Tensor y = causal_conv1d(leaves[3], leaves[4], varlen, true);
    const Tensor o =
        gated_delta_rule(leaves[5], leaves[6], leaves[7], leaves[8], leaves[9], varlen, 0.25);
    run_backward({sum(a), sum(y), sum(o)}, {Tensor(), Tensor(), Tensor()});
    std::vector<Tensor> results{a, y, o};
    for (const Tensor& l : leaves) results.push_back(l.grad());
    return results;
  };
  // First use: the self-checks (with their own small layouts), on one document.
  run(VarlenLayout::single(T), gpu_inputs);
  kc::device_synchronize();

  const VarlenLayout varlen = layout_of(kLengths);
  const std::vector<Tensor> want = run(varlen, host_inputs);
  kc::reset_launch_counts();
  const uint64_t uploads0 = VarlenLayout::device_uploads();
  const std::vector<Tensor> got = run(varlen, gpu_inputs);
  // f32 attention: the query tiles (forward, dQ) and the key tiles (dK/dV, 32 keys); conv1d and
  // the gated delta rule: one image of offsets and chunk starts. Nothing else goes up.
  CHECK(VarlenLayout::device_uploads() - uploads0 == 3);
  kc::LaunchCounts c = kc::launch_counts();
  CHECK(c.h2d_copies == 3);
  CHECK(c.h2d_pageable == 0);
  for (size_t i = 0; i < got.size(); i++) {
    INFO("result " << i);
    CHECK(rel_err(got[i], want[i]) <= 1e-4);
  }

  kc::reset_launch_counts();
  const std::vector<Tensor> second = run(varlen, gpu_inputs);
  c = kc::launch_counts();
  CHECK(VarlenLayout::device_uploads() - uploads0 == 3);
  CHECK(c.h2d_copies == 0);
  for (size_t i = 0; i < got.size(); i++) CHECK(testing::same_bits(second[i], got[i]));
}

TEST_CASE("gpu varlen: a flash launch refuses a tile list of another spec", "[gpu]") {
  require_device();
  const VarlenLayout varlen = layout_of({10, 20});
  kernels::AttentionShape s;
  s.tokens = 30;
  s.q_heads = s.kv_heads = 1;
  s.head_dim = 16;
  s.docs = 2;
  s.causal = true;
  s.scale = 0.25;
  Tensor q = Tensor::zeros({30, 1, 16}, DType::f32, kGpu),
         out = Tensor::empty(q.shape(), DType::f32, kGpu),
         lse = Tensor::empty({30, 1}, DType::f32, kGpu);
  const kernels::FlashTileSpecs specs = kernels::flash_tile_specs(s, DType::f32);
  const std::string why = testing::error_of([&] {
    kc::attention_fwd<float>(out.data<float>(), lse.data<float>(), q.data<float>(), q.data<float>(),
                             q.data<float>(), varlen.attention_tiles(kGpu, specs.keys), s, nullptr);
  });
  CHECK(why.find("needs the tile list of 64 rows, causal, late first") != std::string::npos);
  kc::device_synchronize();
}

TEST_CASE("gpu runtime: uploads from pageable memory are counted apart", "[gpu]") {
  require_device();
  std::vector<float> pageable(256, 1.f);
  void* pinned = kc::host_alloc_pinned(pageable.size() * sizeof(float));
  void* dst = kc::malloc_async(pageable.size() * sizeof(float), nullptr);
  kc::reset_launch_counts();
  kc::memcpy_h2d(dst, pinned, pageable.size() * sizeof(float), nullptr);
  CHECK(kc::launch_counts().h2d_copies == 1);
  CHECK(kc::launch_counts().h2d_pageable == 0);
  kc::memcpy_h2d(dst, pageable.data(), pageable.size() * sizeof(float), nullptr);
  CHECK(kc::launch_counts().h2d_copies == 2);
  CHECK(kc::launch_counts().h2d_pageable == 1);
  kc::stream_synchronize(nullptr);
  kc::free_async(dst, nullptr);
  kc::host_free_pinned(pinned);
}

#else

TEST_CASE("gpu varlen: skipped") { VLM_SKIP("built without CUDA"); }

#endif
