#include "parallel/param_layout.h"

#include <algorithm>
#include <optional>

#include "src/base/check.h"
#include "src/core/autograd.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::parallel {

namespace {

std::vector<int64_t> zeros_like(const Shape& s) { return std::vector<int64_t>(s.size(), 0); }

// The boxes of FSDP rows [row_begin, row_begin + rows) of the TP part under `p`.
std::vector<ParamBox> boxes_of(const TpPlacement& p, const Shape& part_shape, int64_t row_begin,
                               int64_t rows) {
  std::vector<ParamBox> out;
  if (rows <= 0) return out;
  const Shape& full = p.global_shape;
  if (!p.sharded() || p.dim > 0) {
    // Rows map one to one; each TP range of dim d is a box (no TP: one box, every column).
    const size_t d = size_t(std::max<int64_t>(p.dim, 0));
    const auto ranges =
        p.sharded() ? p.ranges : std::vector<std::pair<int64_t, int64_t>>{{0, part_shape[d]}};
    int64_t local = 0;
    for (const auto& [begin, length] : ranges) {
      ParamBox b{zeros_like(full), zeros_like(full), part_shape};
      b.global_offset[0] = row_begin;
      b.shape[0] = rows;
      if (p.sharded()) {
        b.global_offset[d] = begin;
        b.local_offset[d] = local;
        b.shape[d] = length;
      }
      out.push_back(std::move(b));
      local += length;
    }
    return out;
  }
  // TP on dim 0: the part's rows are the ranges one after another; cut the FSDP rows by them.
  int64_t local = 0;
  for (const auto& [begin, length] : p.ranges) {
    const int64_t a = std::max(row_begin, local), e = std::min(row_begin + rows, local + length);
    if (a < e) {
      ParamBox b{zeros_like(full), zeros_like(full), part_shape};
      b.global_offset[0] = begin + (a - local);
      b.local_offset[0] = a - row_begin;
      b.shape[0] = e - a;
      out.push_back(std::move(b));
    }
    local += length;
  }
  return out;
}

} // namespace

namespace {

Tensor box_view(Tensor t, const std::vector<int64_t>& offset, const Shape& shape) {
  for (size_t d = 0; d < shape.size(); d++)
    t = slice(t, int64_t(d), offset[d], offset[d] + shape[d]);
  return t;
}

} // namespace

const ParamLayout* find_layout(const std::map<std::string, ParamLayout>* layouts,
                               const std::string& name) {
  if (!layouts) return nullptr;
  const auto it = layouts->find(name);
  return it == layouts->end() ? nullptr : &it->second;
}

Tensor local_box(const Tensor& local, const ParamBox& box) {
  return box_view(local, box.local_offset, box.shape);
}

Tensor global_box(const Tensor& whole, const ParamBox& box) {
  return box_view(whole, box.global_offset, box.shape);
}

std::optional<ParamBox> box_rows(const ParamBox& box, int64_t row_begin, int64_t row_end) {
  const int64_t a = std::max(row_begin, box.global_offset[0]);
  const int64_t e = std::min(row_end, box.global_offset[0] + box.shape[0]);
  if (a >= e) return std::nullopt;
  ParamBox part = box;
  part.local_offset[0] += a - box.global_offset[0];
  part.global_offset[0] = a - row_begin; // in the block
  part.shape[0] = e - a;
  return part;
}

void keep_rows(const ParamLayout& layout, Tensor& local, int64_t row_begin, const Tensor& rows) {
  NoGradGuard no_grad;
  VLM_CHECK(rows.dim() == int64_t(layout.full_shape.size()) && rows.dim() > 0, "keep_rows: rows ",
            rows.desc(), " of a whole tensor ", shape_str(layout.full_shape));
  for (const ParamBox& box : layout.boxes)
    if (const auto part = box_rows(box, row_begin, row_begin + rows.size(0))) {
      Tensor dst = local_box(local, *part);
      copy_(dst, global_box(rows, *part).to(local.device()));
    }
}

namespace {

// The parts of rows [row_begin, row_end) this rank writes (box_rows of its boxes), as i64 words
// (per part: its offset in the block, then its shape) and their elements one part after another,
// on the host.
struct PackedParts {
  Tensor words, data;
};

PackedParts pack_rows(const Tensor& local, const ParamLayout& layout, int64_t row_begin,
                      int64_t row_end) {
  std::vector<ParamBox> parts;
  if (layout.writes)
    for (const ParamBox& box : layout.boxes)
      if (auto part = box_rows(box, row_begin, row_end)) parts.push_back(std::move(*part));
  std::vector<int64_t> words;
  int64_t elements = 0;
  for (const ParamBox& part : parts) {
    words.insert(words.end(), part.global_offset.begin(), part.global_offset.end());
    words.insert(words.end(), part.shape.begin(), part.shape.end());
    elements += numel(part.shape);
  }
  PackedParts out{Tensor::from_vector(words, {int64_t(words.size())}),
                  Tensor::empty({elements}, local.dtype())};
  int64_t at = 0;
  for (const ParamBox& part : parts) {
    const int64_t n = numel(part.shape);
    Tensor dst = reshape(slice(out.data, 0, at, at + n), part.shape);
    copy_(dst, local_box(local, part).to(Device::cpu()));
    at += n;
  }
  return out;
}

} // namespace

