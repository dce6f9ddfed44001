#include "src/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "io/state/atomic_file.h"
#include "io/state/hdf5_state.h"
#include "model/hf_weights.h"
#include "model/model_spec.h"
#include "parallel/comm/mpi_env.h"
#include "src/base/check.h"
#include "src/base/logging.h"
#include "src/core/autograd.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::train {

namespace fs = std::filesystem;

namespace {

// Where parameter `name`'s most exact value is: model/<name>, or its fp32 AdamW master when the
// parameter was held in a dtype that cannot keep its stored one (an F32 tensor of a bf16 run).
std::string exact_key(const io::StateReader& in, const model::StoredTensors& kept,
                      const std::string& name) {
  const std::string key = "model/" + name, master = "optim/" + name + "/master";
  auto stored = kept.dtypes.find(name);
  if (stored == kept.dtypes.end() || model::holds_all_of(in.dtype(key), stored->second) ||
      !in.has(master))
    return key;
  io::check_state_tensor(in, master, in.shape(key), DType::f32);
  return master;
}

// Where checkpoints go: named in the errors of a full disk.
constexpr const char* kOutputDir = "checkpoint.output_dir";

void check_hdf5_build() {
  VLM_CHECK(io::hdf5_state_available(),
            "checkpoint.format = \"hdf5\": this build has no parallel HDF5 (it needs MPI and "
            "libhdf5-openmpi-dev; tools/deps/install_deps.sh installs them)");
  // MPI under a launcher (MPI-IO); a process without one writes through HDF5's POSIX driver.
  parallel::mpi_world();
}

// Flushes a file or folder to the storage device (a crash of the node must not lose the rename
// of a checkpoint whose data is still in the page cache). A network file system may report a full
// disk only here.
void fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  VLM_CHECK(fd >= 0, "checkpoint: cannot open ", path.string(),
            " to flush it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  VLM_CHECK(rc == 0, "checkpoint: cannot write ", path.string(),
            " (flushing it failed): ", io::write_error_text(err, kOutputDir));
}

// A small file of the checkpoint (its own .tmp renamed into place: never half-written).
void write_file(const fs::path& path, const std::string& contents) {
  io::write_file_atomic(path.string(), {{contents.data(), contents.size()}}, "checkpoint",
                        kOutputDir);
}

// Rank 0: an empty step_N.tmp, with every other leftover .tmp of a crashed save removed (a
// .tmp folder is never a checkpoint: only a complete one is renamed to step_N).
void prepare_tmp_dir(const fs::path& output_dir, const fs::path& tmp) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    const std::string stem = e.path().stem().string(); // "step_000006" of step_000006.tmp
    if (e.is_directory() && !e.is_symlink() && e.path().extension() == ".tmp" &&
        stem.rfind("step_", 0) == 0 && checkpoint_step_of(stem) >= 0)
      fs::remove_all(e.path(), ec);
  }
  fs::create_directories(tmp, ec);
  VLM_CHECK(!ec, "checkpoint: cannot create ", tmp.string(), ": ", ec.message());
}

// Rank 0: step_N.tmp -> step_N, then the folder entry flushed. An existing step_N is never
// replaced (resuming moves newer checkpoints aside first: checkpoint_folder.h).
void publish(const fs::path& tmp, const fs::path& dir) {
  std::error_code ec;
  VLM_CHECK(!fs::exists(fs::symlink_status(dir, ec)), "checkpoint: ", dir.string(),
            " already exists; a save never replaces a checkpoint (the new one stays in ",
            tmp.string(), ")");
  fs::rename(tmp, dir, ec);
  VLM_CHECK(!ec, "checkpoint: cannot rename ", tmp.string(), " to ", dir.string(), ": ",
            ec.message());
  fsync_path(dir.parent_path());
}

// "key: a (checkpoint) vs b (this run)" for each top-level or nested key that differs.
void diff_json(const nlohmann::json& saved, const nlohmann::json& now, const std::string& prefix,
               std::vector<std::string>& out) {
  if (saved.is_object() && now.is_object()) {
    for (const auto& [k, v] : saved.items())
      diff_json(v, now.contains(k) ? now.at(k) : nlohmann::json(), prefix + k + ".", out);
    for (const auto& [k, v] : now.items())
      if (!saved.contains(k)) diff_json(nlohmann::json(), v, prefix + k + ".", out);
    return;
  }
  if (saved != now)
    out.push_back(prefix.substr(0, prefix.size() - 1) + " = " + saved.dump() +
                  " in the checkpoint, " + now.dump() + " in this run");
}

