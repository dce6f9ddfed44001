// The data loader of one data-parallel rank: Energon dataset(s) -> packed rows, prepared by
// background reader threads, in an order that depends only on the config (never on thread
// timing), with a small state that resumes it exactly.
//
// Structure (energon's worker model, docs/energon-format.md §4):
//   * num_workers reader threads per rank; worker w of rank r is global worker
//     r × num_workers + w and owns its own part of the data (io/energon/sampler.h): its own sample
//     order, shuffle buffer and packer (rows never mix workers). TP peers pass the same dp_rank and
//     get identical rows.
//   * each worker: Sampler -> SamplePipeline (read, chat, image sizes, tokenize; bad samples
//     skipped and counted) -> OnlinePacker (or a PackingPlan's rows: offline mode) -> pixels for
//     the row's images -> a bounded queue of `prefetch` rows.
//   * next() takes rows round robin over workers 0, 1, ..., W-1, 0, ... skipping finished ones.
//
// Exact resume: every row leaves its worker together with that worker's state right after it
// (sampler state, packer buffer as sample ids, counters, skip report). state() holds, per worker,
// the state attached to the last row handed out, plus the round-robin position, so rows that
// were prefetched but not handed out are simply produced again after restore(); the packer
// buffer is refilled by re-reading its samples by id. A restored loader yields exactly the rows
// the uninterrupted one would have yielded next. The state records the configuration it belongs
// to (sources, split, partition, seed, seq_len, ...) and restore() refuses another one.
//
// Epochs: with epochs = 0 (training default) the stream never ends; the sampler drains its
// shuffle buffer at every epoch end, while the packer carries its buffer across epochs. With
// epochs = n, next() returns nullopt after every worker finished n epochs and flushed its
// packer. Validation (training = false): sequential order, no shuffle buffer, typically
// epochs = 1.
//
// Errors: a whole-dataset problem (no .nv-meta, unknown split, missing tar or index, a tokenizer
// that does not load, a packing plan made for other data) throws from the constructor. An error
// in a reader thread is re-thrown by next() with the worker's rank and id. A worker whose every
// sample is skipped stops (with a warning); if the rank owns samples but none of them is usable,
// next() throws with the skip report. A rank that owns no sample at all (fewer samples than
// dp_world × num_workers) just ends at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/energon/sampler.h"
#include "io/image/preprocess.h"
#include "io/loader/packing.h"
#include "io/loader/packing_plan.h"
#include "io/loader/sample_pipeline.h"
#include "io/text/chat_format.h"

namespace vlm::io {

// Bounds of the settings that size threads and memory (validate() and the training config name
// the key): workers are threads with their own samplers and packers, the shuffle buffer holds
// sample ids, prefetched rows hold their pixels.
constexpr int64_t kMaxNumWorkers = 256;
constexpr int64_t kMaxShuffleBufferSize = int64_t(1) << 20;
constexpr int64_t kMaxPrefetch = 256;

struct LoaderConfig {
  std::string dataset; // prepared dataset folder, or a MetadatasetV2 .yaml
  std::string split = "train";
  bool training = true;     // shuffled (train) or sequential (validation)
  int64_t epochs = 0;       // 0: repeat forever
  PackingConfig packing;    // seq_len, online buffer size, overlong policy, (M)RoPE, token ids
  std::string packing_plan; // a plan from `vlmtrain data pack` (offline packing); "" = online
  std::string tokenizer;    // tokenizer.json or the folder holding it
  ImageProcessorConfig image;
  ChatFormatOptions chat;
  int64_t dp_rank = 0, dp_world = 1;
  int64_t num_workers = 2; // reader threads of this rank (part of the data partition!)
  uint64_t seed = 0;
  int64_t shuffle_buffer_size = 100;      // samples (training only)
  int64_t max_samples_per_sequence = 100; // 0 = read whole shard pieces in sequence
  int64_t parallel_slices = 16;           // open slices per worker (training only)
  int64_t prefetch = 4;                   // rows each worker prepares ahead
  size_t report_examples = 8;             // skipped samples kept in detail per worker

  void validate() const; // throws vlm::Error naming the bad field
};

// The position of one worker after the last row it handed out.
struct LoaderWorkerState {
  SamplerState sampler;
  std::vector<int64_t> packer_buffer; // sample ids in arrival order (online mode)
  bool packer_finished = false;
  bool exhausted = false;   // the worker has ended and its end was seen by next()
  int64_t rows = 0;         // rows handed out from this worker
  int64_t samples = 0;      // sample ids taken from the sampler
  int64_t unusable_run = 0; // consecutive sample ids that gave no document
  SkipReport skips;
};

struct LoaderState {
  std::string identity; // JSON text: what the state was saved for
  std::vector<LoaderWorkerState> workers;
  int64_t next_worker = 0; // round-robin position
  int64_t rows = 0;        // rows handed out in all

  nlohmann::json to_json() const;
  static LoaderState from_json(const nlohmann::json& j);
  std::string serialize() const; // compact JSON text, for checkpoints
  static LoaderState deserialize(const std::string& text);
};

class DataLoader {
public:
  // Opens everything and checks it (see "Errors"). Reader threads start at the first next().
  explicit DataLoader(LoaderConfig cfg);
  // With a tokenizer already loaded from cfg.tokenizer (copies share the tables).
  DataLoader(LoaderConfig cfg, Tokenizer tokenizer);
  ~DataLoader(); // stops and joins the reader threads
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next packed row; nullopt at the end of the data (only with epochs > 0).
  std::optional<PackedRow> next();

  // Hands a row back when the caller is done with it: its pixel buffer is reused for a later
  // row (optional; saves page faults on ~100 MB per row of images). Thread-safe.
  void recycle(PackedRow&& row);

  LoaderState state() const;
  // Continues from `s` (from a loader with the same config); may be called at any time.
  void restore(const LoaderState& s);

  // Skipped samples of the rows handed out so far, over all workers.
  SkipReport report() const;
  int64_t rows() const; // rows handed out
  // Sample ids taken by the workers for the rows handed out (used, skipped and excluded alike):
  // the denominator of the skip fraction.
  int64_t samples_read() const;
  const LoaderConfig& config() const;
  // Samples each worker of this rank owns per epoch (single source: one pass).
  std::vector<int64_t> worker_samples() const;

  struct Impl;

private:
  std::unique_ptr<Impl> impl_;
};

// The packer's token ids (pad = <|endoftext|>, <|image_pad|>, <|vision_start|>,
// <|vision_end|>) from the tokenizer itself; an error names a token it lacks.
void set_token_ids(PackingConfig& packing, const Tokenizer& tokenizer);

// Offline packing, defined beside the loader's own use of plans (io/loader/planned_rows.cpp).
// What a packing plan for `cfg` must have been made for: dataset (folder name), split, sample
// count, seq_len, overlong policy, and a fingerprint of everything else that decides sample
// lengths (the split's shards and counts, a hash of tokenizer.json, image processor settings,
// chat options). `vlmtrain data pack` writes it; the loader checks it.
PlanIdentity loader_plan_identity(const LoaderConfig& cfg);

// The scan of `vlmtrain data pack`: every sample of cfg's split run through the sample pipeline
// (no pixels) and prepare_sample, in index order, on `threads` threads: lengths[i] is sample i's
// packed length, 0 for a skipped or dropped one (reported in *report). Single datasets only.
std::vector<int32_t> scan_sample_lengths(const LoaderConfig& cfg, int threads,
                                         SkipReport* report = nullptr,
                                         const Tokenizer* tokenizer = nullptr);

} // namespace vlm::io
