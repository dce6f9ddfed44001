// Where a training state goes (DESIGN.md §7): named tensors and JSON documents, written and read
// by key. The training state (src/train/train_state.h) knows only these interfaces; the parallel
// HDF5 checkpoint implements them (a tensor per dataset, "/model/<hf name>", "/optim/...", and
// "/state" JSON), and MemoryState here keeps everything in memory for tests and in-process
// restarts. Keys are '/'-separated paths.
//
// A rank's part of a global tensor is one or a few boxes of it (slabs): an FSDP shard is a dim-0
// row range, a tensor-parallel shard a column block (dim 1) or several row segments of one. The
// writer takes each rank's boxes of every tensor and the reader reads any box, so a state saved
// in one layout loads into another (resharding).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/core/tensor.h"

namespace vlm::io {

// The box [offset, offset + block.shape()) of a global tensor (offset: one entry per dim of the
// global tensor, as block has; a scalar: both empty). An undefined or empty block writes nothing.
struct Slab {
  std::vector<int64_t> offset;
  Tensor block;
};

// True when the box [offset, offset + box) lies within a tensor of `global_shape` (same number of
// dims, offsets >= 0).
bool box_fits(const Shape& global_shape, const std::vector<int64_t>& offset, const Shape& box);

class StateWriter {
public:
  virtual ~StateWriter() = default;
  // A copy of `value` (any device, contiguous or not) under `key`; a key is written once.
  virtual void write_tensor(const std::string& key, const Tensor& value) = 0;
  virtual void write_json(const std::string& key, const nlohmann::json& value) = 0;
  // Rows [row_begin, row_begin + rows.size(0)) of a tensor of `global_shape` and `dtype` (an FSDP
  // shard); `rows` undefined or empty: this rank writes none of it. A store of one process takes
  // only the whole tensor.
  virtual void write_rows(const std::string& key, const Shape& global_shape, DType dtype,
                          int64_t row_begin, const Tensor& rows) = 0;
  // This rank's boxes of a tensor of `global_shape` and `dtype` (a tensor-parallel shard: a
  // column block, or several row segments of one); each block any device, contiguous or not, of
  // `dtype`. `slabs` empty, or every block empty: this rank writes none of it. Every element of
  // the tensor must be written by exactly one slab of one rank (only the bounds are checked: an
  // element nobody writes is undefined in a checkpoint; an in-memory state, one process, checks
  // that its slabs tile the tensor). A box out of bounds is an error naming the key, the global
  // shape, the offset and the block.
  virtual void write_slab(const std::string& key, const Shape& global_shape, DType dtype,
                          const std::vector<Slab>& slabs) = 0;
};

class StateReader {
public:
  virtual ~StateReader() = default;
  virtual bool has(const std::string& key) const = 0;
  // The shape and dtype of the tensor under `key`; a missing key is an error naming it.
  virtual Shape shape(const std::string& key) const = 0;
  virtual DType dtype(const std::string& key) const = 0;
  // The names directly under `group` ("model" -> every parameter name), sorted; none when absent.
  virtual std::vector<std::string> children(const std::string& group) const = 0;
  // Copies the tensor under `key` into `dst` (same shape and dtype, any device); a missing key or
  // a shape/dtype mismatch is an error naming the key and both shapes.
  virtual void read_tensor_into(const std::string& key, Tensor& dst) const = 0;
  // A missing key is an error naming it.
  virtual nlohmann::json read_json(const std::string& key) const = 0;
  // Rows [row_begin, row_begin + dst.size(0)) of the tensor under `key` (the other dims and the
  // dtype must match): a shard of another layout than the one that wrote it.
  virtual void read_rows_into(const std::string& key, int64_t row_begin, Tensor& dst) const = 0;
  // The box [offset, offset + dst.shape()) of the tensor under `key` into `dst` (any device; the
  // dtype must be the stored one, as for read_rows_into: no conversion): a box of another layout
  // than the one that wrote it. A box out of bounds is an error naming the key, the stored shape,
  // the offset and dst.
  virtual void read_slab_into(const std::string& key, const std::vector<int64_t>& offset,
                              Tensor& dst) const = 0;
};

// Checks of a state against what its reader expects, made before anything is read (a size from
// the file must never size an allocation); each error names the key.
// The tensor under `key` is there with `shape` and `dtype` (any floating dtype: std::nullopt).
void check_state_tensor(const StateReader& in, const std::string& key, const Shape& shape,
                        std::optional<DType> dtype);
// Every name directly under `group` is one of `names`: no tensor of a parameter this model lacks.
void check_state_group(const StateReader& in, const std::string& group,
                       const std::set<std::string>& names);

// Both sides in memory: tensors are copied to the CPU on write.
class MemoryState final : public StateWriter, public StateReader {
public:
  void write_tensor(const std::string& key, const Tensor& value) override;
  void write_json(const std::string& key, const nlohmann::json& value) override;
  bool has(const std::string& key) const override;
  Shape shape(const std::string& key) const override;
  DType dtype(const std::string& key) const override;
  std::vector<std::string> children(const std::string& group) const override;
  void read_tensor_into(const std::string& key, Tensor& dst) const override;
  nlohmann::json read_json(const std::string& key) const override;
  void write_rows(const std::string& key, const Shape& global_shape, DType dtype, int64_t row_begin,
                  const Tensor& rows) override;
  void read_rows_into(const std::string& key, int64_t row_begin, Tensor& dst) const override;
  // The slabs must tile the tensor (disjoint, every element once): they are assembled into it.
  void write_slab(const std::string& key, const Shape& global_shape, DType dtype,
                  const std::vector<Slab>& slabs) override;
  void read_slab_into(const std::string& key, const std::vector<int64_t>& offset,
                      Tensor& dst) const override;
  // Every key, sorted (tensors and JSON documents together).
  std::vector<std::string> keys() const;

private:
  void check_new(const std::string& key) const;

  std::map<std::string, Tensor> tensors_;
  std::map<std::string, nlohmann::json> json_;
};

} // namespace vlm::io
