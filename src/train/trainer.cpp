#include "src/train/trainer.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>

#include "io/image/processor_config.h"
#include "io/loader/loader.h"
#include "io/state/hdf5_state.h"
#include "io/text/tokenizer.h"
#include "kernels/attention_cudnn.h"
#include "model/hf_weights.h"
#include "model/model_spec.h"
#include "model/tokenizer_files.h"
#include "parallel/comm/mpi_env.h"
#include "parallel/comm/watchdog.h"
#include "parallel/parallelize.h"
#include "src/base/check.h"
#include "src/base/env.h"
#include "src/base/logging.h"
#include "src/core/allocator.h"
#include "src/core/autograd.h"
#include "src/core/ops/attention_cudnn.h"
#include "src/core/ops/shape_ops.h"
#include "src/demo/caption_eval.h"
#include "src/train/batches.h"
#include "src/train/checkpoint.h"
#include "src/train/model_setup.h"
#include "src/train/skip_ceiling.h"
#include "src/train/stop_signal.h"

namespace vlm::train {

namespace fs = std::filesystem;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What this build cannot do yet: refuse it at start rather than train something else.
void check_supported(const TrainConfig& c) {
  VLM_CHECK(c.checkpoint.format != CheckpointFormat::hdf5 || io::hdf5_state_available(),
            "config: checkpoint.format = \"hdf5\" (the default): this build has no parallel HDF5 "
            "(it needs MPI and libhdf5-openmpi-dev; tools/deps/install_deps.sh installs them); set "
            "checkpoint.format = \"safetensors\" for HF snapshots, which cannot resume a run");
  VLM_CHECK(!c.data.data_path.empty(), "config: data.data_path is required");
  VLM_CHECK(!c.model.tokenizer.empty(),
            "config: model.tokenizer is required (with model.preset there is no snapshot to take "
            "it from)");
}

// The output folder is created and written to before step 1: a typo'd or read-only path must not
// be found at the first save, after hours of training.
void check_writable_dir(const std::string& dir, const char* key) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  VLM_CHECK(!ec, "config: ", key, " = \"", dir, "\": cannot create the folder: ", ec.message());
  const fs::path probe = fs::path(dir) / ".vlmtrain-write-test";
  {
    std::ofstream out(probe, std::ios::binary | std::ios::trunc);
    out << "probe\n";
    out.flush();
    VLM_CHECK(out.good(), "config: ", key, " = \"", dir,
              "\": cannot write in the folder: ", std::strerror(errno));
  }
  fs::remove(probe, ec);
}

const char* signal_name(int sig) {
  return sig == SIGTERM   ? "SIGTERM"
         : sig == SIGINT  ? "SIGINT"
         : sig == SIGUSR1 ? "SIGUSR1"
                          : "a signal";
}

std::string tokenizer_dir(const std::string& path) {
  return fs::is_directory(path) ? path : fs::path(path).parent_path().string();
}

// Where the starting weights come from.
enum class WeightSource { init, checkpoint, hf_snapshot };

WeightSource weight_source(const TrainConfig& c) {
  if (c.training.random_init || !c.model.preset.empty()) return WeightSource::init;
  // The weights of a checkpoint, not its state.
  if (is_checkpoint_dir(c.model.model_dir)) return WeightSource::checkpoint;
  return WeightSource::hf_snapshot;
}

// Where a run reads its model's description and tokenizer: the config's (a preset and
// model.tokenizer, or the HF snapshot in model.model_dir) for a new run; a resumed run reads its
// checkpoint alone — the checkpoint's config.json (the config the run was described from,
// written with every save) and its copy of the tokenizer — and never opens model.model_dir,
// which may be gone.
TrainConfig model_sources(TrainConfig c, const std::string& resumed_from) {
  if (resumed_from.empty()) return c;
  if (c.model.preset.empty()) c.model.model_dir = resumed_from;
  if (fs::exists(fs::path(resumed_from) / "tokenizer.json")) c.model.tokenizer = resumed_from;
  return c;
}

// A new run from an HF snapshot: a model.model_dir that is not there is said as such, with where
// snapshots come from (not as the first file some reader misses).
void check_model_dir(const TrainConfig& c) {
  if (!c.model.preset.empty()) return;
  VLM_CHECK(fs::is_directory(c.model.model_dir), "config: model.model_dir = \"", c.model.model_dir,
            "\" is not a folder: download the HF snapshot on a login node (`hf download <repo> "
            "--local-dir DIR`) and check it there with `vlmtrain check-model DIR`");
}

