#include "src/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "io/hdf5_state.h"
#include "model/hf_weights.h"
#include "model/model_spec.h"
#include "parallel/mpi_env.h"
#include "src/base/check.h"
#include "src/base/logging.h"
#include "src/core/autograd.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::train {

namespace fs = std::filesystem;

namespace {

const std::regex kStepName(R"(step_(\d+))");

int64_t step_of(const fs::path& dir) {
  std::smatch m;
  const std::string name = dir.filename().string();
  return std::regex_match(name, m, kStepName) ? std::stoll(m[1].str()) : -1;
}

void check_hdf5_build() {
  VLM_CHECK(io::hdf5_state_available(),
            "checkpoint.format = \"hdf5\": this build has no parallel HDF5 (it needs MPI and "
            "libhdf5-openmpi-dev; tools/install_deps.sh installs them)");
  parallel::mpi_world(); // MPI-IO needs MPI initialized (one process: a world of one)
}

// Flushes a file or folder to the storage device (a crash of the node must not lose the rename
// of a checkpoint whose data is still in the page cache).
void fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  VLM_CHECK(fd >= 0, "checkpoint: cannot open ", path.string(),
            " to flush it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  VLM_CHECK(rc == 0, "checkpoint: flushing ", path.string(), " failed: ", std::strerror(err));
}

void write_file(const fs::path& path, const std::string& contents) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << contents;
  f.close();
  VLM_CHECK(f, "checkpoint: cannot write ", path.string(), ": ", std::strerror(errno));
}

// Rank 0: an empty step_N.tmp, with every other leftover .tmp of a crashed save removed.
void prepare_tmp_dir(const fs::path& output_dir, const fs::path& tmp) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output_dir, ec))
    if (e.is_directory() && e.path().extension() == ".tmp" && step_of(e.path().stem()) >= 0)
      fs::remove_all(e.path(), ec);
  fs::create_directories(tmp, ec);
  VLM_CHECK(!ec, "checkpoint: cannot create ", tmp.string(), ": ", ec.message());
}

// Rank 0: step_N.tmp -> step_N (replacing an older step_N of an earlier run), then the folder
// entry flushed.
void publish(const fs::path& tmp, const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir)) { // saved again after resuming from an earlier step: the new one wins
    const fs::path old = dir.string() + ".old";
    fs::remove_all(old, ec);
    fs::rename(dir, old, ec);
    VLM_CHECK(!ec, "checkpoint: cannot move the existing ", dir.string(), " aside: ", ec.message());
    fs::remove_all(old, ec);
  }
  fs::rename(tmp, dir, ec);
  VLM_CHECK(!ec, "checkpoint: cannot rename ", tmp.string(), " to ", dir.string(), ": ",
            ec.message());
  fsync_path(dir.parent_path());
}

// Rank 0: `latest` -> step_N, replaced atomically; then the oldest beyond keep_last removed.
void update_latest_and_rotate(const fs::path& output_dir, const fs::path& dir, int64_t keep_last) {
  std::error_code ec;
  const fs::path link = output_dir / "latest", tmp_link = output_dir / "latest.tmp";
  fs::remove(tmp_link, ec);
  fs::create_directory_symlink(dir.filename(), tmp_link, ec);
  VLM_CHECK(!ec, "checkpoint: cannot create the link ", tmp_link.string(), ": ", ec.message());
  fs::rename(tmp_link, link, ec);
  VLM_CHECK(!ec, "checkpoint: cannot update ", link.string(), ": ", ec.message());
  if (keep_last <= 0) return;
  std::vector<std::string> all = list_checkpoints(output_dir.string());
  for (size_t i = 0; i + size_t(keep_last) < all.size(); i++) {
    if (fs::path(all[i]).filename() == dir.filename()) continue;
    fs::remove_all(all[i], ec);
    if (ec) log_warn("checkpoint: cannot remove the old ", all[i], ": ", ec.message());
  }
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

} // namespace

