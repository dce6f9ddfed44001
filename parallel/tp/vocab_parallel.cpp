#include "parallel/tp/vocab_parallel.h"

#include <memory>
#include <vector>

#include "src/base/check.h"
#include "src/core/autograd.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/index.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::parallel {

namespace {

// --- embedding -------------------------------------------------------------------------------

// Sums the ranks' partial lookups in the forward; the identity in the backward (each rank's loss
// is a replica, so each rank's own rows get exactly their gradient).
struct VocabParallelAllReduceBackward final : Node {
  const char* name() const override { return "VocabParallelAllReduceBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& g) override { return {g[0]}; }
};

// Ids are shifted and masked in f32 (cast() goes through f32 on CUDA): exact below 2^24.
constexpr int64_t kMaxExactVocab = int64_t(1) << 24;

} // namespace

Tensor vocab_parallel_embedding(const Tensor& weight_shard, const Tensor& ids, int64_t vocab_begin,
                                ProcessGroup& tp) {
  const char* op = "vocab_parallel_embedding";
  VLM_CHECK(weight_shard.defined() && weight_shard.dim() == 2 && weight_shard.size(0) > 0, op,
            ": weight_shard must be [V / tp, H], got ", describe("weight_shard", weight_shard));
  VLM_CHECK(ids.defined() && (ids.dtype() == DType::i32 || ids.dtype() == DType::i64), op,
            ": ids must be i32 or i64, got ", describe("ids", ids));
  VLM_CHECK(ids.device() == weight_shard.device(), op, ": ids ", ids.desc(), " and weight_shard ",
            weight_shard.desc(), " are on different devices");
  const int64_t rows = weight_shard.size(0), vocab = rows * tp.size();
  VLM_CHECK(vocab_begin >= 0 && vocab_begin + rows <= vocab, op, ": rows [", vocab_begin, ", ",
            vocab_begin + rows, ") of ", describe("weight_shard", weight_shard),
            " are outside the vocabulary [0, ", vocab, ") of group ", tp.name());
  VLM_CHECK(vocab < kMaxExactVocab, op, ": vocabulary ", vocab, " must be below 2^24");
  const Device device = weight_shard.device();

  // owned[v] = 1 for the local ids, 0 for the others (no history): looking ids up in it gives
  // the mask without comparison ops, and the lookup checks every id is in [0, V).
  Tensor owned = Tensor::zeros({vocab, 1}, DType::f32, device);
  Tensor local_rows = slice(owned, 0, vocab_begin, vocab_begin + rows);
  fill_(local_rows, 1.0);
  Tensor mask = embedding(owned, ids); // [*ids.shape, 1]
  // Local row of an owned id, 0 (any valid row: the mask zeroes it) for the others.
  Tensor local_ids = cast(
      mul(affine(cast(ids, DType::f32), 1.0, -double(vocab_begin)), reshape(mask, ids.shape())),
      DType::i64);

  // The masked lookup keeps its history (embedding, then the mask product), so the gradient of a
  // foreign id adds zeros to row 0 and the owned ids' gradients reach their rows.
  Tensor partial = mul(embedding(weight_shard, local_ids), cast(mask, weight_shard.dtype()));
  Tensor out = partial.detach(); // the product is a fresh tensor nothing saved: sum in place
  tp.all_reduce(out, ReduceOp::sum);
  if (needs_grad({&partial}))
    record(std::make_shared<VocabParallelAllReduceBackward>(), {&partial}, {&out});
  return out;
}

// --- cross-entropy ---------------------------------------------------------------------------

Tensor vocab_parallel_cross_entropy(const Tensor& x, const Tensor& weight_shard,
                                    const Tensor& labels, int64_t vocab_begin, ProcessGroup& tp,
                                    int64_t ignore_index, Reduction reduction,
                                    int64_t vocab_chunk) {
  const char* op = "vocab_parallel_cross_entropy";
  VLM_CHECK(weight_shard.defined() && weight_shard.dim() == 2 && weight_shard.size(0) > 0, op,
            ": weight_shard must be [V / tp, H], got ", describe("weight_shard", weight_shard));
  VLM_CHECK(vocab_chunk >= 0, op, ": vocab_chunk must be >= 0 (0: no chunking), got ", vocab_chunk);
  const int64_t rows = weight_shard.size(0);
  // The core loss's chunked LM head with the group's all-reduces as its combine functions.
  VocabSplit split;
  split.vocab_begin = vocab_begin;
  split.vocab = rows * tp.size();
  split.sum = [&tp](const Tensor& t) { tp.all_reduce(t, ReduceOp::sum); };
  split.max = [&tp](const Tensor& t) { tp.all_reduce(t, ReduceOp::max); };
  return linear_cross_entropy(x, weight_shard, labels, ignore_index, reduction,
                              vocab_chunk > 0 ? vocab_chunk : rows, &split);
}

} // namespace vlm::parallel