// Describes the model (a preset, the snapshot's or the checkpoint's config.json) and freezes what
// the config freezes (before FSDP: frozen parameters are not sharded). Nothing is allocated yet:
// the weights fill the model after parallelize(), each rank its own parts (fill_weights).
std::shared_ptr<model::CausalLM> describe_for_training(const TrainConfig& c,
                                                       const io::Tokenizer& tok) {
  std::shared_ptr<model::CausalLM> m = describe_model(c, tok);
  VLM_CHECK(tok.vocab_size() <= m->vocab_size(), "the tokenizer '", c.model.tokenizer, "' has ",
            tok.vocab_size(), " tokens but the model's vocab_size is ", m->vocab_size());
  apply_freezing(c, *m);
  return m;
}

// Initializes or loads the parallelized model's parts (`layouts`: those not whole on this rank):
// the same values on every rank as one process would have, drawn or read by parts.
void fill_weights(const TrainConfig& c, model::CausalLM& m,
                  const std::map<std::string, parallel::ParamLayout>& layouts, Rng& rng) {
  switch (weight_source(c)) {
  case WeightSource::init: m.initialize(rng, parallel::init_parts(layouts)); return;
  case WeightSource::hf_snapshot:
    m.stored() = model::load_hf_weights(m, c.model.model_dir, m.carried_prefixes(), &layouts);
    return;
  case WeightSource::checkpoint: load_checkpoint_weights(m, c.model.model_dir, &layouts); return;
  }
}

// micro_batch_rows rows from the loader as one micro-batch, with the rows' token counts and
// FLOPs; nullopt when the data ended first.
struct MicroBatch {
  model::Batch batch;
  int64_t real_tokens = 0, padded_tokens = 0;
  double flops = 0;
};

std::optional<MicroBatch> next_micro_batch(io::DataLoader& loader, int64_t rows,
                                           const model::CausalLM& m, Device device) {
  std::vector<io::PackedRow> got;
  MicroBatch mb;
  for (int64_t r = 0; r < rows; r++) {
    auto row = loader.next();
    if (!row) return std::nullopt;
    mb.real_tokens += row->real_tokens;
    mb.padded_tokens += row->pad_tokens;
    mb.flops += m.training_flops(row->cu_seqlens, row->num_docs, row->image_grid_thw).total();
    got.push_back(std::move(*row));
  }
  model::Batch host = batch_from_rows(got);
  model::validate_batch(host, m.vocab_size()); // on the host, so no kernel checks on the device
  mb.batch = model::to_device(host, device);
  return mb;
}

} // namespace

// The data side: the tokenizer, the training loader and how to open the validation loader.
struct Trainer::Data {
  io::Tokenizer tokenizer;
  std::unique_ptr<io::DataLoader> train;
  std::string tokenizer_path; // where `tokenizer` was read (model_sources)
  std::vector<int> pattern;   // micro-steps per optimizer step
  bool vision = false;        // the model takes images: the loader keeps them
  int64_t dp_rank = 0, dp_world = 1;

  io::LoaderConfig config(const TrainConfig& c, const std::string& split, bool training) const {
    io::LoaderConfig l = loader_config(c, tokenizer, tokenizer_path, split, training, vision);
    l.dp_rank = dp_rank;
    l.dp_world = dp_world;
    return l;
  }
  // Validation data is read from its beginning at every evaluation.
  std::unique_ptr<io::DataLoader> open_val(const TrainConfig& c) const {
    return std::make_unique<io::DataLoader>(config(c, c.data.val_split, false), tokenizer);
  }
};

namespace {

// A bf16 run's fp32 masters start from the exact stored values of the tensors its parameters
// round (an F32 A_log in a bf16 model: model/stored_tensors.h), this rank's boxes of each when
// it holds a part; the host copies are dropped then.
void seed_masters(model::CausalLM& m, optim::AdamW& optimizer,
                  const std::map<std::string, parallel::ParamLayout>& layouts) {
  NoGradGuard no_grad;
  for (const auto& [name, value] : m.stored().exact) {
    if (!optimizer.has_state(name) || !optimizer.state(name).master.defined()) continue; // frozen
    Tensor master = optimizer.state(name).master;
    auto it = layouts.find(name);
    if (it == layouts.end()) {
      copy_(master, value.to(DType::f32).to(master.device()));
      continue;
    }
    for (const parallel::ParamBox& box : it->second.boxes) { // an FSDP shard's padding stays
      Tensor dst = parallel::local_box(master, box);
      copy_(dst, parallel::global_box(value, box).to(DType::f32).to(master.device()));
    }
  }
  m.stored().exact.clear();
}

// "cuda" is this rank's GPU among its node's (one GPU per rank); "cuda:N" is taken as written.
Device rank_device(const std::string& text, int local_rank) {
  Device d = parse_device(text);
  if (text == "cuda" && d.is_cuda() && cuda_device_count() > 0)
    d = parse_device("cuda:" + std::to_string(local_rank % cuda_device_count()));
  return d;
}

parallel::ParallelizeOptions parallelize_options(const TrainConfig& c) {
  const ParallelOptions& p = c.parallel;
  parallel::ParallelizeOptions o;
  o.ac = c.training.ac_mode;
  o.sequence_parallel = p.sequence_parallel;
  o.fsdp.reshard_after_forward = p.reshard_after_forward;
  o.fsdp.reduce_dtype = p.reduce_dtype;
  o.fsdp.reduce_every_micro_step =
      p.grad_reduce == GradReduce::every_micro_step ||
      (p.grad_reduce == GradReduce::automatic && p.data_parallel == DataParallel::fsdp);
  return o;
}

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1 << 20));
  return buf;
}

} // namespace

