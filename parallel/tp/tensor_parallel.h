// Tensor parallelism (Megatron; DESIGN.md §6), applied from outside to a materialized model whose
// values are the same on every rank of the tensor-parallel group. A family's plan (TpPlan, from
// its ModelSpec) names what to split:
//   * column-parallel projections (q/k/v, gate/up, GDN's input projections): the weight's rows
//     (and the bias) split by heads; the input enters the parallel region (copy_to_tp: its
//     gradient is summed over the group in backward) once per input tensor — q, k and v share one
//     entry, so one all-reduce per attention and per MLP in backward, as with a fused QKV;
//   * row-parallel projections (o, down, GDN's out_proj): the weight's columns split the same
//     way; the partial products are summed over the group (reduce_from_tp) before the bias;
//   * the vocabulary-parallel embedding (parallel/tp/vocab_parallel.h), whose rows are also the
//   head
//     of a tied model; an untied head's rows split the same way; the loss is then loss-parallel
//     (model/lm_loss.h with LossOptions::vocab_split = loss_split()): no rank holds all logits;
//   * bare parameters split like their projection (GDN's conv channels, A_log, dt_bias);
//   * replicated weights applied to a rank's heads only (q/k norms, GDN's gated norm): their
//     gradients are partial sums, summed over the group after backward (reduce_grads). Megatron
//     left the gated norm's partial (Megatron-LM #7452); here every such weight is listed in the
//     plan.
// The collectives are Module wrappers on the Linear / Embedding modules: the model's code does not
// change and derives its head counts from the local weight shapes.
//
// Sequence parallelism (by option, Megatron's SP) splits the token rows between the parallel
// regions of the plan's sequence region (the text stack's layers, run as one call whose inputs are
// all [T, ...] rows: the residual stream and DeepStack's addends) over the group: the region's
// inputs enter as each rank's block of rows (split_rows), a column-parallel projection inside
// all-gathers its input (backward: reduce-scatter) and a row-parallel one reduce-scatters its
// partial sums (backward: all-gather) — the same bytes as the all-reduces they replace — and the
// region's output is gathered whole for the final norm and the head. Norms, residual adds and the
// rows' activations between the regions are then 1/tp of the replicated ones; the replicated
// weights inside the region (the layer norms, a row-parallel bias) see only the rank's rows, so
// their gradients are partial sums too (reduce_grads). The embedding's all-reduce stays (the image
// features are merged into whole rows).
//
// Heads split in units: a segment of `size` rows holds `parts` equal units (heads; single rows
// for MLPs). With parts ≥ tp, rank r takes units [r·parts/tp, (r+1)·parts/tp) (parts % tp == 0);
// with parts < tp (more ranks than KV heads), tp/parts consecutive ranks share unit
// ⌊r·parts/tp⌋ — replicated, their gradients summed over those ranks. A fused projection of
// several segments (GDN's in_proj_qkv: q | k | v) is split per segment, so each rank's q, k and v
// rows stay matched (Megatron PR #1989 split it as one block and scrambled them).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/process_group.h"
#include "src/core/ops/loss.h"
#include "src/nn/module.h"

namespace vlm::nn {
class Embedding;
class Linear;
} // namespace vlm::nn

namespace vlm::parallel {

struct TpSegment {
  int64_t size = 0;  // rows (or columns) of the global dimension
  int64_t parts = 0; // equal units in them (heads)
};

enum class TpStyle : uint8_t { colwise, rowwise, vocab };

struct TpPlan {
  struct Module {
    std::string path; // a Linear (colwise, rowwise) or an Embedding (vocab)
    TpStyle style;
    std::vector<TpSegment> segments; // colwise: output rows; rowwise: input columns; vocab: none
    // Left whole (replicated) when its units do not split evenly over tp, instead of an error: a
    // part worth splitting but not needed split (a vision tower with fewer heads than ranks).
    // A colwise / rowwise pair must share its units, so both stay whole together.
    bool optional = false;
  };
  struct Param {
    std::string name; // a parameter used outside a Linear, split on `dim` like its projection
    int64_t dim = 0;
    std::vector<TpSegment> segments;
  };
  std::vector<Module> modules;
  std::vector<Param> params;
  std::vector<std::string> partial_grads; // replicated weights whose gradients sum over TP
  std::string head;                       // an untied LM head's weight, vocab-split; "" if tied
  // The module whose call() runs the layers of the text stack (inputs: [T, ...] rows; output: the
  // residual stream [T, H]): split by rows under sequence parallelism. "" : none.
  std::string sequence_region;

