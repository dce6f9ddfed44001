// HF safetensors weights in and out (DESIGN.md §7): a model's parameters, named as in
// transformers, from and to a local HF snapshot directory.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/stored_tensors.h"
#include "parallel/param_layout.h"
#include "src/base/dtype.h"
#include "src/nn/module.h"

namespace vlm::model {

// Fills every parameter of `model` (allocating them first if needed) from the snapshot in `dir`:
// `model.safetensors.index.json` (sharded: its weight_map names the file of each tensor) if
// present, else `model.safetensors`. Files are memory-mapped (io::SafetensorsFile) and each tensor
// is converted from its stored dtype (F32, BF16, F16, F64) to the parameter's dtype.
//
// The snapshot is checked from its headers before anything is allocated or read
// (model/hf_weight_plan.h: the check `vlmtrain check-model` runs). Any mismatch is ONE vlm::Error
// that lists every problem: each truncated, missing or unreadable file, each parameter missing
// from the snapshot (with its expected shape), each tensor in the snapshot the model does not
// have (with its file and shape), each tensor of the wrong shape (file, expected vs stored shape)
// or of a non-float dtype. Tolerated with a log line, as transformers does: `lm_head.weight` in a
// model whose head is tied to `model.embed_tokens.weight` (HF tied checkpoints omit it; when
// present it is ignored — the line says whether it equals the embeddings) and legacy
// `*.rotary_emb.inv_freq` buffers. Nothing is modified unless the whole check passes.
// Returns each parameter's stored dtype and, kept raw, every tensor whose name starts with one of
// `carried_prefixes` (CausalLM::carried_prefixes(); a float dtype is required of them too).
StoredTensors load_hf_weights(nn::Module& model, const std::string& dir,
                              const std::vector<std::string>& carried_prefixes = {});
// The same into a parallelized model (parallel/parallelize.h): each parameter `layouts` names
// gets only this rank's boxes, read from the mapping box by box (a rank touches only their bytes);
// the others are read whole. The checks compare the declared (whole) shapes. `bytes_read`, if
// given, receives the bytes copied out of the files (parameters, exact copies, carried tensors).
StoredTensors load_hf_weights(nn::Module& model, const std::string& dir,
                              const std::vector<std::string>& carried_prefixes,
                              const std::map<std::string, parallel::ParamLayout>* layouts,
                              int64_t* bytes_read = nullptr);

// Shard size above which save_hf_snapshot writes several files and an index (bytes).
constexpr int64_t kDefaultMaxShardBytes = int64_t(4) << 30;

// Writes `model` as an HF snapshot that transformers loads: config.json (`config`, the model's
// CausalLM::hf_config(), with torch_dtype and dtype set to `dtype`), the parameters under their HF
// names converted to `dtype` (f32, bf16 or f16) in model.safetensors — or, when they exceed
// max_shard_bytes, in model-0000i-of-0000n.safetensors plus model.safetensors.index.json — and the
// tokenizer files found in `tokenizer_dir` (tokenizer.json, tokenizer_config.json, vocab.json,
// merges.txt, generation_config.json, special_tokens_map.json, chat_template.jinja,
// preprocessor_config.json; "" = none), then `extra_files` (name -> contents; they win over a
// copied file of the same name). A tied head is not written (as HF does). With `stored`, each
// parameter is written in stored->write_dtype(name, dtype) (a tensor that came in F32 stays F32
// in a bf16 snapshot) and stored->carried follow the parameters bit for bit; config.json's dtype
// stays `dtype`. Never over anything:
// `out_dir` must not exist or be an empty folder (anything else is an error before any work).
// Atomic: everything goes to a new hidden folder beside it (mkdtemp), renamed to `out_dir` once
// complete; an error removes that folder and leaves `out_dir` as it was.
void save_hf_snapshot(const nn::Module& model, nlohmann::json config, const std::string& out_dir,
                      DType dtype, const std::string& tokenizer_dir,
                      int64_t max_shard_bytes = kDefaultMaxShardBytes,
                      const std::map<std::string, std::string>& extra_files = {},
                      const StoredTensors* stored = nullptr);

// One tensor of an HF snapshot as written: its name, whole shape and dtype in the file.
struct SnapshotTensor {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
};
// Rows [row_begin, row_end) (dim 0) of tensor `index`'s whole value, any device and dtype
// (converted to the entry's dtype); a 0-d tensor comes whole, as rows [0, 1).
using FetchSnapshotRows = std::function<Tensor(size_t index, int64_t row_begin, int64_t row_end)>;

// A block of rows of one tensor of a snapshot. save_hf_snapshot asks for each tensor in blocks of
// at most kSnapshotPieceBytes in its written dtype (one row at least; a 0-d tensor as rows [0, 1);
// none for a tensor of no elements), in the list's order: snapshot_pieces(). A rank that sends its
// parts to the writing rank walks the same list.
struct SnapshotPiece {
  size_t index = 0;
  int64_t row_begin = 0, row_end = 0;
};
constexpr int64_t kSnapshotPieceBytes = int64_t(64) << 20;
std::vector<SnapshotPiece> snapshot_pieces(const std::vector<SnapshotTensor>& tensors);
// Rows [row_begin, row_end) of `t` (a view; a 0-d tensor itself).
Tensor snapshot_rows(const Tensor& t, int64_t row_begin, int64_t row_end);

// What save_hf_snapshot above writes of `model`, in order: its parameters, each with its whole
// shape (`whole_shape(name)`, or its own shape when that returns an empty optional) in
// stored->write_dtype(name, dtype), then stored->carried as they are.
std::vector<SnapshotTensor>
snapshot_tensors(const nn::Module& model, DType dtype, const StoredTensors* stored,
                 const std::function<std::optional<Shape>(const std::string&)>& whole_shape = {});

// The same snapshot from a list of tensors and a source of their rows, one block of rows in
// memory at a time (snapshot_pieces): a sharded model's parameters are gathered to the writing
// rank block by block (src/train: the final save never holds the whole model, nor a whole
// tensor). save_hf_snapshot above is this with the model's parameters as the source. Errors
// before anything is fetched for a bad `out_dir`, `tokenizer_dir` or `max_shard_bytes`.
void save_hf_snapshot(const std::vector<SnapshotTensor>& tensors, const FetchSnapshotRows& fetch,
                      nlohmann::json config, const std::string& out_dir, DType dtype,
                      const std::string& tokenizer_dir,
                      int64_t max_shard_bytes = kDefaultMaxShardBytes,
                      const std::map<std::string, std::string>& extra_files = {});

// Copies the tokenizer files save_hf_snapshot copies (those of its list that exist in
// `tokenizer_dir`; "" = none) into `out_dir`; returns their names.
std::vector<std::string> copy_tokenizer_files(const std::string& tokenizer_dir,
                                              const std::string& out_dir);

// "float32" | "bfloat16" | "float16" (config.json's torch_dtype) for f32 / bf16 / f16.
const char* hf_dtype_name(DType dtype);

} // namespace vlm::model
