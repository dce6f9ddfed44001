#include "model/hf_weights.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "io/state/safetensors.h"
#include "model/hf_weight_plan.h"
#include "model/tokenizer_files.h"
#include "parallel/param_layout.h"
#include "src/base/logging.h"
#include "src/core/autograd.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

namespace fs = std::filesystem;

namespace {

// The snapshot's files, memory-mapped once the plan has passed: each tensor's data by name.
struct MappedSnapshot {
  const HfWeightPlan& plan;
  std::vector<std::unique_ptr<io::SafetensorsFile>> files;

  MappedSnapshot(const HfWeightPlan& p, const fs::path& dir) : plan(p) {
    for (const SnapshotFile& f : plan.files)
      files.push_back(std::make_unique<io::SafetensorsFile>((dir / f.name).string()));
  }
  const io::TensorInfo& get(const std::string& name) const {
    return files[plan.tensors.at(name).file]->get(name);
  }
};

// An owned, aligned copy of a (possibly unaligned) mapped tensor.
Tensor to_tensor(const io::TensorInfo& info) {
  Tensor t = Tensor::empty(info.shape, info.dtype);
  if (info.nbytes) std::memcpy(t.data_ptr(), info.data, info.nbytes);
  return t;
}

// Box `box` (global offset and shape) of a mapped tensor as a new tensor of its stored dtype,
// copied run by run (a run: the box's extent of the last dim), so only the box's bytes are read;
// adds them to `bytes_read`.
Tensor read_box(const io::TensorInfo& info, const parallel::ParamBox& box, int64_t& bytes_read) {
  Tensor out = Tensor::empty(box.shape, info.dtype);
  const int64_t n = out.numel();
  if (n == 0) return out;
  const size_t D = box.shape.size(), es = dtype_size(info.dtype);
  std::vector<int64_t> stride(D, 1); // of the stored tensor, in elements
  for (size_t d = D - 1; d-- > 0;) stride[d] = stride[d + 1] * info.shape[d + 1];
  const int64_t run = box.shape[D - 1];
  std::vector<int64_t> idx(D - 1, 0); // the run's index over the box's outer dims
  auto* dst = static_cast<char*>(out.data_ptr());
  const auto* src = static_cast<const char*>(info.data);
  for (int64_t k = 0; k < n / run; k++) {
    int64_t at = box.global_offset[D - 1];
    for (size_t d = 0; d + 1 < D; d++) at += (box.global_offset[d] + idx[d]) * stride[d];
    std::memcpy(dst + size_t(k * run) * es, src + size_t(at) * es, size_t(run) * es);
    for (size_t d = D - 1; d-- > 0;) {
      if (++idx[d] < box.shape[d]) break;
      idx[d] = 0;
    }
  }
  bytes_read += n * int64_t(es);
  return out;
}

} // namespace

StoredTensors load_hf_weights(nn::Module& model, const std::string& dir_name,
                              const std::vector<std::string>& carried_prefixes) {
  return load_hf_weights(model, dir_name, carried_prefixes, nullptr);
}