Trainer::Trainer(const TrainConfig& c) : config_(c) {
  check_supported(c);
  const parallel::MpiWorld& world = parallel::mpi_world();
  parallel::set_collective_timeout(c.parallel.collective_timeout_s);
  const parallel::MeshShape shape = parallel::resolve_mesh_shape(
      world.size, c.parallel.dp_replicate, c.parallel.dp_shard, c.parallel.tp_size,
      c.parallel.data_parallel == DataParallel::fsdp);
  mesh_ = std::make_unique<parallel::DeviceMesh>(parallel::world_group(), shape);
  device_ = rank_device(c.training.device, world.local_rank);
  if (rank0()) { // before anything else: a run never replaces another run's checkpoints
    check_writable_dir(c.checkpoint.output_dir, "checkpoint.output_dir");
    check_run_folder(c.checkpoint.output_dir, c.checkpoint.resume, c.logging.metrics_file);
  }
  const TrainingOptions& t = c.training;
  start_seconds_ = now_seconds();
  check_device_available(device_, "config: training.device");
  // Every communicator the mesh needs, now and watched, not inside the first step's collectives.
  if (device_.is_cuda()) mesh_->connect(device_);
  // The first forward builds and checks every cuDNN attention plan of the text model's rows level
  // (kernels/attention_cudnn.h): the one before the first step below, so no step stalls on one.
  kernels::cudnn_attention::Settings attention = kernels::cudnn_attention::settings();
  attention.build_whole_set = true;
  kernels::cudnn_attention::set_settings(attention);

  // checkpoint.resume first: a resumed run reads the checkpoint alone (model_sources), and its
  // weights, masters and moments only from the checkpoint's state.h5 (resume() below).
  resumed_from_ = resolve_resume(c.checkpoint.resume, c.checkpoint.output_dir);
  if (resumed_from_.empty()) check_model_dir(c);
  const TrainConfig sources = model_sources(c, resumed_from_);
  data_ = std::make_unique<Data>(
      Data{io::Tokenizer::from_file(sources.model.tokenizer), {}, sources.model.tokenizer, {}});
  // Written into every checkpoint and snapshot this run saves, read once.
  tokenizer_files_ = model::read_tokenizer_files(tokenizer_dir(sources.model.tokenizer));
  data_->dp_rank = mesh_->dp_rank();
  data_->dp_world = shape.dp();
  state_.rng = Rng(uint64_t(t.seed));
  // Describe -> shard -> allocate -> load (DESIGN.md §2.1): tensor parallelism by the family's
  // plan, activation checkpointing, FSDP when there is more than one data-parallel rank, on the
  // device; then each rank fills only its parts (the same values on every rank as one process):
  // drawn or read from model.model_dir for a new run, read from the checkpoint by resume().
  model_ = describe_for_training(sources, data_->tokenizer);
  parallel::ParallelizeOptions options = parallelize_options(c);
  if (shape.tp > 1) options.tp_plan = model::tp_plan(*model_);
  parallel_ = parallel::parallelize(*model_, model_->blocks(), *mesh_, options, device_);
  state_.layouts = parallel_.param_layouts();
  if (resumed_from_.empty()) fill_weights(c, *model_, state_.layouts, state_.rng);
  if (const parallel::TensorParallel* tp = parallel_.tensor_parallel();
      tp && !tp->left_whole().empty() && rank0())
    log_info("tensor parallel: ", tp->left_whole().size(), " projections left whole on every rank ",
             "(their heads or rows do not split over tp = ", shape.tp, "), e.g. ",
             tp->left_whole().front());
  peak_tflops_ = c.logging.peak_tflops > 0 ? c.logging.peak_tflops : device_peak_tflops(device_);
  peak_tflops_ *= double(shape.world()); // the job's peak: MFU counts every rank's FLOPs
  stepper_ = std::make_unique<TrainStepper>(c, model_, parallel_);
  data_->pattern = accumulation_pattern(t.tpi_multiplier);
  data_->vision = model_->has_vision();
  data_->train = std::make_unique<io::DataLoader>(data_->config(c, c.data.train_split, true),
                                                  data_->tokenizer);
  if (t.eval_steps > 0) data_->open_val(c); // a missing val split fails now, not after hours

  state_.model = model_.get();
  state_.optimizer = &stepper_->optimizer();
  state_.schedule = &stepper_->schedule();
  state_.loader = data_->train.get();
  state_.dp = dp_group();
  if (resumed_from_.empty()) seed_masters(*model_, stepper_->optimizer(), state_.layouts);
  resume();
  metrics_ = std::make_unique<MetricsLog>(rank0() ? c.logging.metrics_file : "",
                                          resumed_from_.empty() ? -1 : state_.step);

  announce_and_warm_up(shape);
  train_start_seconds_ = now_seconds();
}

