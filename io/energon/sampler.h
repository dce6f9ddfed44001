// Which samples one reader worker of one data-parallel rank reads, and in what order: pure index
// logic, no I/O. Mirrors Megatron-Energon's loader semantics (docs/energon-format.md §4):
//
// 1. Partition (§4.2, bit for bit as energon's Sharder; tests/data/sampler holds energon's own
//    output): a split's sample range [start, end) is cut into G = dp_world × num_workers
//    contiguous ranges whose sizes differ by at most one (the +1 remainders placed by a rotation
//    offset and a generalized bit reversal); global worker g = dp_rank × num_workers + worker
//    owns range g. TP peers use the same dp_rank, so they get identical streams. A worker may own
//    nothing (fewer samples than G).
// 2. Slices: the worker's range is cut at shard boundaries, and any piece longer than
//    1.5 × max_samples_per_sequence (msps) into round(L / msps) nearly equal slices.
// 3. Per epoch (training): the slices are permuted by a seeded generator; up to
//    `parallel_slices` of them are open at once; each step reads the next sample of an open
//    slice chosen at random with probability ∝ the slice's total length; an exhausted slice is
//    replaced by the next pending one. Every owned sample comes exactly once per epoch.
//    Validation (shuffle = false): slices in order, one open at a time, no shuffle buffer.
// 4. Several sources (a metadataset's leaves): each is partitioned on its own (leaf k rotated by
//    Σ_{j<k} len_j mod G, as energon); `weights` draws the next source with probability ∝ weight
//    and never ends; `repetitions` (blend_epochized) gives every source a quota of
//    floor(r) · len + floor(frac(r) · len) samples per meta-epoch, drawn with probability ∝ quota;
//    validation concatenates the sources in order.
// 5. Shuffle buffer (training, size > 1): incoming indices are buffered; once it holds `size`,
//    a uniformly random one leaves. Unlike energon with repeat=True, the buffer is drained at
//    every epoch end, so each epoch of the output stream is exactly one pass over the samples.
//
// Random numbers come from vlm::Rng (xoshiro256**, integer draws), seeded by (seed, global
// worker id, component), so a stream is identical on every platform; the order is NOT energon's
// (its torch generator streams are not reproduced; energon-format.md §7 says they need not be).
//
// The whole position is a small SamplerState (generator states, the epoch's permutation seed and
// how much of it was consumed, open slice cursors, the shuffle buffer as sample ids, counters),
// serializable to JSON; restore() continues exactly where state() was taken.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/energon/metadataset.h"

namespace vlm::io {

// ---- Energon's partitioning (pure functions, exposed for tests and tools) ----

// energon's generalized bit reversal of 0..n-1: halve, recurse on both halves, interleave
// (lists of length <= 2 unchanged). n = 8 -> [0, 4, 2, 6, 1, 5, 3, 7].
std::vector<int64_t> generalized_bit_reversal(int64_t n);

// Offsets o[0..G] (o[0] = start, o[G] = end): global worker g owns [o[g], o[g+1]).
std::vector<int64_t> partition_global_workers(int64_t start, int64_t end, int64_t global_workers,
                                              int64_t rotation_offset = 0);

// Slices of the range [begin, end) of a split whose shards hold `shard_counts` samples: the
// start of every slice, then `end` (so {begin} alone when the range is empty). Cut at shard
// boundaries, then by msps (0 = no msps cut).
std::vector<int64_t> slice_worker_range(const std::vector<int64_t>& shard_counts, int64_t begin,
                                        int64_t end, int64_t max_samples_per_sequence);

// What energon's Sharder.shard_workers returns for one rank: the slice offsets of each of its
// workers. num_workers 0 means 1 (energon's in-process loading).
std::vector<std::vector<int64_t>> shard_rank_workers(const std::vector<int64_t>& shard_counts,
                                                     int64_t start, int64_t end, int64_t dp_rank,
                                                     int64_t dp_world, int64_t num_workers,
                                                     int64_t max_samples_per_sequence,
                                                     int64_t rotation_offset = 0);

// ---- Sample ids: (source, index within the source's split) in one int64 ----

// With a single source the id is the split's global index itself.
constexpr int kSampleIdIndexBits = 40;
constexpr int64_t kSampleIdIndexMask = (int64_t(1) << kSampleIdIndexBits) - 1;
inline int64_t make_sample_id(int64_t source, int64_t index) {
  return (source << kSampleIdIndexBits) | index;
}
inline int64_t sample_id_source(int64_t id) { return id >> kSampleIdIndexBits; }
inline int64_t sample_id_index(int64_t id) { return id & kSampleIdIndexMask; }

// ---- The sampler of one worker ----

struct SamplerSource {
  std::vector<int64_t> shard_counts; // the split's shards in order (defines the index space)
  int64_t start = 0, end = -1;       // subset [start, end) of the split; end -1 = everything
  double weight = 1.0;               // BlendMode::weights
  double repetitions = 1.0;          // BlendMode::repetitions
};

struct SamplerConfig {
  std::vector<SamplerSource> sources; // at least one
  BlendMode blend = BlendMode::none;  // none requires exactly one source
  int64_t dp_rank = 0, dp_world = 1;
  int64_t worker = 0, num_workers = 1; // reader workers of this rank
  uint64_t seed = 0;
  bool shuffle = true;                  // false: validation order (sequential, no buffer)
  int64_t shuffle_buffer_size = 0;      // <= 1: no shuffle buffer
  int64_t max_samples_per_sequence = 0; // 0: slices are whole shard pieces
  int64_t parallel_slices = 16;
  int64_t epochs = 0; // stop after this many epochs; 0 = forever (not allowed with `weights`)

