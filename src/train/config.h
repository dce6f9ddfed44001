// The TOML training config of `vlmtrain train --config FILE [--set section.key=value ...]`
// (DESIGN.md §9). Sections [model] [training] [data] [parallel] [checkpoint] [logging]; the
// reference trainer's keys keep their names and meanings (docs/reference-trainer.md §2) with its
// bugs fixed (§9: max_grad_norm is applied, eps is used, LR groups are honoured, ...).
//
// Every key is one line of the tables below: X(type, name, default, bounds, help). That line is
// the key's documentation, its help text (train_config_keys(), configs/README.md), its valid
// range and its member in the section struct, so they cannot drift apart.
//
// Parsing (parse_train_config / load_train_config):
//   1. the file, section by section; every key is type-checked (ints for integer keys, ints or
//      floats for float keys, booleans, strings; enums by name, case-insensitive);
//   2. the --set overrides "section.key=value" in order, the value parsed by the key's type;
//   3. resolve_defaults: model.tokenizer "" -> model.model_dir, logging.metrics_file "" ->
//      checkpoint.output_dir/metrics.jsonl, a preset implies training.random_init = true;
//   4. validate_train_config: value ranges and cross-key rules.
// Errors are vlm::Error "config SOURCE: line N: ..." (SOURCE is the file or "--set") naming the
// key and the value; an unknown section or key names the closest valid key by edit distance,
// also across sections ("training.tp_size" -> "parallel.tp_size").
//
// Reference spellings accepted as aliases: training.bfloat16 = true|false (= param_dtype bf16|f32),
// training.eps (= adam_eps), ac_mode "sac" (= selective). Both spellings in one file with
// different values is an error; a later source (--set) overrides an earlier one.
//
// Reference keys we do not support (reference-trainer.md §2) are accepted and ignored with one
// warning each, so its configs need few edits: [wandb] (the whole section; metrics go to
// logging.metrics_file), model.model_impl, training.compile, training.async_tp,
// training.text_model_dir, training.vision_model_dir, data.batch_size (rows are always packed),
// data.text_dataset (text samples are recognised per sample). training.load_text_model and
// training.load_vision_model are accepted when false and an error when true: ignoring them would
// silently train a different model. Keys the reference itself no longer knows (random_init_mlp,
// text_cache_dir, ...) are unknown keys.
//
// Relative paths (model_dir, data_path, output_dir, ...) are kept as written and resolve against
// the current directory of the process.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/image/decode.h"
#include "io/loader/loader.h"
#include "io/loader/packing.h"
#include "parallel/ac/activation_checkpointing.h"
#include "src/base/dtype.h"
#include "src/optim/lr_schedule.h"

