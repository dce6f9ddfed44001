#include "io/loader/loader_inputs.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "io/energon/metadataset.h"
#include "src/base/check.h"

namespace vlm::io {

namespace fs = std::filesystem;

namespace {

uint64_t fnv1a(const std::string& s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}
std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

} // namespace

bool is_metadataset_path(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  return ext == ".yaml" || ext == ".yml";
}

std::string folder_name(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

std::string split_fingerprint(const EnergonDataset& ds, const EnergonDataset::Split& split) {
  std::string s;
  for (const ShardInfo& sh : split.shards) s += sh.name + ":" + std::to_string(sh.count) + ";";
  for (const std::string& e : ds.excludes()) s += "exclude:" + e + ";";
  return hex64(fnv1a(s));
}

std::string file_fingerprint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VLM_CHECK(in, "cannot read '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return hex64(fnv1a(ss.str()));
}

Sources open_sources(const LoaderConfig& cfg) {
  Sources out;
  auto open = [&](const std::string& path, const EnergonOpenOptions& opt) {
    try {
      return std::make_shared<const EnergonDataset>(EnergonDataset::open(path, opt));
    } catch (const vlm::Error& e) {
      VLM_FAIL("data loader: cannot open dataset '", path, "': ", e.what());
    }
  };
  auto add_leaf = [&](std::shared_ptr<const EnergonDataset> ds, const std::string& split,
                      const DatasetSubset& subset, const std::string& what) {
    Leaf leaf;
    leaf.dataset = std::move(ds);
    leaf.split = split;
    const EnergonDataset::Split* sp = nullptr;
    try {
      sp = &leaf.dataset->split(split);
    } catch (const vlm::Error& e) {
      VLM_FAIL("data loader: dataset '", leaf.dataset->root(), "': ", e.what());
    }
    for (const ShardInfo& sh : sp->shards) leaf.shard_counts.push_back(sh.count);
    std::tie(leaf.start, leaf.end) = subset.apply(sp->num_samples, what);
    out.leaves.push_back(std::move(leaf));
  };

  if (is_metadataset_path(cfg.dataset)) {
    ResolvedSplit rs = resolve_metadataset(cfg.dataset, cfg.split);
    out.blend = rs.mode;
    for (const MetadatasetLeaf& ml : rs.leaves) {
      VLM_CHECK(ml.shuffle_over_epochs && *ml.shuffle_over_epochs == 1, "data loader: ", ml.source,
                ": shuffle_over_epochs_multiplier other than 1 is not supported by this loader");
      EnergonOpenOptions opt;
      opt.dataset_config = ml.dataset_config;
      opt.split_config = ml.split_config;
      add_leaf(open(ml.path, opt), ml.split, ml.subset, ml.source);
      Leaf& leaf = out.leaves.back();
      leaf.weight = ml.weight;
      leaf.repetitions = ml.repetitions;
      if (!ml.subflavors.empty())
        leaf.subflavors = merge_subflavors(leaf.dataset->subflavors(), ml.subflavors);
    }
  } else {
    VLM_CHECK(fs::is_directory(cfg.dataset), "data loader: dataset '", cfg.dataset,
              "' is neither a prepared dataset folder nor a metadataset .yaml file");
    add_leaf(open(cfg.dataset, {}), cfg.split, DatasetSubset{}, cfg.dataset);
  }
  VLM_CHECK(!out.leaves.empty(), "data loader: '", cfg.dataset, "' has no datasets for split '",
            cfg.split, "'");
  return out;
}

Tokenizer load_tokenizer(const std::string& path) {
  try {
    return Tokenizer::from_file(path);
  } catch (const vlm::Error& e) {
    VLM_FAIL("data loader: cannot load the tokenizer '", path, "': ", e.what());
  }
}

void check_token_ids(const PackingConfig& p, const Tokenizer& tok) {
  auto check = [&](const char* field, int32_t id, const char* token) {
    auto found = tok.find_token(token);
    VLM_CHECK(found && *found == id, "data loader: packing.", field, " is ", id,
              " but the tokenizer '", tok.path(), "' has ", token, " = ",
              found ? std::to_string(*found) : "(none)");
  };
  check("image_token_id", p.image_token_id, "<|image_pad|>");
  check("vision_start_id", p.vision_start_id, "<|vision_start|>");
  check("vision_end_id", p.vision_end_id, "<|vision_end|>");
  VLM_CHECK(p.pad_id >= 0 && p.pad_id < tok.vocab_size(), "data loader: packing.pad_id ", p.pad_id,
            " is outside the tokenizer's vocabulary of ", tok.vocab_size());
}

} // namespace vlm::io