void Trainer::announce_and_warm_up(const parallel::MeshShape& shape) {
  const TrainConfig& c = config_;
  const TrainingOptions& t = c.training;
  if (rank0())
    log_info("train: ", c.model.model_name.empty() ? model_->summary() : c.model.model_name, ", ",
             model_->num_parameters(), " parameters (", dtype_name(t.param_dtype), "), ",
             t.total_steps, " steps on ", device_.str(), " of ", c.data.seq_len, "-token rows x ",
             t.micro_batch_rows, " x tpi ", t.tpi_multiplier, ", data ", c.data.data_path);
  if (rank0() && device_.is_cuda()) log_info(ops_detail::attention_backend_summary(device_));
  if (device_.is_cuda()) {
    // One forward without gradients on a micro-batch of the run's shape: the text attention's
    // cuDNN plans (the whole set of the run's rows level) are built and self-checked now, so the
    // first step does not stall on them. Every rank runs it (FSDP gathers in the forward).
    const int64_t plans = kernels::cudnn_attention::cuda::plans_built();
    const double t0 = now_seconds();
    stepper_->evaluate({model::to_device(shape_batch(c, model_->has_vision()), device_)});
    if (rank0())
      log_info("attention: ", kernels::cudnn_attention::cuda::plans_built() - plans,
               " cuDNN plans built and checked before the first step (", now_seconds() - t0,
               " s, a forward on a batch of the run's shape)");
  }
  if (shape.world() > 1) log_memory();
}

void Trainer::resume() {
  const CheckpointOptions& ck = config_.checkpoint;
  if (resumed_from_.empty()) {
    if (!ck.resume.empty() && rank0())
      log_info("resume: no checkpoint in ", ck.output_dir, " yet; starting from step 0");
    return;
  }
  const nlohmann::json saved =
      load_checkpoint(state_, resumed_from_, model_->hf_config(), config_.training.param_dtype);
  saved_step_ = state_.step;
  mesh_->world().barrier(); // every rank has read it before rank 0 moves a newer branch aside
  if (!rank0()) return;
  abandon_newer(ck.output_dir, resumed_from_, config_.logging.metrics_file);
  if (done())
    log_info("resume: ", resumed_from_, " is the end of the run (step ", state_.step, " of ",
             config_.training.total_steps, "): nothing left to train");
  std::vector<std::string> changes; // what this run changes (the checks above allowed it)
  const nlohmann::json now = to_json(config_);
  for (const auto& [section, keys] : now.items())
    for (const auto& [key, value] : keys.items())
      if (saved.contains(section) && saved[section].contains(key) && saved[section][key] != value &&
          !(section == "checkpoint" && key == "resume"))
        changes.push_back(section + "." + key + " " + saved[section][key].dump() + " -> " +
                          value.dump());
  std::string changed;
  for (const std::string& ch : changes) changed += (changed.empty() ? "" : ", ") + ch;
  log_info("resume: from ", resumed_from_, " at step ", state_.step, " of ",
           config_.training.total_steps, " (", state_.tokens, " tokens trained)",
           changed.empty() ? "" : "; changed since: " + changed);
  if (config_.model.preset.empty())
    log_info(
        "resume: the model's config.json, tokenizer, weights and optimizer state all read from ",
        resumed_from_, "; model.model_dir (", config_.model.model_dir, ") is not read");
}

parallel::ProcessGroup* Trainer::dp_group() const {
  return mesh_->shape().dp() > 1 ? &mesh_->dp() : nullptr;
}

