// What a checkpoint holds that training must hand on unchanged (qwen-models.md §3.9-3.10,
// peer-pain-points.md §10): the dtype each parameter was stored in — official Qwen3.5 snapshots
// keep `linear_attn.A_log` and `linear_attn.norm.weight` in F32 and the rest in BF16, and
// re-saving them in bf16 truncates them — and tensors the model carries without computing with
// them (Qwen3.5's `mtp.*` multi-token-prediction module), kept as raw bytes in their own dtype.
//
// The path: load_hf_weights fills it from the safetensors headers; the HDF5 checkpoint stores it
// (/stored_dtypes, /carried/<name>) and every reader of a checkpoint restores it; save_hf_snapshot
// writes each parameter in the more precise of the snapshot's dtype and its stored one, and every
// carried tensor bit for bit. A bf16 model's fp32 masters start from the stored F32 values, and
// `vlmtrain export` reads a checkpoint's master where its bf16 parameter would lose bits.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "io/state/state_store.h"
#include "src/base/dtype.h"
#include "src/core/tensor.h"

namespace vlm::model {

struct StoredTensors {
  std::map<std::string, DType> dtypes;   // parameter name -> dtype in the checkpoint it came from
  std::map<std::string, Tensor> carried; // name -> CPU tensor in its stored dtype (not parameters)
  // The stored values of parameters whose dtype cannot hold them (an F32 tensor of a bf16 model),
  // in their stored dtype on the CPU: the trainer seeds its fp32 masters from them (then drops
  // them), and save_hf_snapshot writes them in place of the parameter. Not saved in checkpoints
  // (their masters are).
  std::map<std::string, Tensor> exact;

  bool empty() const { return dtypes.empty() && carried.empty(); }
  // The dtype parameter `name` is written in when a snapshot is written in `dtype`: the stored
  // dtype when it is more precise (F32 under a bf16 export), else `dtype`.
  DType write_dtype(const std::string& name, DType dtype) const;
};

// Whether exact copies of `exact_elements` of `all_elements` values are few enough to keep (the
// F32 islands of a bf16 checkpoint, at most 1/16 of it), not a whole F32 snapshot loaded into a
// bf16 model, which would double the host memory of a load or hold the model whole in fp32 on
// every FSDP rank. The loaders apply it; the trainer's snapshot writes whatever exact copies
// (fp32 masters) the run holds, gathered block by block like every parameter.
inline bool few_exact(int64_t exact_elements, int64_t all_elements) {
  return exact_elements * 16 <= all_elements;
}

// Whether `a` keeps every value of `b` (f64 > f32 > bf16, f16; bf16 and f16 keep neither).
bool holds_all_of(DType a, DType b);

// In a training state: the dtypes as the JSON document "stored_dtypes" ({name: "f32", ...}) and
// each carried tensor as "carried/<name>". Every rank writes the same whole tensors (collective
// like the unsharded parameters). Nothing is written when `stored` is empty.
void write_stored_tensors(io::StateWriter& out, const StoredTensors& stored);
// What write_stored_tensors wrote (empty for a state saved before it existed). A dtype name that
// is not a float dtype is an error naming the parameter. Carried tensors are sized by the file
// (the reader checks each dataset's bytes lie inside it).
StoredTensors read_stored_tensors(const io::StateReader& in);

} // namespace vlm::model