StoredTensors load_hf_weights(nn::Module& model, const std::string& dir_name,
                              const std::vector<std::string>& carried_prefixes,
                              const std::map<std::string, parallel::ParamLayout>* layouts,
                              int64_t* bytes_read) {
  const fs::path dir = dir_name;
  // Checked against the declared shapes before anything is allocated or read: a config.json whose
  // sizes disagree with the weights (a typo'd hidden_size of 10^6) fails here, not in the
  // allocator, and a truncated download before its bytes are touched.
  const HfWeightPlan plan = plan_hf_weights(model.parameter_specs(), dir_name, carried_prefixes);
  if (plan.problem_count()) VLM_FAIL(plan.problems_message(dir_name, model.type_name()));
  const MappedSnapshot snap(plan, dir);
  for (const std::string& name : plan.ignored) {
    if (name != "lm_head.weight") {
      log_debug(dir_name, ": ignoring the buffer ", name, " (recomputed from rope_theta)");
      continue;
    }
    const std::string& file = plan.files[plan.tensors.at(name).file].name;
    if (layouts) { // comparing would read both whole on every rank
      log_info(dir_name, ": ignoring lm_head.weight (", file,
               "): the model ties its head to model.embed_tokens.weight");
      continue;
    }
    const io::TensorInfo& head = snap.get(name);
    const io::TensorInfo& embed = snap.get("model.embed_tokens.weight");
    const bool same = embed.dtype == head.dtype && embed.shape == head.shape &&
                      std::memcmp(embed.data, head.data, head.nbytes) == 0;
    log_info(dir_name, ": ignoring lm_head.weight (", file,
             "): the model ties its head to model.embed_tokens.weight; the stored head ",
             same ? "is identical to it" : "DIFFERS from it and is dropped, as transformers does");
  }

  model.materialize(); // no-op for a parallelized model (its local parts are allocated)
  const auto params = model.named_parameters();
  // The tensors stored more precisely than their parameters hold them are kept whole (exact), if
  // they are few (few_exact), decided from the headers before anything is read.
  int64_t stored_elements = 0, exact_elements = 0;
  std::set<std::string> exact_names;
  for (const auto& p : params) {
    const io::TensorInfo& info = plan.info(p.name);
    stored_elements += vlm::numel(info.shape);
    if (!holds_all_of(p.tensor.dtype(), info.dtype)) {
      exact_names.insert(p.name);
      exact_elements += vlm::numel(info.shape);
    }
  }
  if (!few_exact(exact_elements, stored_elements)) {
    log_warn(dir_name, ": ", exact_names.size(), " of ", params.size(),
             " tensors are stored more precisely than the parameters hold them; their fp32 "
             "masters start from the rounded values (train in f32 to keep every stored bit)");
    exact_names.clear();
  }
  StoredTensors stored;
  int64_t read = 0;
  NoGradGuard no_grad;
  for (const auto& p : params) {
    const io::TensorInfo& info = snap.get(p.name);
    stored.dtypes[p.name] = info.dtype;
    Tensor dst = p.tensor;
    // This rank's boxes only, when it holds a part.
    if (const parallel::ParamLayout* layout = parallel::find_layout(layouts, p.name)) {
      for (const parallel::ParamBox& box : layout->boxes) {
        Tensor part = parallel::local_box(dst, box);
        copy_(part, read_box(info, box, read).to(dst.dtype()).to(dst.device()));
      }
      if (exact_names.count(p.name)) {
        stored.exact[p.name] = to_tensor(info);
        read += int64_t(info.nbytes);
      }
      continue;
    }
    VLM_CHECK(dst.shape() == info.shape, dir_name, ": ", p.name, " is held as ", dst.desc(),
              " on this rank but no layout says which part of ", shape_str(info.shape));
    Tensor value = to_tensor(info);
    read += int64_t(info.nbytes);
    copy_(dst, value.to(dst.dtype()).to(dst.device())); // converted on the host
    if (exact_names.count(p.name)) stored.exact[p.name] = value;
  }
  for (const std::string& name : plan.carried) {
    const io::TensorInfo& info = snap.get(name);
    stored.carried[name] = to_tensor(info);
    read += int64_t(info.nbytes);
  }
  if (bytes_read) *bytes_read = read;
  std::string carried;
  if (!stored.carried.empty()) {
    carried = "; carrying " + std::to_string(stored.carried.size()) + " tensors it does not use:";
    for (const auto& p : carried_prefixes) carried += " " + p + "*";
  }
  log_info("loaded ", params.size(), " tensors from ", dir_name, " (", snap.files.size(),
           snap.files.size() == 1 ? " file" : " files", layouts ? ", this rank's parts: " : ", ",
           double(read) / double(1 << 20), " MiB read)", carried);
  return stored;
}