void Trainer::log_memory() const {
  // What this rank holds against what one process would hold for the same model: every
  // parameter whole, a gradient for each trainable one, AdamW's state for the whole of them.
  int64_t optim_bytes = 0, optim_elements = 0;
  for (const std::string& name : stepper_->optimizer().param_names()) {
    const optim::AdamWState& st = stepper_->optimizer().state(name);
    optim_bytes += int64_t(st.exp_avg.nbytes() + st.exp_avg_sq.nbytes() +
                           (st.master.defined() ? st.master.nbytes() : 0));
    optim_elements += st.exp_avg.numel();
  }
  int64_t params = 0, grads = 0, full = 0, full_trainable = 0;
  for (const auto& p : model_->named_parameters()) {
    const auto layout = state_.layouts.find(p.name);
    const int64_t whole =
        layout == state_.layouts.end() ? p.tensor.numel() : numel(layout->second.full_shape);
    const int64_t grad_size = p.tensor.requires_grad() ? dtype_size(p.tensor.grad_dtype()) : 0;
    params += int64_t(p.tensor.nbytes());
    grads += p.tensor.numel() * grad_size;
    full += whole * (dtype_size(p.tensor.dtype()) + grad_size);
    if (p.tensor.requires_grad()) full_trainable += whole;
  }
  if (parallel_.fsdp()) { // its flat buffers (padding, unsharded accumulation buffers included)
    const parallel::FsdpMemory m = parallel_.fsdp()->memory();
    params = m.param_bytes;
    grads = m.grad_bytes;
  }
  // AdamW keeps 2 (f32) or 3 (bf16: + master) fp32 values per trainable element.
  if (optim_elements > 0) full += optim_bytes * full_trainable / optim_elements;
  const int64_t here = params + grads + optim_bytes;
  const parallel::MeshShape& sh = mesh_->shape();
  if (rank0())
    log_info("parallel: ", sh.str(), " (", data_parallel_name(config_.parallel.data_parallel),
             config_.parallel.sequence_parallel ? ", sequence parallel" : "", "); parameters ",
             mib(params), " + gradients ", mib(grads), " + AdamW state ", mib(optim_bytes), " = ",
             mib(here), " per rank; one process would hold ", mib(full), " (",
             full > 0 ? double(here) / double(full) : 0.0,
             " of it; 1/(dp_shard x tp) = ", 1.0 / double(sh.dp_shard * sh.tp), ")");
}

void Trainer::set_fault_injection(const FaultInjection& fault) {
  check_fault_injection(fault, mesh_->world().size(), state_.step, config_.training.total_steps,
                        config_.checkpoint.save_steps);
  fault_ = fault;
  stepper_->set_fault_injection(fault, mesh_->world().rank());
}

Trainer::~Trainer() = default;

bool Trainer::done() const { return state_.step >= config_.training.total_steps; }

std::vector<model::Batch> Trainer::next_step_batches(int64_t step, StepRecord& rec) {
  const TrainingOptions& t = config_.training;
  const int micro = data_->pattern[size_t(step) % data_->pattern.size()];
  std::vector<model::Batch> batches;
  bool ended = false;
  for (int m = 0; m < micro && !ended; m++) {
    auto mb = next_micro_batch(*data_->train, t.micro_batch_rows, *model_, device_);
    if (!mb) {
      ended = true;
      break;
    }
    rec.real_tokens += mb->real_tokens;
    rec.padded_tokens += mb->padded_tokens;
    rec.flops += mb->flops;
    batches.push_back(std::move(mb->batch));
  }
  // Every rank stops together: one whose share ended first must not leave the others waiting.
  const int64_t ranks_ended =
      dp_group() ? dp_group()->all_reduce_value(int64_t(ended)) : int64_t(ended);
  VLM_CHECK(ranks_ended == 0, "train step ", step + 1, ": data.train_split '",
            config_.data.train_split, "' ended (data.epochs = ", config_.data.epochs,
            ") before training.total_steps = ", t.total_steps,
            dp_group() ? " on " + std::to_string(ranks_ended) + " data-parallel rank(s)" : "");
  return batches;
}

void Trainer::count_step_data(StepRecord& rec) {
  rec.samples_read = data_->train->samples_read();
  rec.skips = data_->train->report();
  check_skip_ceiling(rec.skips, rec.samples_read, config_.data.max_skip_fraction,
                     config_.data.train_split);
  if (!rank0() && rec.skips.total() != summary_.skipped_samples) { // rank 0 has its progress line
    std::printf("%s%s\n", rank_prefix().c_str(), skip_summary_line(rec.skips).c_str());
    std::fflush(stdout);
    summary_.skipped_samples = rec.skips.total();
  }
  if (dp_group()) { // the step's tokens and FLOPs over every data-parallel rank
    Tensor counts = Tensor::from_vector(
        std::vector<double>{double(rec.real_tokens), double(rec.padded_tokens), rec.flops}, {3});
    dp_group()->all_reduce(counts);
    const double* v = counts.data<double>();
    rec.real_tokens = int64_t(v[0]);
    rec.padded_tokens = int64_t(v[1]);
    rec.flops = v[2];
  }
}

