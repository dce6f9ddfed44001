// Energon MetadatasetV2 YAML resolved into a flat list of leaf datasets (docs/energon-format.md
// §3; semantics checked against megatron/energon/metadataset/metadataset_v2.py):
//
//   __module__: megatron.energon
//   __class__: MetadatasetV2
//   splits:
//     train:
//       blend:                       # or blend_epochized: [{repetitions: 2, path: ...}, ...]
//       - {weight: 3, path: ./dsA, subflavors: {type_dataset: synth}}
//       - {weight: 1, path: ./nested.yaml, subset: {range: [0%, 50%]}}
//     val:
//       path: ./dsA
//
// Rules:
// - `path` is relative to the folder of the YAML that names it; a path to a .yaml file is a
//   nested metadataset, whose split `split_part` (or the inherited split name) is used.
// - blend weights are normalised per level (w / sum w) and multiplied down nesting;
//   blend_epochized repetitions multiply down nesting. The two cannot be mixed in one tree.
// - subflavors: outer levels override inner ones key by key ({**inner, **outer}); the
//   dataset's own dataset.yaml subflavors are the innermost (merge_subflavors).
// - subset {range: [a, b]}: ints (plus `end`) are absolute sample indices, allowed only on a
//   reference to a dataset folder; "N%" strings are relative. At each level the outer relative
//   range is applied within the inner one; the absolute range is applied first (apply()).
// - shuffle_over_epochs_multiplier: null anywhere -> no shuffling, else -1 anywhere -> with
//   replacement, else the product.
// - `aux` and `join` (need index.sqlite / Python joiners) and legacy V1 `Metadataset` are
//   refused with a clear error. Unknown keys are errors. Every error names the YAML file and
//   the key path (for example `splits.train.blend[1].weight`).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace vlm::io {

enum class BlendMode {
  none,        // a single dataset reference: no blending
  weights,     // blend: sample sources drawn with probability = weight
  repetitions, // blend_epochized: each leaf repeated `repetitions` times per meta-epoch
};
const char* blend_mode_name(BlendMode mode);

// energon's DatasetSubset: an optional absolute range, then a relative range within it.
struct DatasetSubset {
  std::optional<int64_t> abs_start;      // absolute range [abs_start, abs_end)
  std::optional<int64_t> abs_end;        // nullopt with abs_start set: `end`
  double rel_start = 0.0, rel_end = 1.0; // fractions of what the absolute range left
  bool has_absolute() const { return abs_start.has_value(); }
  bool is_everything() const { return !abs_start && rel_start == 0.0 && rel_end == 1.0; }
  // [start, end) of a split with `total` samples; throws vlm::Error (naming `what`) when the
  // absolute range does not fit, as energon's compute_subset asserts.
  std::pair<int64_t, int64_t> apply(int64_t total, const std::string& what = "") const;
};

struct MetadatasetLeaf {
  std::string path;    // dataset folder, resolved against the naming YAML and lexically normalised
  std::string split;   // split of that dataset to read (split_part, or the requested split)
  double weight = 1.0; // BlendMode::weights: normalised product down the tree (sums to 1)
  double repetitions = 1.0;                      // BlendMode::repetitions: product down the tree
  std::map<std::string, std::string> subflavors; // from the metadataset levels only
  DatasetSubset subset;
  std::optional<int64_t> shuffle_over_epochs = 1; // nullopt: no shuffling; -1: with replacement
  std::string dataset_config = "dataset.yaml";
  std::string split_config = "split.yaml";
  std::string source; // "<yaml file>: splits.train.blend[1]", for messages
};

struct ResolvedSplit {
  BlendMode mode = BlendMode::none;
  std::vector<MetadatasetLeaf> leaves; // in YAML order, depth first
};

// Resolves `path` (a MetadatasetV2 .yaml, or a prepared dataset folder = one leaf) for `split`.
// Checks that every leaf path is a prepared dataset (.nv-meta/.info.json or .info.yaml) but does
// not open it. Throws vlm::Error naming the YAML file and key on any problem, including a split
// the metadataset does not define (listing the ones it does).
ResolvedSplit resolve_metadataset(const std::string& path, const std::string& split);

// {**inner, **outer}: the subflavors a sample ends up with, e.g.
// merge_subflavors(dataset.subflavors(), leaf.subflavors).
std::map<std::string, std::string>
merge_subflavors(const std::map<std::string, std::string>& inner,
                 const std::map<std::string, std::string>& outer);

} // namespace vlm::io