std::string checkpoint_step_dir(const std::string& output_dir, int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step_%06lld", (long long)step);
  return (fs::path(output_dir) / name).string();
}

std::string checkpoint_state_file(const std::string& dir) {
  return (fs::path(dir) / "state.h5").string();
}

bool is_checkpoint_dir(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path(); // "step_000004/"
  std::error_code ec;
  if (fs::is_symlink(p, ec)) p = fs::canonical(p, ec);
  return step_of(p) >= 0 && fs::is_regular_file(checkpoint_state_file(p.string()), ec);
}

std::vector<std::string> list_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    if (e.is_symlink() || !e.is_directory()) continue; // `latest` is not one more checkpoint
    if (is_checkpoint_dir(e.path().string())) found.emplace_back(step_of(e.path()), e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string resolve_resume(const std::string& resume, const std::string& output_dir) {
  if (resume.empty()) return "";
  if (resume == "latest") {
    const auto all = list_checkpoints(output_dir);
    return all.empty() ? "" : all.back();
  }
  if (is_checkpoint_dir(resume)) return fs::canonical(resume).string();
  std::error_code ec;
  VLM_CHECK(fs::is_directory(resume, ec), "config: checkpoint.resume = \"", resume,
            "\": no such folder");
  const auto all = list_checkpoints(fs::canonical(resume).string());
  VLM_CHECK(!all.empty(), "config: checkpoint.resume = \"", resume,
            "\" is not a checkpoint (a step_N folder holding state.h5) and holds none");
  return all.back();
}

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
    io::Hdf5StateWriter out(file.string(), MPI_COMM_WORLD);
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
  if (rank0) update_latest_and_rotate(save.output_dir, dir, save.keep_last);
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
  const io::Hdf5StateReader in(checkpoint_state_file(dir), MPI_COMM_WORLD);
  std::vector<std::string> diffs;
  diff_json(in.read_json("hf_config"), hf_config, "", diffs);
  if (!diffs.empty()) {
    std::string list;
    for (const std::string& d : diffs) list += "\n  " + d;
    VLM_FAIL("checkpoint ", dir, " was saved for another model (its config.json differs):", list);
  }
  const nlohmann::json config = in.read_json("config");
  const std::string saved_dtype = config.at("training").at("param_dtype").get<std::string>();
  VLM_CHECK(saved_dtype == dtype_name(param_dtype), "checkpoint ", dir,
            " was trained with training.param_dtype = \"", saved_dtype, "\" and this run has \"",
            dtype_name(param_dtype), "\"; resume with the same dtype");
  try {
    state.load(in);
  } catch (const Error& e) {
    VLM_FAIL("checkpoint ", dir, ": ", e.what());
  }
  return config;
#else
  (void)state, (void)dir, (void)hf_config, (void)param_dtype;
  return {};
#endif
}

void load_checkpoint_weights(model::CausalLM& model, const std::string& dir) {
  check_hdf5_build();
#if VLM_WITH_HDF5
  VLM_CHECK(is_checkpoint_dir(dir), "checkpoint ", dir,
            ": not a checkpoint (a step_N folder holding state.h5)");
  const io::Hdf5StateReader in(checkpoint_state_file(dir), MPI_COMM_SELF);
  model.materialize();
  NoGradGuard no_grad;
  try {
    for (const auto& p : model.named_parameters()) {
      const std::string key = "model/" + p.name;
      Tensor stored = Tensor::zeros(in.shape(key), in.dtype(key));
      in.read_tensor_into(key, stored);
      VLM_CHECK(stored.shape() == p.tensor.shape(), "'", key, "' holds shape ",
                shape_str(stored.shape()), " but this model's is ", shape_str(p.tensor.shape()));
      Tensor dst = p.tensor;
      copy_(dst, stored.to(p.tensor.dtype()));
    }
  } catch (const Error& e) {
    VLM_FAIL("checkpoint ", dir, ": ", e.what());
  }
#else
  (void)model, (void)dir;
#endif
}

} // namespace vlm::train