// The config.json a checkpoint was saved for against this model's: any key that differs is
// listed (another model must not be loaded as this one).
void check_same_model(const nlohmann::json& saved, const nlohmann::json& now,
                      const std::string& where) {
  VLM_CHECK(saved.is_object(), where, " is not a JSON object");
  std::vector<std::string> diffs;
  diff_json(saved, now, "", diffs);
  if (diffs.empty()) return;
  std::string list;
  for (size_t i = 0; i < diffs.size() && i < 20; i++) list += "\n  " + diffs[i];
  if (diffs.size() > 20) list += "\n  ... and " + std::to_string(diffs.size() - 20) + " more";
  VLM_FAIL("it was saved for another model (its ", where,
           " differs from this model's config):", list);
}

// /config's training.param_dtype, checked: the dtype the parameters were saved in.
std::string saved_param_dtype(const nlohmann::json& config) {
  const bool ok = config.is_object() && config.contains("training") &&
                  config["training"].is_object() && config["training"].contains("param_dtype") &&
                  config["training"]["param_dtype"].is_string();
  VLM_CHECK(ok, "/config has no string training.param_dtype (not a training config)");
  return config["training"]["param_dtype"].get<std::string>();
}

} // namespace

std::string save_checkpoint(const TrainState& state, const CheckpointSave& save,
                            parallel::ProcessGroup& world) {
  check_hdf5_build();
#if VLM_WITH_HDF5
  const bool rank0 = world.rank() == 0;
  const fs::path dir = checkpoint_step_dir(save.output_dir, state.step);
  const fs::path tmp = dir.string() + ".tmp";
  const fs::path file = checkpoint_state_file(tmp.string());
  if (rank0) prepare_tmp_dir(save.output_dir, tmp);
  world.barrier();
  {
    io::Hdf5StateWriter out(file.string(), MPI_COMM_WORLD, kOutputDir);
    state.save(out);
    out.write_json("config", save.config);
    out.write_json("hf_config", save.hf_config);
    trigger_fault(save.fault, world.rank(), state.step, FaultInjection::Point::save_writing);
    out.close();
  }
  fsync_path(file); // each rank its own writes (a parallel file system caches per client)
  trigger_fault(save.fault, world.rank(), state.step, FaultInjection::Point::save_closed);
  world.barrier(); // every rank's rows are in the file
  if (rank0) {
    write_file(tmp / "config.toml", save.config_toml);
    write_file(tmp / "config.json", save.hf_config.dump(2) + "\n");
    model::copy_tokenizer_files(save.tokenizer_dir, tmp.string());
    for (const auto& [name, contents] : save.extra_files) write_file(tmp / name, contents);
    for (const auto& e : fs::directory_iterator(tmp)) fsync_path(e.path());
    publish(tmp, dir);
  }
  world.barrier();
  trigger_fault(save.fault, world.rank(), state.step, FaultInjection::Point::save_renamed);
  if (rank0) {
    point_latest_at(save.output_dir, dir.string());
    rotate_checkpoints(save.output_dir, save.keep_last);
  }
  world.barrier(); // no rank goes on (and may save again) before `latest` is updated
  return dir.string();
#else
  (void)state, (void)save, (void)world;
  return "";
#endif
}