const char* hf_dtype_name(DType dtype) {
  switch (dtype) {
  case DType::f32: return "float32";
  case DType::bf16: return "bfloat16";
  case DType::f16: return "float16";
  default: VLM_FAIL("HF snapshots are written in f32, bf16 or f16, not ", dtype_name(dtype));
  }
}

std::vector<std::string> copy_tokenizer_files(const std::string& tokenizer_dir,
                                              const std::string& out_dir) {
  std::vector<std::string> copied;
  if (tokenizer_dir.empty()) return copied;
  std::error_code ec;
  for (const char* name : kTokenizerFileNames) {
    const fs::path src = fs::path(tokenizer_dir) / name;
    if (!fs::exists(src)) continue;
    fs::copy_file(src, fs::path(out_dir) / name, fs::copy_options::overwrite_existing, ec);
    VLM_CHECK(!ec, "cannot copy ", src.string(), " to ", out_dir, ": ", ec.message());
    copied.push_back(name);
  }
  return copied;
}

namespace {

// Never over anything: `out` must be new or an empty folder (the caller's, e.g. made for it).
void check_new_or_empty(const fs::path& out) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(out, ec);
  if (fs::exists(st)) {
    VLM_CHECK(fs::is_directory(st), "save_hf_snapshot: ", out.string(),
              " exists and is not a folder; an HF snapshot never replaces a file (choose a new "
              "folder)");
    VLM_CHECK(fs::is_empty(out, ec) && !ec, "save_hf_snapshot: ", out.string(),
              " is a folder that is not empty; an HF snapshot never replaces files (choose a new "
              "or empty folder)");
  }
}

// A new folder beside `out` made for this save alone (mkdtemp: no name that was there before is
// touched), renamed to `out` once complete.
fs::path make_temp_beside(const fs::path& out) {
  std::error_code ec;
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  VLM_CHECK(!ec, "save_hf_snapshot: cannot create ", parent.string(), ": ", ec.message());
  std::string pattern = (parent / ("." + out.filename().string() + ".tmp-XXXXXX")).string();
  VLM_CHECK(::mkdtemp(pattern.data()) != nullptr, "save_hf_snapshot: cannot create a folder in ",
            parent.string(), ": ", std::strerror(errno));
  return pattern;
}

// Our own temporary folder, removed on any error before the save is done.
struct RemoveUnlessDone {
  fs::path path;
  bool done = false;
  ~RemoveUnlessDone() {
    std::error_code e;
    if (!done) fs::remove_all(path, e);
  }
};

void write_config(const fs::path& dir, nlohmann::json config, const char* dtype_str) {
  VLM_CHECK(config.is_object(), "save_hf_snapshot: the config must be a JSON object");
  config["torch_dtype"] = dtype_str; // transformers 4
  config["dtype"] = dtype_str;       // transformers 5
  std::ofstream f(dir / "config.json");
  f << config.dump(2) << "\n";
  VLM_CHECK(f.good(), "save_hf_snapshot: cannot write ", (dir / "config.json").string());
}

// Shards in tensor order (indices into tensors), each up to max_shard_bytes in the saved dtypes
// (a larger tensor gets its own), and the bytes of them all (the index's total_size).
struct ShardPlan {
  std::vector<std::vector<size_t>> shards;
  int64_t total_bytes = 0;
};

int64_t bytes_of(const SnapshotTensor& t) { return numel(t.shape) * int64_t(dtype_size(t.dtype)); }

