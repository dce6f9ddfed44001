// Vocabulary-parallel embedding and LM-head cross-entropy for tensor parallelism (Megatron style,
// DESIGN.md §6, issue 35): the [V, H] embedding / LM-head weight is split by rows over the ranks
// of a tensor-parallel group, rank r holding rows [vocab_begin, vocab_begin + V / tp) (the caller
// picks the split; V = rows * tp.size()). Activations are replicated: every rank of the group
// passes the same ids / hidden states / labels and gets the same result, so neither function
// ever gathers the weight or the [N, V] logits.
//
// Both are differentiable in the weight shard (a plain leaf or an FSDP-gathered one); a shard used
// by both (tied embeddings) gets the sum of both gradients. The group must outlive the backward
// pass. Every rank of the group must call them in the same order (they run collectives, in the
// forward and in the backward).
#pragma once

#include <cstdint>

#include "parallel/comm/process_group.h"
#include "src/core/ops/loss.h"
#include "src/core/tensor.h"

namespace vlm::parallel {

// The full lookup embedding(full_weight, ids) -> [*ids.shape, H] on every rank: ids (any shape,
// i32/i64, over the whole vocabulary) are looked up in the local rows, other ids give zeros, and
// the parts are summed over tp. The backward is the identity for that sum (every rank's loss is a
// replica of the same loss), so the shard's gradient holds its own rows' contributions only.
// Device-generic (existing ops plus the all-reduce); the vocabulary must be below 2^24 (ids are
// shifted in f32).
Tensor vocab_parallel_embedding(const Tensor& weight_shard, const Tensor& ids, int64_t vocab_begin,
                                ProcessGroup& tp);

// The value and gradients of linear_cross_entropy(x, full_weight, labels, ignore_index,
// reduction) (src/core/ops/loss.h) without gathering the logits: x [N, H] replicated, labels [N]
// global ids, weight_shard [V / tp, H]. It is the core loss itself on the shard, with the group's
// all-reduces as its VocabSplit: the local rows are processed vocab_chunk at a time (0: all at
// once) into per-row running max / sum-exp in f32 (f64 for f64), combined over tp (all-reduce max,
// then [sum-exp; target logit] summed); the backward gives the shard its rows' gradient and x the
// sum over tp of every rank's part (all-reduce, before rounding). Returns the same 0-dim loss (f32;
// f64 for f64) on every rank. Same dtype / device rules as linear_cross_entropy; on CUDA nothing
// synchronizes and a label outside [0, V) is reported at the next synchronization (on the CPU it
// is thrown at once, before any collective).
Tensor vocab_parallel_cross_entropy(const Tensor& x, const Tensor& weight_shard,
                                    const Tensor& labels, int64_t vocab_begin, ProcessGroup& tp,
                                    int64_t ignore_index = -100,
                                    Reduction reduction = Reduction::mean,
                                    int64_t vocab_chunk = 8192);

} // namespace vlm::parallel
