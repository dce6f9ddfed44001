// What a data loader (io/loader/loader.h) reads, opened and checked: the dataset splits of its
// config with their blend parameters, and the tokenizer; plus the fingerprints that tie a loader
// state or a packing plan (io/loader/planned_rows.h) to that data.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/energon/dataset.h"
#include "io/loader/loader.h"

namespace vlm::io {

// One leaf of the data: a dataset split (or subset of it) with its blend parameters.
struct Leaf {
  std::shared_ptr<const EnergonDataset> dataset;
  std::string split;
  int64_t start = 0, end = 0;
  double weight = 1.0, repetitions = 1.0;
  std::map<std::string, std::string> subflavors; // merged; empty = the dataset's own
  std::vector<int64_t> shard_counts;
};

struct Sources {
  std::vector<Leaf> leaves;
  BlendMode blend = BlendMode::none;
};

// The leaves of cfg.dataset (a dataset folder or a metadataset .yaml) for cfg.split; errors name
// the dataset.
Sources open_sources(const LoaderConfig& cfg);

bool is_metadataset_path(const std::string& path);

// The folder name of a dataset path ("a/b/ds/" -> "ds").
std::string folder_name(const std::string& path);

// Shard names, counts and excludes of a split: what decides its index space and content.
std::string split_fingerprint(const EnergonDataset& ds, const EnergonDataset::Split& split);

// A hash of a file's bytes (the tokenizer.json a plan was made with).
std::string file_fingerprint(const std::string& path);

Tokenizer load_tokenizer(const std::string& path);

// The packer's token ids must be the tokenizer's: a mismatch would silently break images.
void check_token_ids(const PackingConfig& p, const Tokenizer& tok);

} // namespace vlm::io