nlohmann::json load_checkpoint(TrainState& state, const std::string& dir,
                               const nlohmann::json& hf_config, DType param_dtype) {
  check_hdf5_build();
#if VLM_WITH_HDF5
  VLM_CHECK(is_checkpoint_dir(dir), "checkpoint ", dir,
            ": not a checkpoint (a step_N folder holding state.h5)");
  try {
    const io::Hdf5StateReader in(checkpoint_state_file(dir), MPI_COMM_WORLD);
    check_same_model(in.read_json("hf_config"), hf_config, "/hf_config");
    const nlohmann::json config = in.read_json("config");
    const std::string saved_dtype = saved_param_dtype(config);
    VLM_CHECK(saved_dtype == dtype_name(param_dtype),
              "it was trained with training.param_dtype = \"", saved_dtype,
              "\" and this run has \"", dtype_name(param_dtype), "\"; resume with the same dtype");
    state.load(in);
    return config;
  } catch (const Error& e) {
    VLM_FAIL("checkpoint ", dir, ": ", e.what());
  }
#else
  (void)state, (void)dir, (void)hf_config, (void)param_dtype;
  return {};
#endif
}

void load_checkpoint_weights(model::CausalLM& model, const std::string& dir,
                             const std::map<std::string, parallel::ParamLayout>* layouts) {
  check_hdf5_build();
#if VLM_WITH_HDF5
  VLM_CHECK(is_checkpoint_dir(dir), "checkpoint ", dir,
            ": not a checkpoint (a step_N folder holding state.h5)");
  try {
    const io::Hdf5StateReader in(checkpoint_state_file(dir), MPI_COMM_SELF);
    check_same_model(in.read_json("hf_config"), model.hf_config(), "/hf_config");
    // Every tensor checked before any is read: its shape is the parameter's declared one (from
    // config.json), never one read from the file.
    std::set<std::string> names;
    for (const nn::ParameterSpec& p : model.parameter_specs()) {
      names.insert(p.name);
      io::check_state_tensor(in, "model/" + p.name, p.shape, std::nullopt); // any float
    }
    io::check_state_group(in, "model", names);
    if (!layouts) model.materialize();
    model::StoredTensors kept = model::read_stored_tensors(in);
    NoGradGuard no_grad;
    int64_t bytes_read = 0;
    for (const auto& p : model.named_parameters()) {
      const std::string key = exact_key(in, kept, p.name);
      const DType stored_dtype = in.dtype(key);
      // A master read into a bf16 parameter: a run starting from these weights seeds from it.
      const bool exact =
          key != "model/" + p.name && !model::holds_all_of(p.tensor.dtype(), DType::f32);
      Tensor dst = p.tensor;
      // This rank's boxes only, when it holds a part.
      if (const parallel::ParamLayout* layout = parallel::find_layout(layouts, p.name)) {
        for (const parallel::ParamBox& box : layout->boxes) {
          Tensor part = Tensor::empty(box.shape, stored_dtype);
          in.read_slab_into(key, box.global_offset, part);
          Tensor local = parallel::local_box(dst, box);
          copy_(local, part.to(dst.dtype()).to(dst.device()));
          bytes_read += int64_t(part.nbytes());
        }
        if (exact) { // an F32 island: few and small, kept whole like the HF loader's
          Tensor whole = Tensor::empty(in.shape(key), stored_dtype);
          in.read_tensor_into(key, whole);
          kept.exact[p.name] = whole;
        }
        continue;
      }
      Tensor stored = Tensor::empty(dst.shape(), stored_dtype);
      in.read_tensor_into(key, stored);
      copy_(dst, stored.to(dst.dtype()).to(dst.device()));
      bytes_read += int64_t(stored.nbytes());
      if (exact) kept.exact[p.name] = stored;
    }
    model.stored() = std::move(kept);
    log_info("loaded ", names.size(), " tensors from ", checkpoint_state_file(dir),
             layouts ? ", this rank's parts: " : ": ", double(bytes_read) / (1 << 20), " MiB read");
  } catch (const Error& e) {
    VLM_FAIL("checkpoint ", dir, ": ", e.what());
  }
#else
  (void)model, (void)dir, (void)layouts;
#endif
}

std::shared_ptr<model::CausalLM> load_checkpoint_model(const std::string& path, DType dtype,
                                                       const std::string& what) {
  const std::string dir = resolve_checkpoint_path(path, what);
  if (!is_checkpoint_dir(dir)) return model::load_pretrained(dir, dtype);
  std::shared_ptr<model::CausalLM> m =
      model::build_model(model::read_config_json(dir), dir + "/config.json", dtype);
  load_checkpoint_weights(*m, dir);
  return m;
}

} // namespace vlm::train
