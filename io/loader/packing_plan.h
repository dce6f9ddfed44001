// Offline packing: a packing plan computed once from a length scan of a whole split (`vlmtrain
// data pack`) and replayed by the loader, instead of packing online from a rolling buffer
// (energon-format.md §5.4: the reference claims offline packing but has none).
//
// The scan runs prepare_sample on every sample of the split (tokenized, images sized but not
// necessarily decoded) and records its length, 0 for a dropped or invalid one (scan_length).
// The plan packs those lengths with the same best_fit_decreasing as the online packer, over the
// whole split or over consecutive windows of global indices, and then shuffles the row order
// with a seeded vlm::Rng (identical on every platform), so that a run does not see all the
// longest samples first. Each row lists global indices (ascending) and their planned lengths;
// replay checks every sample against its planned length, so a plan made with another tokenizer,
// chat template, image size limit or seq_len cannot be replayed silently.
//
// File format (version 1), little-endian:
//   8 bytes  magic "VLMPLAN\0"
//   u64      header length N
//   N bytes  JSON header: {"format": "vlmtrain packing plan", "version": 1,
//            "identity": {dataset, split, sample_count, seq_len, overlong, fingerprint{}},
//            "options": {window, shuffle_rows, seed}, "num_rows", "num_entries", "num_skipped",
//            "real_tokens", "pad_tokens", "body_fnv1a64": "<16 hex digits>"}
//   body     i64 row_offsets[num_rows + 1], i64 indices[num_entries], i32 lengths[num_entries]
// load() validates all of it (magic, version, sizes, checksum, offsets, index range and
// uniqueness, lengths, per-row sums, totals) and names the file in every error.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "io/loader/packing.h"

namespace vlm::io {

// What a plan was made for. check_identity() compares all of it before replay.
struct PlanIdentity {
  std::string dataset;      // dataset path or name
  std::string split;        // "train", "val", ...
  int64_t sample_count = 0; // samples in the split: global indices 0 … sample_count - 1
  int64_t seq_len = 0;
  OverlongPolicy overlong = OverlongPolicy::truncate;
  // Everything else that decides sample lengths, as the caller names it (tokenizer file hash,
  // chat template, max_pixels, spatial_merge_size, ...). Compared key by key.
  std::map<std::string, std::string> fingerprint;
};

struct PlanOptions {
  int64_t window = 0; // pack consecutive windows of this many global indices; 0 = whole split
  bool shuffle_rows = true;
  uint64_t seed = 0; // for the row shuffle
};

// The scan's length of one sample: prepare_sample's length, or 0 when it drops the sample.
int32_t scan_length(TokenizedSample s, const PackingConfig& cfg);

class PackingPlan {
public:
  // lengths[i] is the scan length of global index i (0 = skip); lengths.size() must equal
  // id.sample_count and every length must be <= id.seq_len.
  static PackingPlan build(const std::vector<int32_t>& lengths, const PlanIdentity& id,
                           const PlanOptions& opt);
  static PackingPlan load(const std::string& path);
  // Written to path + ".tmp" and renamed, so `path` is the old plan or the complete new one.
  void save(const std::string& path) const;

  const PlanIdentity& identity() const { return id_; }
  const PlanOptions& options() const { return opt_; }
  int64_t num_rows() const { return int64_t(offsets_.size()) - 1; }
  std::span<const int64_t> row(int64_t r) const;         // global indices, ascending
  std::span<const int32_t> row_lengths(int64_t r) const; // their planned lengths
  int64_t num_packed() const { return int64_t(indices_.size()); }
  int64_t num_skipped() const { return id_.sample_count - num_packed(); }
  int64_t real_tokens() const { return real_tokens_; }
  int64_t pad_tokens() const { return num_rows() * id_.seq_len - real_tokens_; }
  double efficiency() const;

  // Throws vlm::Error listing every field of `expected` that differs from the plan's identity.
  void check_identity(const PlanIdentity& expected) const;

  // Replays row r: `samples` are the row's samples as read and tokenized now, in row order; the
  // loader may leave out ones it could not read (they were skip-reported there), but not all of
  // them. Each is prepared and must have its planned length. cfg.seq_len and cfg.overlong must
  // match the plan.
  PackedRow pack(int64_t r, std::vector<TokenizedSample> samples, const PackingConfig& cfg) const;

private:
  void check_consistent(const std::string& where) const; // structural validation

  PlanIdentity id_;
  PlanOptions opt_;
  std::vector<int64_t> offsets_{0}; // num_rows + 1
  std::vector<int64_t> indices_;
  std::vector<int32_t> lengths_;
  int64_t real_tokens_ = 0;
};

// PackingPlan::build(lengths, id, opt).save(path); returns the plan.
PackingPlan write_packing_plan(const std::string& path, const std::vector<int32_t>& lengths,
                               const PlanIdentity& id, const PlanOptions& opt = {});

} // namespace vlm::io