void Trainer::log_progress(const StepRecord& rec) {
  const int64_t done_steps = state_.step, trained_here = done_steps - first_step_;
  if (done_steps % config_.logging.log_every != 0 && !done()) return;
  const double mean = window_.mean_loss();
  if (trained_here <= config_.logging.log_every) summary_.first_loss = mean;
  summary_.last_loss = mean;
  const double spent = now_seconds() - train_start_seconds_;
  const int64_t total = config_.training.total_steps;
  const double eta = spent / double(trained_here) * double(total - done_steps);
  std::string line = window_.line(done_steps, total, eta);
  if (rec.skips.total() != summary_.skipped_samples) // new skips since the last line
    line += " | " + skip_summary_line(rec.skips);
  summary_.skipped_samples = rec.skips.total();
  if (config_.logging.progress && rank0()) std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  window_ = ProgressWindow();
}

StepRecord Trainer::train_step() {
  const TrainingOptions& t = config_.training;
  VLM_CHECK(!done(), "train: all ", t.total_steps, " steps are done");
  const int64_t step = state_.step;
  const double step_start = now_seconds();
  StepRecord rec;
  const std::vector<model::Batch> batches = next_step_batches(step, rec);
  count_step_data(rec);
  stepper_->set_skipped_steps(state_.skipped_steps);
  rec.stats = stepper_->step(step, batches);
  state_.skipped_steps = stepper_->skipped_steps();
  state_.step = step + 1;
  state_.tokens += rec.real_tokens;
  state_.padded_tokens += rec.padded_tokens;

  const double now = now_seconds();
  rec.seconds = now - step_start;
  rec.elapsed = now - start_seconds_;
  rec.peak_memory_bytes = int64_t(allocator_for(device_).stats().peak_bytes);
  rec.peak_tflops = peak_tflops_;
  metrics_->write_step(rec);
  summary_.real_tokens += rec.real_tokens;
  summary_.padded_tokens += rec.padded_tokens;
  window_.add(rec);
  log_progress(rec);

  const int64_t done_steps = state_.step;
  const bool last = done();
  if (t.eval_steps > 0 && (done_steps % t.eval_steps == 0 || last)) evaluate();
  if ((last && config_.checkpoint.save_final) ||
      (config_.checkpoint.save_steps > 0 && done_steps % config_.checkpoint.save_steps == 0))
    save_checkpoint();
  return rec;
}

double Trainer::evaluate() {
  const TrainingOptions& t = config_.training;
  auto val = data_->open_val(config_);
  // One micro-batch at a time: eval_batches = 0 (the whole split) must not hold the split.
  double loss_sum = 0;
  int64_t targets = 0, batches = 0;
  for (; t.eval_batches == 0 || batches < t.eval_batches; batches++) {
    auto mb = next_micro_batch(*val, t.micro_batch_rows, *model_, device_);
    // As many micro-batches on every rank (FSDP gathers in each forward): the fewest any has.
    if (dp_group() && dp_group()->all_reduce_value(int64_t(!mb)) > 0) break;
    if (!mb) break;
    auto [sum, n] = stepper_->evaluate({mb->batch});
    loss_sum += sum;
    targets += n;
  }
  VLM_CHECK(batches > 0, "eval: data.val_split '", config_.data.val_split,
            "' gave no complete micro-batch of ", t.micro_batch_rows, " rows",
            dp_group() ? " on some data-parallel rank" : "");
  if (dp_group()) {
    loss_sum = dp_group()->all_reduce_value(loss_sum);
    targets = dp_group()->all_reduce_value(targets);
  }
  const double loss = targets > 0 ? loss_sum / double(targets) : 0.0;
  summary_.eval_loss = loss;
  metrics_->write_eval(state_.step, loss, targets);
  std::string skips = skip_summary_line(val->report()); // the val split's bad samples
  if (config_.logging.progress && rank0())
    std::printf("eval  %lld/%lld | loss %.4f | ppl %.2f | %lld tokens%s%s\n",
                (long long)state_.step, (long long)t.total_steps, loss, std::exp(loss),
                (long long)targets, skips.empty() ? "" : " | ", skips.c_str());
  return loss;
}