Tensor gather_param_rows(const std::string& name, const Tensor& local, const ParamLayout* layout,
                         ProcessGroup& world, int root, int64_t row_begin, int64_t row_end) {
  NoGradGuard no_grad;
  if (!layout) {
    if (world.rank() != root) return Tensor();
    return (local.dim() == 0 ? local : slice(local, 0, row_begin, row_end)).to(Device::cpu());
  }
  const Shape& full = layout->full_shape;
  const size_t dims = full.size();
  VLM_CHECK(dims > 0, "gather_param_rows: ", name, ": a 0-d parameter has no boxes");
  VLM_CHECK(row_begin >= 0 && row_begin < row_end && row_end <= full[0],
            "gather_param_rows: ", name, ": rows [", row_begin, ", ", row_end, ") of ",
            shape_str(full));
  const PackedParts mine = pack_rows(local, *layout, row_begin, row_end);
  std::vector<int64_t> word_counts, data_counts;
  const Tensor words = world.gather(mine.words, root, &word_counts);
  const Tensor data = world.gather(mine.data, root, &data_counts);
  if (world.rank() != root) return Tensor();
  Shape block_shape = full;
  block_shape[0] = row_end - row_begin;
  Tensor block = Tensor::empty(block_shape, local.dtype());
  const int64_t* w = words.data<int64_t>();
  int64_t at = 0;
  for (size_t r = 0; r < word_counts.size(); r++) {
    // Rank r's parts, in the order it packed them.
    VLM_CHECK(word_counts[r] % int64_t(2 * dims) == 0, "gather_param_rows: ", name, ": rank ", r,
              " sent ", word_counts[r], " part words for a ", dims, "-d tensor");
    const int64_t* end = w + word_counts[r];
    int64_t rank_elements = 0;
    for (; w < end; w += 2 * dims) {
      ParamBox part{std::vector<int64_t>(w, w + dims), {}, Shape(w + dims, w + 2 * dims)};
      for (size_t d = 0; d < dims; d++)
        VLM_CHECK(part.global_offset[d] >= 0 &&
                      part.global_offset[d] + part.shape[d] <= block_shape[d],
                  "gather_param_rows: ", name, ": rank ", r, "'s part is outside ",
                  shape_str(block_shape));
      const int64_t n = numel(part.shape);
      Tensor dst = global_box(block, part);
      copy_(dst, reshape(slice(data, 0, at + rank_elements, at + rank_elements + n), part.shape));
      rank_elements += n;
    }
    VLM_CHECK(rank_elements == data_counts[r], "gather_param_rows: ", name, ": rank ", r, " sent ",
              data_counts[r], " elements for parts of ", rank_elements);
    at += rank_elements;
  }
  // The writers' boxes tile the tensor (the checkpoint relies on it too): a gap would be garbage.
  VLM_CHECK(at == numel(block_shape), "gather_param_rows: ", name, ": the ranks' boxes hold ", at,
            " of the ", numel(block_shape), " elements of rows [", row_begin, ", ", row_end, ")");
  return block;
}

nn::Module::PartOf init_parts(const std::map<std::string, ParamLayout>& layouts) {
  return [&layouts](const std::string& name) -> std::optional<nn::Module::InitPart> {
    const auto it = layouts.find(name);
    if (it == layouts.end()) return std::nullopt;
    const ParamLayout* layout = &it->second;
    return nn::Module::InitPart{layout->full_shape,
                                [layout](Tensor& local, int64_t row_begin, const Tensor& rows) {
                                  keep_rows(*layout, local, row_begin, rows);
                                }};
  };
}

std::map<std::string, ParamLayout> param_layouts(const Fsdp* fsdp, const TensorParallel* tp) {
  std::map<std::string, ParamLayout> out;
  const std::map<std::string, ShardRows> shards =
      fsdp ? fsdp->shard_rows() : std::map<std::string, ShardRows>{};
  if (!tp) {
    for (const auto& [name, r] : shards) {
      TpPlacement whole;
      whole.global_shape = r.full_shape;
      out[name] = {r.full_shape, boxes_of(whole, r.full_shape, r.row_begin, r.rows), r.writes};
    }
    return out;
  }
  const int tp_rank = tp->group().rank();
  for (const auto& [name, p] : tp->placements()) {
    const auto shard = shards.find(name);
    if (!p.sharded() && shard == shards.end()) continue; // whole and the same everywhere
    const bool tp_writes = tp_rank % p.replicas == 0;    // consecutive ranks share a part
    // The TP part's shape: the global one with the ranges' total on the split dim.
    Shape part = p.global_shape;
    if (p.sharded()) {
      int64_t n = 0;
      for (const auto& range : p.ranges) n += range.second;
      part[size_t(p.dim)] = n;
    }
    VLM_CHECK(!part.empty(), "param_layouts: the 0-dim parameter ", name, " is split");
    if (shard != shards.end()) {
      const ShardRows& r = shard->second;
      VLM_CHECK(r.full_shape == part, "param_layouts: FSDP's ", name, " is ",
                shape_str(r.full_shape), ", its TP part ", shape_str(part));
      out[name] = {p.global_shape, boxes_of(p, part, r.row_begin, r.rows), r.writes && tp_writes};
    } else {
      out[name] = {p.global_shape, boxes_of(p, part, 0, part[0]), tp_writes};
    }
  }
  return out;
}

} // namespace vlm::parallel
