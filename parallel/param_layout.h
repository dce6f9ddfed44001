// Where a rank's part of each parameter sits in the global tensor, with tensor parallelism and
// FSDP composed (DESIGN.md §7: a checkpoint holds every global tensor whole; each rank writes and
// reads its own boxes of it, so a state saved on any (dp_replicate, dp_shard, tp) layout loads
// into any other). TP splits a dimension into ranges (parallel/tp/tensor_parallel.h: rows of q/k/v,
// columns of o_proj, row segments of GDN's fused in_proj_qkv); FSDP then shards the rank's TP
// part by dim-0 rows (parallel/fsdp/fsdp.h ShardRows). A rank's part is a few boxes:
//   * TP on dim 0: the FSDP rows cut by the TP ranges, one box per range they meet;
//   * TP on dim d > 0: the FSDP rows × each TP range on dim d;
//   * no TP: the FSDP rows.
// Each box maps a region of the rank's local tensor (the FSDP shard leaf, or the TP part) to the
// global tensor; replicas (HSDP / DDP copies, TP-replicated weights, KV heads shared by several
// TP ranks) hold the same boxes, and only the first of them writes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/fsdp/fsdp.h"
#include "parallel/tp/tensor_parallel.h"

namespace vlm::parallel {

struct ParamBox {
  std::vector<int64_t> global_offset; // in the global tensor
  std::vector<int64_t> local_offset;  // in the rank's tensor
  Shape shape;
};

struct ParamLayout {
  Shape full_shape;
  std::vector<ParamBox> boxes;
  bool writes = true; // this rank saves its boxes (false on every replica but the first)
};

// The layout of `name` in `layouts` (either may be absent: null).
const ParamLayout* find_layout(const std::map<std::string, ParamLayout>* layouts,
                               const std::string& name);

// Views of a box: in the rank's tensor, and in the global tensor.
Tensor local_box(const Tensor& local, const ParamBox& box);
Tensor global_box(const Tensor& whole, const ParamBox& box);

// Copies what `layout` holds of the whole tensor's rows [row_begin, row_begin + rows.size(0))
// — `rows`, a chunk of the whole tensor (any device, any dtype) — into `local`, this rank's
// tensor (converting to its dtype).
void keep_rows(const ParamLayout& layout, Tensor& local, int64_t row_begin, const Tensor& rows);

// Rows [row_begin, row_end) (dim 0) of `name`'s whole tensor at rank `root` of `world`, in host
// memory and `local`'s dtype, put together from the parts of those rows each rank writes
// (`layout`; null: the parameter is whole on every rank, and root copies its own rows; a 0-d one
// whole). Collective over `world` (every rank calls it, for the same rows of the same parameters
// in the same order); the other ranks get an undefined tensor. No rank holds more than the block
// and its own parts: an HF snapshot of a sharded model is written block by block (src/train).
Tensor gather_param_rows(const std::string& name, const Tensor& local, const ParamLayout* layout,
                         ProcessGroup& world, int root, int64_t row_begin, int64_t row_end);

// The part of `box` in rows [row_begin, row_end) of the whole tensor, its global offset counted
// from row_begin; none when the box has no row there.
std::optional<ParamBox> box_rows(const ParamBox& box, int64_t row_begin, int64_t row_end);

// For nn::Module::initialize: each parameter of `layouts` initialized as a whole tensor whose
// rows keep_rows places (the others are initialized as they are). `layouts` must outlive it.
nn::Module::PartOf init_parts(const std::map<std::string, ParamLayout>& layouts);

// Every parameter that is not whole on this rank (FSDP-sharded or TP-split), by name; either may
// be null. TP-replicated parameters that FSDP shards are listed too (only TP rank 0 writes them).
std::map<std::string, ParamLayout> param_layouts(const Fsdp* fsdp, const TensorParallel* tp);

} // namespace vlm::parallel