io::ImageProcessorConfig Trainer::image_config() const {
  io::ImageProcessorConfig image;
  image.min_pixels = config_.data.min_pixels;
  image.max_pixels = config_.data.max_pixels;
  return image;
}

void Trainer::caption_accuracy() {
  const DataOptions& d = config_.data;
  VLM_CHECK(model_->has_vision(),
            "config: training.caption_eval_images = ", config_.training.caption_eval_images,
            " needs a vision model");
  // Rank 0 generates with the whole model; the others wait (the demo's eval takes seconds).
  parallel_.unshard_all();
  if (!rank0()) { // the accuracy comes from rank 0 (the others hold -1)
    summary_.caption_accuracy = mesh_->world().all_reduce_value(-1.0, parallel::ReduceOp::max);
    parallel_.reshard_all();
    return;
  }
  const demo::CaptionAccuracy a =
      demo::evaluate_demo_captions(*model_, data_->tokenizer, d.data_path, d.val_split,
                                   image_config(), config_.training.caption_eval_images, device_);
  if (mesh_->world().size() > 1)
    mesh_->world().all_reduce_value(a.images > 0 ? a.accuracy() : -1.0, parallel::ReduceOp::max);
  parallel_.reshard_all();
  if (a.skipped > 0)
    log_info("caption accuracy: ", a.skipped, " bad samples skipped; the first: ", a.first_skip);
  VLM_CHECK(a.images > 0, "caption accuracy: data.val_split '", d.val_split,
            "' has no image sample with a demo caption",
            a.skipped > 0 ? " that could be read (" + std::to_string(a.skipped) + " skipped)" : "");
  summary_.caption_accuracy = a.accuracy();
  for (const auto& ex : a.examples)
    std::printf("caption %s | truth: %s | model: %s\n", ex.correct ? "right" : "wrong",
                ex.truth.c_str(), ex.generated.c_str());
  std::printf("caption accuracy on %lld held-out images: %.1f%% (colour %.1f%%, shape %.1f%%; "
              "chance <= 9.4%%)\n",
              (long long)a.images, 100.0 * a.accuracy(),
              100.0 * double(a.colour_correct) / double(a.images),
              100.0 * double(a.shape_correct) / double(a.images));
  std::fflush(stdout);
}

void Trainer::save_checkpoint() {
  saved_step_ = state_.step;
  const CheckpointOptions& ck = config_.checkpoint;
  if (ck.format == CheckpointFormat::hdf5) {
    CheckpointSave save;
    save.output_dir = ck.output_dir;
    save.keep_last = ck.keep_last;
    save.config = to_json(config_);
    save.config_toml = to_toml(config_);
    save.hf_config = model_->hf_config();
    save.extra_files = tokenizer_files_;
    if (model_->has_vision())
      save.extra_files["preprocessor_config.json"] = io::image_processor_json(image_config());
    save.fault = fault_;
    const double start = now_seconds();
    summary_.final_checkpoint = vlm::train::save_checkpoint(state_, save, mesh_->world());
    if (rank0())
      log_info("saved ", summary_.final_checkpoint, " in ", format_duration(now_seconds() - start));
    if (ck.hf_snapshot == HfSnapshot::every_save || (ck.hf_snapshot == HfSnapshot::final && done()))
      save_hf_snapshot();
    return;
  }
  summary_.final_checkpoint = save_hf_snapshot();
}

const Tensor& Trainer::snapshot_source(const std::string& name, const Tensor& param) const {
  const optim::AdamW& optimizer = stepper_->optimizer();
  const auto stored = model_->stored().dtypes.find(name);
  if (stored == model_->stored().dtypes.end() ||
      model::holds_all_of(config_.training.param_dtype, stored->second) ||
      !optimizer.has_state(name) || !optimizer.state(name).master.defined())
    return param;
  return optimizer.state(name).master;
}