ShardPlan plan_shards(const std::vector<SnapshotTensor>& tensors, int64_t max_shard_bytes) {
  ShardPlan plan;
  auto& shards = plan.shards;
  shards.resize(1);
  int64_t shard_bytes = 0;
  for (size_t i = 0; i < tensors.size(); i++) {
    const int64_t n = bytes_of(tensors[i]);
    if (!shards.back().empty() && shard_bytes + n > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += n;
    plan.total_bytes += n;
  }
  return plan;
}

// Writes each shard as model.safetensors (one shard) or model-0000i-of-0000n.safetensors, its
// header first, then each tensor block by block as fetched (snapshot_pieces), converted to its
// dtype on the CPU; returns the weight map (tensor name -> file).
nlohmann::json write_shards(const fs::path& dir, const std::vector<SnapshotTensor>& tensors,
                            const FetchSnapshotRows& fetch,
                            const std::vector<std::vector<size_t>>& shards) {
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  const std::vector<SnapshotPiece> pieces = snapshot_pieces(tensors);
  size_t next = 0; // the next piece: pieces and shards both follow the tensors' order
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); s++) {
    std::string file = "model.safetensors";
    if (shards.size() > 1) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      file = buf;
    }
    std::vector<io::TensorInfo> infos;
    for (size_t i : shards[s]) {
      const SnapshotTensor& t = tensors[i];
      infos.push_back({t.name, t.dtype, t.shape, nullptr, size_t(bytes_of(t))});
      weight_map[t.name] = file;
    }
    io::SafetensorsWriter writer((dir / file).string(), std::move(infos), meta);
    NoGradGuard no_grad;
    for (; next < pieces.size() && !shards[s].empty() && pieces[next].index <= shards[s].back();
         next++) {
      const SnapshotPiece& piece = pieces[next];
      const SnapshotTensor& t = tensors[piece.index];
      Shape want = t.shape;
      if (!want.empty()) want[0] = piece.row_end - piece.row_begin;
      const Tensor value = fetch(piece.index, piece.row_begin, piece.row_end);
      VLM_CHECK(value.defined() && value.shape() == want, "save_hf_snapshot: rows [",
                piece.row_begin, ", ", piece.row_end, ") of ", t.name, " came as ",
                value.defined() ? value.desc() : std::string("nothing"), ", not ", shape_str(want));
      const Tensor bytes = value.detach().to(Device::cpu()).to(t.dtype).contiguous();
      writer.write(bytes.data_ptr(), bytes.nbytes());
    }
    writer.finish();
  }
  return weight_map;
}

void write_index(const fs::path& dir, int64_t total_bytes, const nlohmann::json& weight_map) {
  nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  std::ofstream f(dir / "model.safetensors.index.json");
  f << index.dump(2) << "\n";
  VLM_CHECK(f.good(), "save_hf_snapshot: cannot write the index in ", dir.string());
}

void write_extra_files(const fs::path& dir, const std::map<std::string, std::string>& extra_files) {
  for (const auto& [name, contents] : extra_files) {
    std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
    f << contents;
    f.close();
    VLM_CHECK(f, "save_hf_snapshot: cannot write ", (dir / name).string());
  }
}

} // namespace

std::vector<SnapshotTensor>
snapshot_tensors(const nn::Module& model, DType dtype, const StoredTensors* stored,
                 const std::function<std::optional<Shape>(const std::string&)>& whole_shape) {
  std::vector<SnapshotTensor> out;
  for (auto& p : model.named_parameters()) {
    std::optional<Shape> whole = whole_shape ? whole_shape(p.name) : std::nullopt;
    out.push_back({p.name, whole ? *whole : p.tensor.shape(),
                   stored ? stored->write_dtype(p.name, dtype) : dtype});
  }
  if (stored)
    for (const auto& [name, value] : stored->carried)
      out.push_back({name, value.shape(), value.dtype()});
  return out;
}

std::vector<SnapshotPiece> snapshot_pieces(const std::vector<SnapshotTensor>& tensors) {
  std::vector<SnapshotPiece> out;
  for (size_t i = 0; i < tensors.size(); i++) {
    const SnapshotTensor& t = tensors[i];
    if (t.shape.empty()) {
      out.push_back({i, 0, 1});
      continue;
    }
    const int64_t rows = t.shape[0], row_bytes = rows > 0 ? bytes_of(t) / rows : 0;
    if (row_bytes == 0) continue; // no elements
    const int64_t step = std::max<int64_t>(1, kSnapshotPieceBytes / row_bytes);
    for (int64_t r = 0; r < rows; r += step) out.push_back({i, r, std::min(rows, r + step)});
  }
  return out;
}

