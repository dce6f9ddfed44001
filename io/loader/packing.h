// Sequence packing: tokenized samples (documents) → rows of exactly seq_len tokens with
// cu_seqlens, per-document (M)RoPE position ids and the images' pixels. One row is one
// micro-step's input per data-parallel rank, as in the reference trainer (reference-trainer.md
// §3.5–3.6), with its packing bugs fixed (energon-format.md §5.3, reference §9 #18).
//
// Conventions of a PackedRow (what model and loss rely on):
//   * Labels are HF-aligned: labels[t] is the target of input_ids[t] itself (-100 = ignored), and
//     the loss shifts (position t is scored against labels[t + 1]); next_token_targets() makes the
//     shifted vector for a loss that does not shift. Because the shift runs across the whole row,
//     the packer sets labels = -100 on the FIRST token of every document: that label would
//     otherwise train the previous document's last position to predict the next document's start
//     (qwen-models.md §1.2 item 7; HF's DataCollatorWithFlattening does the same). The chat-label
//     stage hands over labels in this same aligned form (the reference does not shift either).
//   * The row length is always seq_len. The remainder after the documents is padding: pad_id,
//     label -100, and it forms ONE trailing pseudo-document in cu_seqlens, so cu_seqlens always
//     partitions [0, seq_len) (cu_seqlens[0] = 0, cu_seqlens.back() = seq_len). Why: the
//     attention / GDN kernels and ops::attention require cu_seqlens.back() == T (static shapes),
//     every row of every activation is then computed from finite values (pad rows left out of
//     cu_seqlens would hold garbage that reaches weight gradients through 0·NaN), and the pad
//     segment is isolated: real documents never attend to it or inherit its GDN state. Its cost
//     is attention over the pad tail only. num_docs counts the real documents; the pad segment
//     exists iff pad_tokens > 0.
//   * position_ids restart at 0 for every document (and the pad segment): [T] for RoPE, or
//     [3·T] as three planes t | h | w for MRoPE (mrope = true), computed as transformers'
//     get_rope_index does for each document alone (io/loader/position_ids.h).
//   * pixel_values / image_grid_thw are the documents' images concatenated in row order.
//
// Overlong samples (length > seq_len) are truncated or dropped (OverlongPolicy), never allowed to
// lengthen a row (the reference lets them, breaking static shapes). Truncation never splits an
// image: when the cut falls inside <|vision_start|> <|image_pad|>… <|vision_end|> (or inside a
// bare placeholder run), the cut moves to just before that image, and the pixels and grids of
// the images cut off are dropped. A sample left without any trainable label (labels all -100,
// e.g. after truncation removed the answer) is dropped: it would cost compute and train nothing.
//
// Online packing (OnlinePacker): a buffer of up to buffer_size samples in arrival order. When it
// is full (or the source is finished), one row is emitted, and it always holds the OLDEST
// buffered sample, so no sample waits more than buffer_size rows and the data order keeps no
// length bias. Its partners are the fuller of two candidates (ties: the first): (a) the oldest
// sample's bin in a best-fit-decreasing packing of the whole buffer; (b) the oldest sample plus
// first-fit-decreasing of the buffer into its remaining room. The others stay and are packed
// again together with the samples that refill the buffer. (Emitting the fullest BFD bin instead
// fills rows about as well but starves hard-to-pack samples: in the 8,000-sample lognormal
// stream of tests/io/loader/test_packing.cpp one waits 1,014 of its 1,015 rows, so long documents
// drift to the end of the epoch.) The next row is a pure function of the buffer's contents in
// arrival order, which is what makes the state small and exact: the list of buffered global
// indices, restored by re-feeding those samples in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/loader/position_ids.h"

namespace vlm::io {

// One tokenized document (sample) ready for packing.
struct TokenizedSample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;         // HF-aligned with input_ids, -100 = ignored
  std::vector<GridTHW> image_grid_thw; // per image, in order of appearance
  // [num_patches, patch_dim] row-major, images in order, t·h·w patch rows per image. May be left
  // empty with num_patches > 0 to defer decoding until the sample's row is chosen (the row's
  // sample_indices and doc_num_images then say which images to decode).
  std::vector<float> pixel_values;
  int64_t num_patches = 0;
  int64_t patch_dim = 0;
  int64_t global_index = -1; // the sample's index in its split, for exact resume

  int64_t length() const { return int64_t(input_ids.size()); }
};

enum class OverlongPolicy { truncate, drop };
const char* overlong_policy_name(OverlongPolicy p);         // "truncate" | "drop"
OverlongPolicy parse_overlong_policy(const std::string& s); // error lists the valid names

// Bounds of the settings that size memory (validate() and the training config name the key):
// a row holds several int32/int64 vectors of seq_len, the online buffer holds whole tokenized
// samples (kilobytes to megabytes each).
constexpr int64_t kMaxSeqLen = int64_t(1) << 24;
constexpr int64_t kMaxPackingBufferSize = 100000;

struct PackingConfig {
  int64_t seq_len = 0;        // tokens per row; in [1, kMaxSeqLen]
  int64_t buffer_size = 1000; // samples the online packer holds before it emits rows
  OverlongPolicy overlong = OverlongPolicy::truncate;
  bool mrope = false; // 3-D position ids (Qwen3-VL / Qwen3.5); else 1-D
  // Token ids; defaults are Qwen3 / Qwen3-VL's (qwen-models.md §5); Qwen3.5 differs.
  int32_t pad_id = 151643;          // <|endoftext|>
  int32_t image_token_id = 151655;  // <|image_pad|>
  int32_t vision_start_id = 151652; // <|vision_start|>
  int32_t vision_end_id = 151653;   // <|vision_end|>
  int64_t spatial_merge_size = 2;