std::string Trainer::save_hf_snapshot() {
  const std::string dir = hf_snapshot_dir(config_.checkpoint.output_dir, state_.step);
  // A VLM snapshot records the image sizes it was trained on (`vlmtrain generate` reads them).
  std::map<std::string, std::string> extra = tokenizer_files_;
  if (model_->has_vision())
    extra["preprocessor_config.json"] = io::image_processor_json(image_config());
  // Block by block: each parameter's rows are gathered to rank 0 from the parts its ranks write
  // (parallel::gather_param_rows, in host memory), written and dropped, so no rank ever holds the
  // whole model, nor a whole tensor it does not hold anyway. Rank 0 writes; the others send their
  // parts of the same blocks in the same order (model::snapshot_pieces).
  const model::StoredTensors& stored = model_->stored();
  const std::vector<nn::NamedParameter> params = model_->named_parameters();
  const std::vector<model::SnapshotTensor> tensors = model::snapshot_tensors(
      *model_, config_.training.param_dtype, &stored,
      [this](const std::string& name) -> std::optional<Shape> {
        const parallel::ParamLayout* layout = parallel::find_layout(&state_.layouts, name);
        return layout ? std::optional<Shape>(layout->full_shape) : std::nullopt;
      });
  parallel::ProcessGroup& world = mesh_->world();
  auto fetch = [&](size_t i, int64_t row_begin, int64_t row_end) -> Tensor {
    if (i >= params.size()) // carried tensors are whole on every rank
      return model::snapshot_rows(stored.carried.at(tensors[i].name), row_begin, row_end);
    const std::string& name = params[i].name;
    return parallel::gather_param_rows(name, snapshot_source(name, params[i].tensor),
                                       parallel::find_layout(&state_.layouts, name), world, 0,
                                       row_begin, row_end);
  };
  if (rank0()) {
    model::save_hf_snapshot(tensors, fetch, model_->hf_config(), dir, config_.training.param_dtype,
                            "", model::kDefaultMaxShardBytes, extra);
    log_info("saved ", dir);
  } else {
    for (const model::SnapshotPiece& piece : model::snapshot_pieces(tensors))
      fetch(piece.index, piece.row_begin, piece.row_end);
  }
  if (world.size() > 1) world.barrier(); // saved before any rank goes on
  summary_.hf_snapshot = dir;
  return dir;
}

TrainSummary Trainer::run() {
  first_step_ = state_.step;
  train_start_seconds_ = now_seconds();
  StopSignals signals;
  while (!done()) {
    train_step();
    int sig = StopSignals::received();
    if (mesh_->world().size() > 1) // every rank stops after the same step
      sig = int(mesh_->world().all_reduce_value(int64_t(sig), parallel::ReduceOp::max));
    if (sig != 0 && !done()) {
      summary_.stop_signal = sig;
      if (rank0())
        std::printf("train: %s received: stopping after step %lld of %lld\n", signal_name(sig),
                    (long long)state_.step, (long long)config_.training.total_steps);
      std::fflush(stdout);
      if (saved_step_ != state_.step) save_checkpoint();
      break;
    }
  }
  if (config_.training.caption_eval_images > 0 && !summary_.stop_signal) caption_accuracy();
  summary_.steps = state_.step;
  summary_.skipped_steps = state_.skipped_steps;
  summary_.seconds = now_seconds() - start_seconds_;

  const TrainSummary& s = summary_;
  const double train_s = now_seconds() - train_start_seconds_;
  const MemoryStats mem = allocator_for(device_).stats();
  summary_.peak_rss_bytes =
      mesh_->world().all_reduce_value(peak_rss_bytes(), parallel::ReduceOp::max);
  if (!rank0()) return s;
  std::printf("train done: %lld steps in %s, loss %.4f -> %.4f", (long long)s.steps,
              format_duration(s.seconds).c_str(), s.first_loss, s.last_loss);
  if (s.eval_loss >= 0)
    std::printf(", eval loss %.4f (ppl %.2f)", s.eval_loss, std::exp(s.eval_loss));
  std::printf("\n  %lld real tokens (%.1f%% padding), %.0f tokens/s, peak tensor memory %.1f MiB, "
              "peak RSS %.1f MiB (the largest rank's), %lld skipped steps\n  checkpoint "
              "%s%s%s, metrics %s\n",
              (long long)s.real_tokens,
              100.0 * double(s.padded_tokens) /
                  double(std::max<int64_t>(1, s.real_tokens + s.padded_tokens)),
              double(s.real_tokens) / std::max(train_s, 1e-9), double(mem.peak_bytes) / (1 << 20),
              double(s.peak_rss_bytes) / (1 << 20), (long long)s.skipped_steps,
              s.final_checkpoint.empty() ? "none" : s.final_checkpoint.c_str(),
              s.hf_snapshot.empty() || s.hf_snapshot == s.final_checkpoint ? "" : ", HF snapshot ",
              s.hf_snapshot == s.final_checkpoint ? "" : s.hf_snapshot.c_str(),
              config_.logging.metrics_file.c_str());
  if (const std::string skips = data_->train->report().summary(); !skips.empty())
    std::printf("  data: %lld samples read, %s", (long long)data_->train->samples_read(),
                skips.c_str());
  return s;
}

TrainSummary run_training(const TrainConfig& config, const FaultInjection& fault) {
  Trainer trainer(config);
  trainer.set_fault_injection(fault);
  return trainer.run();
}

} // namespace vlm::train