namespace vlm::train {

// Activation checkpointing of the model's blocks (parallel/ac/activation_checkpointing.h).
using parallel::AcMode;
// What a non-finite loss or gradient norm does: abort (naming the step and the first non-finite
// tensor) or skip the optimizer update and count it (training.max_skipped_steps).
enum class NanPolicy : uint8_t { abort, skip };
// hdf5: resumable step_N/ folders (src/train/checkpoint.h); safetensors: HF snapshots only.
enum class CheckpointFormat : uint8_t { safetensors, hdf5 };
// With hdf5 checkpoints, when an HF snapshot (checkpoint-step-N/) is written besides: after the
// last step only, with every save, or never.
enum class HfSnapshot : uint8_t { final, every_save, never };
// ddp: every rank holds the whole model (dp_shard = 1); fsdp: parameters, gradients and optimizer
// states sharded over the data-parallel ranks (DESIGN.md §6).
enum class DataParallel : uint8_t { ddp, fsdp };
// When gradients are reduced under gradient accumulation (parallel/fsdp/fsdp.h): after every
// micro-step (memory stays sharded), or only after a step's last one (no communication on the
// others; a whole fp32 gradient is held). automatic: last_micro_step for ddp, every_micro_step
// for fsdp.
enum class GradReduce : uint8_t { automatic, every_micro_step, last_micro_step };

// Packed rows per micro-batch at most: the rows are gathered in host memory before the step.
constexpr int64_t kMaxMicroBatchRows = 4096;
// Ranks of any one mesh dimension (parallel.tp_size, dp_replicate, dp_shard) at most: more than
// any machine has, and small enough that their product cannot overflow.
constexpr int64_t kMaxMeshRanks = int64_t(1) << 20;

// The valid values of a numeric key, [min, max] (ints compared exactly up to 2^53).
struct KeyBounds {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
};
constexpr KeyBounds any() { return {}; }
constexpr KeyBounds at_least(double min) { return {min, std::numeric_limits<double>::infinity()}; }
constexpr KeyBounds within(double min, double max) { return {min, max}; }

const char* nan_policy_name(NanPolicy p);
const char* checkpoint_format_name(CheckpointFormat f);
const char* hf_snapshot_name(HfSnapshot h);
const char* data_parallel_name(DataParallel d);
const char* grad_reduce_name(GradReduce g);

// clang-format off
// X(type, name, default, bounds, help): bounds are the valid values of a numeric key, checked by
// validate_train_config and shown in its table: any(), at_least(lo) or within(lo, hi).
#define VLM_TRAIN_CONFIG_MODEL(X)                                                                  \
  X(std::string, model_name, "", any(),                                                            \
    "HF model id or run label, for logs and metrics (the architecture comes from config.json)")    \
  X(std::string, model_dir, "", any(),                                                             \
    "HF snapshot folder (config.json, *.safetensors, tokenizer); set this or preset")              \
  X(std::string, preset, "", any(),                                                                \
    "built-in model instead of model_dir (`vlmtrain models` lists them; \"tiny\": qwen-models.md T1)")\
  X(std::string, tokenizer, "", any(), "tokenizer.json or the folder holding it; \"\" = model_dir")\
  X(bool, train_llm, true, any(),                                                                  \
    "train the language model: embeddings, decoder layers, final norm, untied lm_head")            \
  X(bool, train_mlp, true, any(),                                                                  \
    "train the vision-language merger (VLMs; deepstack mergers too)")                              \
  X(bool, train_vit, false, any(), "train the vision tower (VLMs)")

#define VLM_TRAIN_CONFIG_TRAINING(X)                                                               \
  X(int64_t, seed, 42, at_least(0),                                                                \
    "seed of the random init and the data order; the same on every rank")                          \
  X(std::string, device, "cpu", any(),                                                             \
    "where the model trains: cpu, cuda (= cuda:0) or cuda:N")                                      \
  X(int64_t, total_steps, 1000, at_least(1),                                                       \
    "optimizer steps to train; also the LR schedule length; a final checkpoint is saved")          \
  X(int64_t, warmup_steps, 50, at_least(0),                                                        \
    "linear warmup steps, <= total_steps; the first step uses lr/warmup_steps, not 0")             \
  X(optim::ScheduleType, scheduler_type, optim::ScheduleType::wsd, any(),                          \
    "LR shape after warmup (lr_schedule.h)")                                                       \
  X(double, min_lr_ratio, 0.1, within(0, 1),                                                       \
    "final LR as a fraction of the peak (linear, cosine, wsd)")                                    \
  X(double, wsd_decay_ratio, 0.1, within(0, 1),                                                    \
    "wsd: fraction of total_steps in the final decay")                                             \
  X(optim::WsdDecay, wsd_decay, optim::WsdDecay::linear, any(),                                    \
    "wsd: shape of the final decay (the reference used cosine)")                                   \
  X(double, lr_llm, 2e-6, at_least(0), "peak LR of the language model (untied lm_head included)")  \
  X(double, lr_mlp, 1e-5, at_least(0), "peak LR of the vision-language merger")                    \
  X(double, lr_vit, 1e-6, at_least(0), "peak LR of the vision tower")                              \
  X(double, weight_decay, 0.01, at_least(0), "AdamW decoupled weight decay")                       \
  X(bool, decay_norms, false, any(), "apply weight decay to norm weights too")                     \
  X(bool, decay_biases, false, any(), "apply weight decay to biases too")                          \
  X(bool, decay_embeddings, false, any(),                                                          \
    "apply weight decay to token embeddings (and a tied lm_head) too")                             \
  X(double, adam_beta1, 0.9, any(), "AdamW beta1, in [0, 1)")                                      \
  X(double, adam_beta2, 0.999, any(), "AdamW beta2, in [0, 1)")                                    \
  X(double, adam_eps, 1e-8, any(), "AdamW epsilon, > 0 (reference spelling: eps)")                 \
  X(double, max_grad_norm, 1.0, at_least(0),                                                       \
    "clip the global gradient norm to this; 0 = no clipping (the norm is logged either way)")      \
  X(double, tpi_multiplier, 1.0, any(),                                                            \
    "gradient accumulation: mean micro-steps per optimizer step, >= 1 (1.5 = 1,2,1,2,...)")        \
  X(int64_t, micro_batch_rows, 1, within(1, kMaxMicroBatchRows),                                   \
    "packed rows of data.seq_len tokens per micro-step")                                           \
  X(DType, param_dtype, DType::bf16, any(),                                                        \
    "parameter and compute dtype (reference: bfloat16); master weights, AdamW states: f32")        \
  X(DType, grad_dtype, DType::f32, any(),                                                          \
    "dtype gradients of bf16 parameters accumulate in (f32 as PyTorch AMP, or bf16)")              \
  X(AcMode, ac_mode, AcMode::off, any(),                                                           \
    "activation checkpointing per block (decoder layer); selective keeps matmul outputs (= sac)")  \
  X(int64_t, loss_vocab_chunk, 0, at_least(0),                                                     \
    "0: LM head logits then the loss; N: head + loss fused over N-row vocab chunks (less memory)") \
  X(bool, deterministic_attention, false, any(),                                                   \
    "CUDA: cuDNN attention's deterministic backward (bitwise repeatable; workspace ~B*H*S^2*4 B)") \
  X(double, attention_workspace_gb, 4.0, at_least(0.001),                                          \
    "CUDA: most workspace per attention call; deterministic plans over it run non-deterministic")  \
  X(bool, random_init, false, any(),                                                               \
    "start from the HF random init, not the weights in model_dir (always true with a preset)")     \
  X(int64_t, eval_steps, 0, at_least(0),                                                           \
    "eval loss and perplexity on data.val_split every N steps and at the end; 0 = never")          \
  X(int64_t, eval_batches, 20, at_least(0),                                                        \
    "micro-batches per evaluation; 0 = the whole val split")                                       \
  X(int64_t, caption_eval_images, 0, at_least(0),                                                  \
    "VLMs on the demo dataset: caption accuracy on N held-out images of data.val_split at the end")\
  X(NanPolicy, nan_policy, NanPolicy::abort, any(),                                                \
    "non-finite loss or grad norm: abort naming the step and tensor, or skip the update")          \
  X(int64_t, max_skipped_steps, 10, at_least(0),                                                   \
    "nan_policy = skip: abort once more than this many updates were skipped")

#define VLM_TRAIN_CONFIG_DATA(X)                                                                   \
  X(std::string, data_path, "", any(), "Energon dataset folder or metadataset .yaml (required)")   \
  X(bool, make_demo, false, any(),                                                                 \
    "when data_path does not exist, make the demo dataset there first (the demo configs)")        \
  X(std::string, train_split, "train", any(), "split to train on")                                 \
  X(std::string, val_split, "val", any(), "split to evaluate on (training.eval_steps)")            \
  X(int64_t, seq_len, 4096, within(2, io::kMaxSeqLen), "tokens per packed row")                    \
  X(int64_t, packing_buffer_size, 1000, within(1, io::kMaxPackingBufferSize),                      \
    "samples the online packer holds to choose each row from")                                     \
  X(std::string, packing_plan, "", any(),                                                          \
    "offline packing plan from `vlmtrain data pack`; \"\" = online packing")                       \
  X(io::OverlongPolicy, overlong_policy, io::OverlongPolicy::truncate, any(),                      \
    "samples longer than seq_len: truncate (never inside an image) or drop")                       \
  X(int64_t, shuffle_buffer_size, 100, within(0, io::kMaxShuffleBufferSize),                       \
    "samples in the shuffle buffer of each reader; 0 = no shuffle buffer")                         \
  X(int64_t, max_samples_per_sequence, 100, at_least(0),                                           \
    "consecutive samples read from one shard slice before switching; 0 = whole slices")            \
  X(int64_t, num_workers, 2, within(1, io::kMaxNumWorkers),                                        \
    "reader threads per rank (part of the data partition: changing it changes the order)")         \
  X(int64_t, epochs, 0, at_least(0),                                                               \
    "passes over train_split; 0 = repeat forever (training ends at total_steps)")                  \
  X(double, max_skip_fraction, 0.01, within(0, 1),                                                 \
    "stop when more of the samples read than this were skipped as bad (of at least 100)")          \
  X(int64_t, min_pixels, 65536, at_least(1), "images are resized to at least this many pixels")    \
  X(int64_t, max_pixels, 16777216, within(1, io::kMaxDecodePixels),                                \
    "images are resized to at most this many pixels")

#define VLM_TRAIN_CONFIG_PARALLEL(X)                                                               \
  X(int64_t, tp_size, 1, within(1, kMaxMeshRanks),                                                 \
    "tensor-parallel degree; must divide the number of ranks")                                     \
  X(bool, sequence_parallel, false, any(),                                                         \
    "with tp_size > 1: split the text layers' norms and residuals by tokens over the TP ranks")     \
  X(DataParallel, data_parallel, DataParallel::ddp, any(),                                         \
    "data parallelism over the remaining ranks: replicated (ddp) or sharded (fsdp)")               \
  X(int64_t, dp_replicate, 0, within(0, kMaxMeshRanks),                                            \
    "replica groups (ddp: every data-parallel rank; fsdp > 1: HSDP); 0 = the ranks that are left") \
  X(int64_t, dp_shard, 0, within(0, kMaxMeshRanks),                                                \
    "ranks one replica is sharded over (fsdp; ddp: 1); 0 = the ranks that are left")               \
  X(bool, reshard_after_forward, true, any(),                                                      \
    "fsdp: free a block's gathered parameters after its forward, gather again for its backward")   \
  X(DType, reduce_dtype, DType::f32, any(),                                                        \
    "dtype gradients are summed across ranks in (f32 or bf16)")                                    \
  X(GradReduce, grad_reduce, GradReduce::automatic, any(),                                         \
    "with accumulation, reduce gradients after every micro-step or the last (auto: ddp last)")     \
  X(double, collective_timeout_s, 600.0, at_least(0),                                              \
    "end the job when a collective waits longer than this for a peer (crash, hang); 0 = never")

#define VLM_TRAIN_CONFIG_CHECKPOINT(X)                                                             \
  X(std::string, output_dir, "checkpoints", any(),                                                 \
    "folder of the checkpoints (step_N/ or checkpoint-step-N/) and metrics.jsonl by default")      \
  X(int64_t, save_steps, 1000, at_least(0),                                                        \
    "save every N optimizer steps and at total_steps; 0 = only the final checkpoint")              \
  X(bool, save_final, true, any(),                                                                 \
    "save at total_steps; false: no final checkpoint (benchmark and scaling runs)")                \
  X(CheckpointFormat, format, CheckpointFormat::hdf5, any(),                                       \
    "hdf5: resumable sharded step_N/ (parallel HDF5); safetensors: HF snapshots, not resumable")   \
  X(HfSnapshot, hf_snapshot, HfSnapshot::final, any(),                                             \
    "hdf5: also an HF snapshot checkpoint-step-N/ (generate, export, transformers): at the end, "  \
    "every save, never")                                                                           \
  X(int64_t, keep_last, 0, at_least(0),                                                            \
    "keep only the newest N step_N checkpoints (HF snapshots stay); 0 = keep all")                 \
  X(std::string, resume, "", any(),                                                                \
    "\"latest\" (what output_dir/latest names; none yet: fresh), a step_N folder, \"\" = a new run")

#define VLM_TRAIN_CONFIG_LOGGING(X)                                                                \
  X(int64_t, log_every, 10, at_least(1),                                                           \
    "progress line every N optimizer steps (metrics_file gets every step)")                        \
  X(std::string, metrics_file, "", any(),                                                          \
    "one JSON line per optimizer step; \"\" = output_dir/metrics.jsonl")                           \
  X(bool, progress, true, any(),                                                                   \
    "print the progress line on rank 0 (step, loss, lr, tokens/s, ETA)")                           \
  X(double, peak_tflops, 0.0, at_least(0),                                                         \
    "peak TFLOP/s of one device for MFU; 0 = the built-in value of the device (none on CPU)")
// clang-format on

#define VLM_TRAIN_CONFIG_MEMBER(type, name, value, bounds, help) type name = value;

struct ModelOptions {
  VLM_TRAIN_CONFIG_MODEL(VLM_TRAIN_CONFIG_MEMBER)
  bool operator==(const ModelOptions&) const = default;
};
struct TrainingOptions {
  VLM_TRAIN_CONFIG_TRAINING(VLM_TRAIN_CONFIG_MEMBER)
  bool operator==(const TrainingOptions&) const = default;
};
struct DataOptions {
  VLM_TRAIN_CONFIG_DATA(VLM_TRAIN_CONFIG_MEMBER)
  bool operator==(const DataOptions&) const = default;
};
struct ParallelOptions {
  VLM_TRAIN_CONFIG_PARALLEL(VLM_TRAIN_CONFIG_MEMBER)
  bool operator==(const ParallelOptions&) const = default;
};
struct CheckpointOptions {
  VLM_TRAIN_CONFIG_CHECKPOINT(VLM_TRAIN_CONFIG_MEMBER)
  bool operator==(const CheckpointOptions&) const = default;
};
struct LoggingOptions {
  VLM_TRAIN_CONFIG_LOGGING(VLM_TRAIN_CONFIG_MEMBER)
  bool operator==(const LoggingOptions&) const = default;
};

struct TrainConfig {
  ModelOptions model;
  TrainingOptions training;
  DataOptions data;
  ParallelOptions parallel;
  CheckpointOptions checkpoint;
  LoggingOptions logging;
  bool operator==(const TrainConfig&) const = default;
};

// Parses TOML text (source_name names it in messages), applies the overrides ("section.key=value",
// source "--set"), resolves and validates. Warnings (ignored reference keys) go to the log and,
// when `warnings` is given, are also appended there.
TrainConfig parse_train_config(std::string_view toml_text, std::string_view source_name,
                               const std::vector<std::string>& overrides = {},
                               std::vector<std::string>* warnings = nullptr);
// Reads the file, then as parse_train_config with the path as source name.
TrainConfig load_train_config(const std::string& path,
                              const std::vector<std::string>& overrides = {},
                              std::vector<std::string>* warnings = nullptr);
// configs/demo.toml as compiled into the binary: `vlmtrain train` without --config.
std::string_view builtin_demo_config_toml();

// Step 3 and 4 of parsing, for configs built in code. validate_train_config throws vlm::Error
// "config SOURCE: section.key = value ..." for the first invalid value.
void resolve_defaults(TrainConfig& config);
void validate_train_config(const TrainConfig& config, std::string_view source_name = "config");

// The config as TOML: every key of every section with its help as a comment, in table order;
// parse_train_config(to_toml(c), ...) == c for a resolved, valid c.
std::string to_toml(const TrainConfig& config);
// {"model": {...}, "training": {...}, ...}: every key; enums and dtypes as their names.
nlohmann::json to_json(const TrainConfig& config);

// One row per key, in table order (the README table and help text come from these).
struct ConfigKeyInfo {
  std::string section, key;  // "training", "lr_llm"
  std::string type;          // "bool", "int", "float", "string", or "a | b | c" for enums
  std::string default_value; // as TOML
  std::string help;
};
std::vector<ConfigKeyInfo> train_config_keys();
// The key reference of configs/README.md: a Markdown table per section.
std::string train_config_keys_markdown();

// training.tpi_multiplier as micro-steps per optimizer step: optimizer step s runs
// pattern[s % pattern.size()] micro-steps, and the pattern's mean is exactly tpi.
// Rule (the reference's train/utils.py generate_accumulation_pattern, in integer arithmetic):
// n = the smallest period 1 <= n <= kMaxAccumulationPeriod such that n * tpi is an integer K
// (relative tolerance 1e-9, as Python's math.isclose), then
//   pattern[i] = floor((i + 1) * K / n) - floor(i * K / n),  i = 0 .. n-1
// e.g. 1.5 -> [1, 2], 1.25 -> [1, 1, 1, 2], 12 -> [12], 2.4 -> [2, 2, 3, 2, 3].
// The reference cut a non-repeating multiplier off after 100 entries (with a mean != tpi);
// we reject it, and tpi < 1, tpi > kMaxAccumulationMultiplier or a non-finite tpi, naming the
// value.
constexpr int kMaxAccumulationPeriod = 100;
constexpr double kMaxAccumulationMultiplier = 100000;
std::vector<int> accumulation_pattern(double tpi);

} // namespace vlm::train