  void colwise(const std::string& path, std::vector<TpSegment> segments) {
    modules.push_back({path, TpStyle::colwise, std::move(segments)});
  }
  void rowwise(const std::string& path, std::vector<TpSegment> segments) {
    modules.push_back({path, TpStyle::rowwise, std::move(segments)});
  }
  void colwise_optional(const std::string& path, std::vector<TpSegment> segments) {
    modules.push_back({path, TpStyle::colwise, std::move(segments), true});
  }
  void rowwise_optional(const std::string& path, std::vector<TpSegment> segments) {
    modules.push_back({path, TpStyle::rowwise, std::move(segments), true});
  }
  void vocab(const std::string& path) { modules.push_back({path, TpStyle::vocab, {}}); }
  void split(const std::string& name, int64_t dim, std::vector<TpSegment> segments) {
    params.push_back({name, dim, std::move(segments)});
  }
};

// Where a rank's part of a parameter sits in the global tensor (checkpoints, export, the grad
// norm). Replicated parameters: dim = -1, the whole tensor, replicas = the group size.
struct TpPlacement {
  Shape global_shape;
  int64_t dim = -1;
  // [begin, begin + length) along dim, in the order they are concatenated locally.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t replicas = 1;      // ranks holding these same values (including this one)
  bool partial_grad = false; // the gradient is summed over the group after backward
  bool sharded() const { return dim >= 0; }
};

class TensorParallel {
public:
  // Splits `root`'s parameters by `plan` over `tp` (replace_parameter: each rank keeps its part)
  // and attaches the collectives. Every rank of `tp` calls it with the same model and plan.
  // With sequence_parallel, the plan's sequence region is also split by rows (the plan must name
  // one).
  TensorParallel(nn::Module& root, const TpPlan& plan, ProcessGroup& tp,
                 bool sequence_parallel = false);
  ~TensorParallel(); // removes the wrappers; the parameters stay split
  TensorParallel(const TensorParallel&) = delete;
  TensorParallel& operator=(const TensorParallel&) = delete;

  ProcessGroup& group() const { return *tp_; }
  // Every parameter of the root by full name (replicated ones included).
  const TpPlacement& placement(const std::string& name) const;
  const std::map<std::string, TpPlacement>& placements() const { return placements_; }
  // Whether the LM head's rows are split (the loss must then be loss-parallel), and the split as
  // the core loss takes it (this rank's rows of the vocabulary; the group's all-reduces combine).
  bool vocab_parallel_head() const { return vocab_parallel_head_; }
  const VocabSplit& loss_split() const { return loss_split_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  // The optional modules of the plan left whole (their units do not split over the group).
  const std::vector<std::string>& left_whole() const { return left_whole_; }

  // After the step's last backward: sums the partial gradients over the group (partial_grad
  // weights over all of it, replicated heads over their replicas). Reads the current parameter
  // of each name from `root`, so it works on FSDP's shards too (a sum of shards is the shard of
  // the sum).
  void reduce_grads(const nn::Module& root) const;

  // Every split parameter whole on every rank (plain tensors; the collectives step aside), for an
  // HF snapshot, export and generation; split_all() puts each rank's parts back. Collective:
  // every rank calls both. Under FSDP: Fsdp::unshard_all() first, reshard_all() after split_all().
  void gather_all();
  void split_all();
  bool gathered() const;

  struct State;

private:
  // The construction, one step of the plan each: `split` records a parameter's placement and
  // keeps this rank's part; each style splits its module's parameters and attaches its
  // collectives (rows_split: inside the sequence region).
  void split(const std::string& name, int64_t dim, const std::vector<TpSegment>& segments);
  void apply_style(const TpPlan::Module& m, bool rows_split);
  void vocab_parallel(nn::Embedding& emb, const std::string& prefix);
  void colwise_parallel(nn::Linear& lin, const std::string& prefix,
                        const std::vector<TpSegment>& segments, bool rows_split);
  void rowwise_parallel(nn::Linear& lin, const std::string& prefix,
                        const std::vector<TpSegment>& segments, bool rows_split);
  void split_head(const std::string& head);
  void mark_partial_grad(const std::string& name);
  void split_sequence_region(const std::string& path);
  ProcessGroup& replica_group(int64_t replicas);

  nn::Module* root_;
  ProcessGroup* tp_;
  const std::set<std::string>* declared_only_ = nullptr; // while constructing: not allocated
  std::map<std::string, TpPlacement> placements_;
  std::map<int64_t, std::unique_ptr<ProcessGroup>> replica_groups_; // by replicas, 1 < r < tp
  std::vector<std::pair<nn::Module*, size_t>> wrappers_;
  std::shared_ptr<State> state_;        // shared with the wrappers
  std::vector<std::string> left_whole_; // optional modules whose units do not split
  std::map<std::string, Tensor> parts_; // while gathered: each split parameter's part
  bool vocab_parallel_head_ = false;
  VocabSplit loss_split_; // set with vocab_parallel_head_
  bool sequence_parallel_ = false;
};

} // namespace vlm::parallel