  void validate() const; // throws vlm::Error naming the bad field
};

// One open slice: `slice` indexes the source's slice list, `next` is the next sample to read.
struct SliceCursor {
  int64_t slice = -1; // -1: an empty slot
  int64_t next = 0;
};

struct SourceState {
  std::array<uint64_t, 5> rng{};       // slice choice; after this epoch's permutation was drawn
  std::array<uint64_t, 5> epoch_rng{}; // rng at the start of the epoch: regenerates the permutation
  bool in_epoch = false;               // false: the next read starts a new epoch
  int64_t pending_offset = 0;          // slices of the permutation opened so far
  std::vector<SliceCursor> active;     // parallel_slices slots
  int64_t epoch = 0;                   // epochs this source completed
  int64_t epoch_samples = 0;           // samples read in the current epoch
};

struct SamplerState {
  uint64_t layout = 0; // hash of the config and partition: restore() refuses another layout
  std::vector<SourceState> sources;
  std::array<uint64_t, 5> blend_rng{};
  std::vector<int64_t> quota; // repetitions: samples each source still owes this meta-epoch
  int64_t concat_source = 0;  // validation: the source being read
  std::array<uint64_t, 5> shuffle_rng{};
  std::vector<int64_t> shuffle_buffer; // sample ids, in buffer order
  bool draining = false;               // an epoch ended upstream; the buffer is being emptied
  bool finished = false;
  int64_t epoch = 0;         // epoch of the ids being returned (epochs completed before them)
  int64_t emitted = 0;       // ids returned by next()
  int64_t epoch_emitted = 0; // ids returned in the current epoch

  nlohmann::json to_json() const;
  static SamplerState from_json(const nlohmann::json& j); // throws vlm::Error on a bad document
};

class Sampler {
public:
  explicit Sampler(SamplerConfig cfg); // validates; computes the partition
  ~Sampler();
  Sampler(Sampler&&) noexcept;
  Sampler& operator=(Sampler&&) noexcept;

  // The next sample id (make_sample_id(source, index)); nullopt once `epochs` epochs are done,
  // or at once when this worker owns no sample.
  std::optional<int64_t> next();

  // The epoch (0, 1, ...) of the id next() returned last (0 before the first call).
  int64_t epoch() const;
  // Samples this worker owns per source and in total (one epoch of a single source).
  int64_t num_samples(size_t source) const;
  int64_t num_samples() const;
  // Slice offsets of this worker per source (see slice_worker_range).
  const std::vector<int64_t>& slices(size_t source) const;
  const SamplerConfig& config() const;

  SamplerState state() const;
  // Continues from `s` (taken from a sampler with the same config); throws vlm::Error when the
  // state does not fit this config.
  void restore(const SamplerState& s);

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace vlm::io
