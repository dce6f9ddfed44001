// Fully sharded data parallelism with FSDP2 semantics (DESIGN.md §6), applied to a model from
// outside: the model calls no collective and never knows.
//
// Sharding. Every trainable parameter is split on dim 0 into dp_shard equal blocks of
// ceil(rows / dp_shard) rows (the last ones padded with zero rows); rank r keeps block r. A unit's
// shards live in one flat buffer (its "flat shard"), and each shard is a leaf tensor viewing it:
// those leaves are the parameters the optimizer sees (named by their HF names; padding rows get
// zero gradients, so AdamW keeps them zero). Frozen parameters (requires_grad false) stay whole
// on every rank and are never communicated.
//
// Units. Each of `blocks` (decoder layers, vision blocks) is one unit; the root unit is every
// other trainable parameter (embeddings, final norm, head, patch embedding, mergers), except that
// a root parameter with a quarter of the root's elements or more (the embedding, an untied head)
// is a root unit of its own: a unit of one parameter is all-gathered straight into its whole
// buffer and reduce-scattered straight from its gradient, so a 150k-token embedding never needs
// a second whole-size staging buffer. Root units stay whole from the start of a micro-step until
// their backward ends.
//
// One micro-step, as the training step drives it (begin_micro_step ... backward ...
// end_micro_step):
//   forward   the root units are all-gathered first and stay whole until their backward ends; each
//             block unit is all-gathered by a forward wrapper (nn::Module::call) — prefetched
//             while the previous block computes — its parameters swapped in by replace_parameter
//             as the outputs of a "gather" autograd node, and resharded after the block
//             (reshard_after_forward; the memory is released and the shards swapped back; the
//             last block stays whole, its backward comes next);
//   backward  an identity node on the block's outputs runs first and all-gathers the unit again
//             into the same memory (prefetching the block before it); the gather node runs once
//             every gradient of the unit's parameters has arrived: it packs them into
//             [rank][shard] order in reduce_dtype and starts the reduce-scatter (the previous
//             unit's is finished first, so at most one is in flight), then reshards the unit.
//             A bf16 unit's weight gradients (linear, matmul, embedding, the fused lm_head loss)
//             do not arrive as bf16 tensors: the ops write them in fp32 straight from the GEMM
//             into the unit's f32 gradient buffer (autograd's accumulate_weight_grad, as for an
//             unsharded bf16 parameter's f32 .grad) — the flat gradient with one rank, else a
//             whole-gradient buffer that is packed from — so no micro-batch's gradient is
//             rounded to bf16 before the reduction (which rounds once with a bf16 reduce_dtype);
//             an f32 unit of one parameter takes them the same way, so a tied embedding's two
//             gradients (the head's, the lookup's) add up in one whole-size buffer;
//   end       every reduction is finished and added into the units' flat gradient (fp32; f64
//             for f64 models), which is the .grad of the shard leaves; on the last micro-step of
//             a step, replicas (dp_replicate > 1: HSDP, or DDP when dp_shard = 1) all-reduce it.
// With reduce_every_micro_step = false, the non-final micro-steps only add their gradients into
// that whole fp32 gradient buffer (no communication; memory of a whole gradient), reduced once on
// the last micro-step. Activation checkpointing (applied before FSDP) recomputes inside the unit's
// backward, after the identity node gathered it, so the two compose.
//
// Every rank runs every unit's collectives every micro-step in the same order: the model must run
// every block in every forward and every unit must reach the loss (Qwen3-VL runs its vision tower
// on a blank image for a text-only batch). A unit that got no gradient in a micro-step is an
// error naming it (a rank that skipped it would hang the others; the watchdog ends that too).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "src/nn/module.h"

namespace vlm::parallel {

struct FsdpOptions {
  bool reshard_after_forward = true;
  // Gradients travel in this dtype (f32 or bf16; an f64 model reduces in f64).
  DType reduce_dtype = DType::f32;
  // false: accumulate whole gradients locally and reduce only on a step's last micro-step.
  bool reduce_every_micro_step = true;
  // All-gather the next unit while the current one computes.
  bool prefetch = true;
};

// Bytes this rank holds, and what one process would hold for the same model.
struct FsdpMemory {
  int64_t param_bytes = 0;      // shards (padding included) and frozen parameters
  int64_t grad_bytes = 0;       // flat gradient buffers (and unsharded accumulation buffers)
  int64_t full_param_bytes = 0; // every parameter whole
  int64_t full_grad_bytes = 0;  // a gradient for every trainable parameter, in the same dtype
  int64_t trainable_elements = 0, shard_elements = 0; // whole and on this rank (padding included)
};

// Where a rank's shard of a trainable parameter sits in the whole tensor (checkpoints hold whole
// tensors): rows [row_begin, row_begin + rows) of dim 0 are the first `rows` rows of the shard
// leaf (the rest is padding). `writes`: this rank saves them (false on HSDP/DDP replicas other
// than the first, which hold the same rows).
struct ShardRows {
  Shape full_shape;
  int64_t row_begin = 0, rows = 0;
  bool writes = true;
};

class Fsdp {
public:
  // Shards the trainable parameters of `root` (materialized, the same values on every rank, on
  // any device) over `shard_group` into flat buffers on `device`; `replicate_group` (null or size
  // 1: none) holds replicas of the shards. `blocks` are descendants of root, in forward order.
  Fsdp(nn::Module& root, const std::vector<nn::Module*>& blocks, ProcessGroup& shard_group,
       ProcessGroup* replicate_group, const FsdpOptions& options, Device device);
  ~Fsdp(); // removes the wrappers; parameters stay sharded
  Fsdp(const Fsdp&) = delete;
  Fsdp& operator=(const Fsdp&) = delete;

  // Around each forward (+ backward) of a micro-batch. `first`: the step's first micro-step (the
  // gradient shards start from zero); `last`: its last (gradients are reduced to their final
  // values). A forward without backward (evaluation) uses the same calls.
  void begin_micro_step(bool first, bool last);
  void end_micro_step();

  // Every parameter whole on every rank, as plain tensors (no autograd), for saving, export and
  // generation; reshard() returns to the sharded state (collective: every rank calls both).
  void unshard_all();
  void reshard_all();

  ProcessGroup& shard_group() const;
  // Every trainable (sharded) parameter by HF name; frozen parameters are whole and not listed.
  std::map<std::string, ShardRows> shard_rows() const;
  FsdpMemory memory() const;
  // "root (5 parameters, 1.2 MiB)", "model.layers.0 (11 parameters, ...)", in order.
  std::vector<std::string> describe_units() const;

  struct Impl;

private:
  std::shared_ptr<Impl> impl_;
};

} // namespace vlm::parallel