  void validate() const; // throws vlm::Error naming the bad field
};

struct PackedRow {
  std::vector<int32_t> input_ids, labels; // [seq_len]
  std::vector<int32_t> cu_seqlens;        // [num_docs + 1 (+1 with padding)], ends at seq_len
  std::vector<int64_t> position_ids;      // [seq_len] or [3 * seq_len] (planes t, h, w)
  std::vector<float> pixel_values;        // [num_patches, patch_dim]; empty when deferred
  std::vector<GridTHW> image_grid_thw;    // all images of the row, in order
  int64_t num_patches = 0, patch_dim = 0;
  int64_t real_tokens = 0, pad_tokens = 0; // real + pad == seq_len
  int64_t num_docs = 0;
  std::vector<int64_t> sample_indices; // global index of each document, in row order
  std::vector<int32_t> doc_num_images; // images each document kept (after truncation)
};

// Checks a sample's internal consistency: non-empty; labels as long as input_ids, each -100 or
// >= 0; input ids >= 0; image runs vs grids (find_image_runs); num_patches = Σ t·h·w; pixel_values
// empty or num_patches·patch_dim. Returns "" or the reason (for skip-and-count).
std::string check_sample(const TokenizedSample& s, const PackingConfig& cfg);

// What prepare_sample did with a sample.
enum class SampleFate {
  kept,              // unchanged
  truncated,         // cut to fit seq_len (images never split)
  dropped_overlong,  // longer than seq_len under OverlongPolicy::drop
  dropped_no_labels, // no label != -100 (from the start or after truncation)
  invalid,           // check_sample failed
};
const char* sample_fate_name(SampleFate f);
inline bool is_dropped(SampleFate f) { return f != SampleFate::kept && f != SampleFate::truncated; }

struct PrepareResult {
  SampleFate fate = SampleFate::kept;
  std::string reason; // for invalid / dropped: why, for the skip report
};

// Validates and applies the overlong policy in place; a kept or truncated sample then has
// 1 <= length() <= seq_len. The offline length scan runs exactly this too, so online packing,
// the scan and plan replay agree on every sample's length.
PrepareResult prepare_sample(TokenizedSample& s, const PackingConfig& cfg);

// The longest prefix of at most max_len tokens that splits no image (see the header comment).
// Assumes check_sample passed. Exposed for tests.
int64_t image_safe_cut(const TokenizedSample& s, int64_t max_len, const PackingConfig& cfg);

// Best-fit-decreasing: items (lengths, each 1 … capacity) sorted by length descending (ties: lower
// position first) go one by one into the open bin with the least room that still fits (ties: the
// bin opened first), or into a new bin. Returns bins in opening order, each listing item
// positions in insertion order. Deterministic; O(n log n).
std::vector<std::vector<size_t>> best_fit_decreasing(const std::vector<int64_t>& lengths,
                                                     int64_t capacity);

// Packs prepared documents, in the given order, into one row (conventions above). There must be
// at least one and their total length must be <= seq_len; throws vlm::Error otherwise, or when
// some documents carry pixels and other image-bearing ones have them deferred.
PackedRow pack_row(const std::vector<TokenizedSample>& docs, const PackingConfig& cfg);

// targets[t] = labels[t + 1], targets[T - 1] = -100: the HF shift, for a loss that scores
// position t against targets[t] directly. Never crosses a document (first labels are -100).
std::vector<int32_t> next_token_targets(const std::vector<int32_t>& labels);

// Counters of an OnlinePacker (samples by fate, rows, tokens).
struct PackerStats {
  int64_t pushed = 0, kept = 0, truncated = 0;
  int64_t dropped_overlong = 0, dropped_no_labels = 0, invalid = 0;
  int64_t rows = 0, real_tokens = 0, pad_tokens = 0;
  double efficiency() const; // real / (real + pad); 0 before the first row
};

class OnlinePacker {
public:
  explicit OnlinePacker(const PackingConfig& cfg); // validates cfg

  // Prepares the sample (prepare_sample) and buffers it unless it is dropped. The caller reports
  // dropped ones (with its shard/key) and then pops while ready().
  PrepareResult push(TokenizedSample s);
  // A row can be popped: the buffer is full, or finish() was called and the buffer is not empty.
  bool ready() const;
  PackedRow pop(); // requires ready()
  // No more samples will come (end of the source): ready() until the buffer is drained.
  void finish() { finished_ = true; }
  bool finished() const { return finished_; }

  size_t buffered() const { return buf_.size(); }
  // Global indices of the buffered samples in arrival order: the packer's whole state (together
  // with finished()). Saved in checkpoints.
  std::vector<int64_t> buffered_indices() const;
  // Re-feeds the samples named by a saved buffered_indices() (re-read and re-tokenized, in the
  // same order) into this fresh packer; afterwards it emits exactly the rows the saved one would
  // have. Stats are not counted again. Throws if the packer is not empty, an index does not
  // match, or a sample is now dropped (the data or tokenization changed since the save).
  void restore(std::vector<TokenizedSample> samples, const std::vector<int64_t>& saved_indices);

  const PackerStats& stats() const { return stats_; }
  const PackingConfig& config() const { return cfg_; }

private:
  PackingConfig cfg_;
  // Arrival order: positions in it break the ties, so only the relative order matters.
  std::vector<TokenizedSample> buf_;
  bool finished_ = false;
  PackerStats stats_;
};

} // namespace vlm::io