Tensor snapshot_rows(const Tensor& t, int64_t row_begin, int64_t row_end) {
  return t.dim() == 0 ? t : slice(t, 0, row_begin, row_end);
}

void save_hf_snapshot(const nn::Module& model, nlohmann::json config, const std::string& out_dir,
                      DType dtype, const std::string& tokenizer_dir, int64_t max_shard_bytes,
                      const std::map<std::string, std::string>& extra_files,
                      const StoredTensors* stored) {
  const auto params = model.named_parameters();
  const std::vector<SnapshotTensor> tensors = snapshot_tensors(model, dtype, stored);
  // Each parameter (or its exact copy), then the carried tensors.
  auto fetch = [&](size_t i, int64_t row_begin, int64_t row_end) -> Tensor {
    if (i >= params.size())
      return snapshot_rows(stored->carried.at(tensors[i].name), row_begin, row_end);
    if (stored) {
      auto exact = stored->exact.find(params[i].name);
      if (exact != stored->exact.end()) return snapshot_rows(exact->second, row_begin, row_end);
    }
    return snapshot_rows(params[i].tensor, row_begin, row_end);
  };
  save_hf_snapshot(tensors, fetch, std::move(config), out_dir, dtype, tokenizer_dir,
                   max_shard_bytes, extra_files);
}

void save_hf_snapshot(const std::vector<SnapshotTensor>& tensors, const FetchSnapshotRows& fetch,
                      nlohmann::json config, const std::string& out_dir, DType dtype,
                      const std::string& tokenizer_dir, int64_t max_shard_bytes,
                      const std::map<std::string, std::string>& extra_files) {
  const char* dtype_str = hf_dtype_name(dtype);
  VLM_CHECK(max_shard_bytes > 0, "save_hf_snapshot: max_shard_bytes must be > 0");
  fs::path out = fs::path(out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path(); // "dir/" -> "dir"
  VLM_CHECK(!out.empty(), "save_hf_snapshot: empty output directory");
  VLM_CHECK(tokenizer_dir.empty() || fs::is_directory(tokenizer_dir),
            "save_hf_snapshot: tokenizer directory '", tokenizer_dir, "' does not exist");
  check_new_or_empty(out);
  // Everything is written to the temporary folder first, so an error leaves `out` as it was.
  const fs::path tmp = make_temp_beside(out);
  RemoveUnlessDone cleanup{tmp};

  write_config(tmp, std::move(config), dtype_str);
  const ShardPlan plan = plan_shards(tensors, max_shard_bytes);
  const std::vector<std::vector<size_t>>& shards = plan.shards;
  const nlohmann::json weight_map = write_shards(tmp, tensors, fetch, shards);
  if (shards.size() > 1) write_index(tmp, plan.total_bytes, weight_map);
  std::vector<std::string> copied = copy_tokenizer_files(tokenizer_dir, tmp.string());
  // After the tokenizer files: extra files win. A training run passes its tokenizer files here
  // (read once at its start: model/tokenizer_files.h); they count as tokenizer files.
  write_extra_files(tmp, extra_files);
  for (const char* name : kTokenizerFileNames)
    if (extra_files.count(name) && std::find(copied.begin(), copied.end(), name) == copied.end())
      copied.push_back(name);

  // rename(2) takes the place of a missing or empty `out` atomically, and fails on anything else
  // (something written there meanwhile stays).
  std::error_code ec;
  fs::rename(tmp, out, ec);
  VLM_CHECK(!ec, "save_hf_snapshot: cannot rename ", tmp.string(), " to ", out.string(), ": ",
            ec.message());
  cleanup.done = true;
  std::string tok =
      copied.empty() ? "no tokenizer files" : std::to_string(copied.size()) + " tokenizer files";
  log_info("wrote HF snapshot ", out.string(), ": ", tensors.size(), " tensors in ", dtype_str,
           ", ", shards.size(), shards.size() == 1 ? " file, " : " files, ", tok);
}

} // namespace vlm::model
