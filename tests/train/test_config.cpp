#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "src/base/check.h"
#include "src/train/config.h"
#include "tests/temp_dir.h"

using namespace vlm;
using namespace vlm::train;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;

namespace {

namespace fs = std::filesystem;

// The smallest valid config: everything else is a default.
const std::string kMinimal = "[model]\npreset = \"tiny\"\n[data]\ndata_path = \"d\"\n";
// kMinimal with more lines in its [model] and [data] sections (TOML forbids repeating a table).
std::string minimal(const std::string& model, const std::string& data,
                    const std::string& rest = "") {
  return "[model]\npreset = \"tiny\"\n" + model + "[data]\ndata_path = \"d\"\n" + data + rest;
}

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides = {},
                  std::vector<std::string>* warnings = nullptr) {
  return parse_train_config(text, "test.toml", overrides, warnings);
}

// The error message of parsing `text` (fails the test when it parses).
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("expected a config error for:\n" << text);
  return "";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> config_files() {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(std::string(VLM_SOURCE_DIR) + "/configs"))
    if (e.path().extension() == ".toml") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

} // namespace

TEST_CASE("config: every file in configs/ parses without warnings", "[train][config]") {
  const auto files = config_files();
  REQUIRE(files.size() >= 5);
  for (const std::string& f : files) {
    INFO(f);
    std::vector<std::string> warnings;
    TrainConfig c = load_train_config(f, {}, &warnings);
    CHECK(warnings.empty());
    CHECK(!c.data.data_path.empty());
    // The resolved config re-parses to the same config.
    CHECK(parse(to_toml(c)) == c);
  }
  const std::string demo = std::string(VLM_SOURCE_DIR) + "/configs/demo.toml";
  TrainConfig c = load_train_config(demo);
  CHECK(c.model.preset == "tiny-vl");          // the main job is the VLM demo
  CHECK(c.training.random_init);               // a preset has no weights
  CHECK(c.data.data_path == "demo_data/");     // make-demo's folder, relative to the cwd
  CHECK(c.training.param_dtype == DType::f32); // CPU
  CHECK(c.training.caption_eval_images > 0);   // it ends with the caption accuracy
  CHECK(c.logging.metrics_file == "demo_out/metrics.jsonl");
  TrainConfig text = load_train_config(std::string(VLM_SOURCE_DIR) + "/configs/demo-text.toml");
  CHECK(text.model.preset == "tiny");
  CHECK(text.data.data_path == "demo_data/");
  for (const char* size : {"0.6b", "1.7b", "4b", "8b"}) {
    INFO(size);
    TrainConfig q =
        load_train_config(std::string(VLM_SOURCE_DIR) + "/configs/qwen3-" + size + ".toml");
    CHECK_THAT(q.model.model_dir, Contains("/path/to/"));
    CHECK(q.model.tokenizer == q.model.model_dir);
    CHECK(q.training.param_dtype == DType::bf16);
  }
}

TEST_CASE("config: the built-in demo config is configs/demo.toml", "[train][config]") {
  CHECK(std::string(builtin_demo_config_toml()) ==
        read_file(std::string(VLM_SOURCE_DIR) + "/configs/demo.toml"));
  CHECK(parse_train_config(builtin_demo_config_toml(), "demo") ==
        load_train_config(std::string(VLM_SOURCE_DIR) + "/configs/demo.toml"));
}

TEST_CASE("config: defaults are the reference trainer's", "[train][config]") {
  const TrainConfig d;
  // docs/reference-trainer.md §2
  CHECK(d.model.train_llm);
  CHECK(d.model.train_mlp);
  CHECK(!d.model.train_vit);
  CHECK(d.training.lr_llm == 2e-6);
  CHECK(d.training.lr_mlp == 1e-5);
  CHECK(d.training.lr_vit == 1e-6);
  CHECK(d.training.scheduler_type == optim::ScheduleType::wsd);
  CHECK(d.training.total_steps == 1000);
  CHECK(d.training.warmup_steps == 50);
  CHECK(d.training.min_lr_ratio == 0.1);
  CHECK(d.training.wsd_decay_ratio == 0.1);
  CHECK(d.training.tpi_multiplier == 1.0);
  CHECK(d.training.weight_decay == 0.01);
  CHECK(d.training.max_grad_norm == 1.0);
  CHECK(d.training.adam_eps == 1e-8);
  CHECK(d.training.param_dtype == DType::bf16); // bfloat16 = True
  CHECK(d.training.ac_mode == AcMode::off);
  CHECK(!d.training.random_init);
  CHECK(d.data.seq_len == 4096);
  CHECK(d.data.shuffle_buffer_size == 100);
  CHECK(d.data.max_samples_per_sequence == 100);
  CHECK(d.parallel.tp_size == 1);
  CHECK(d.parallel.data_parallel == DataParallel::ddp);
  CHECK(d.checkpoint.output_dir == "checkpoints");
  CHECK(d.checkpoint.save_steps == 1000);
  CHECK(d.checkpoint.resume.empty());
  CHECK(d.checkpoint.keep_last == 0);
  // Ours.
  CHECK(!d.training.decay_norms);
  CHECK(!d.training.decay_biases);
  CHECK(!d.training.decay_embeddings);
  CHECK(d.training.nan_policy == NanPolicy::abort);
  CHECK(d.checkpoint.format == CheckpointFormat::hdf5); // resumable by default (issue 31)
  CHECK(d.checkpoint.hf_snapshot == HfSnapshot::final);
  CHECK(d.data.overlong_policy == io::OverlongPolicy::truncate);

  // A minimal file gives the defaults plus the resolved keys.
  TrainConfig want = d;
  want.model.preset = "tiny";
  want.data.data_path = "d";
  want.training.random_init = true;
  want.logging.metrics_file = "checkpoints/metrics.jsonl";
  CHECK(parse(kMinimal) == want);
  // model_dir gives the tokenizer default; an explicit tokenizer and metrics file stay.
  TrainConfig c = parse("[model]\nmodel_dir = \"/m\"\n[data]\ndata_path = \"d\"\n"
                        "[checkpoint]\noutput_dir = \"out\"\n");
  CHECK(c.model.tokenizer == "/m");
  CHECK(!c.training.random_init);
  CHECK(c.logging.metrics_file == "out/metrics.jsonl");
  c = parse(kMinimal, {"model.tokenizer=/t", "logging.metrics_file=/x.jsonl"});
  CHECK(c.model.tokenizer == "/t");
  CHECK(c.logging.metrics_file == "/x.jsonl");
}

TEST_CASE("config: unknown keys suggest the closest valid key", "[train][config]") {
  // Same section.
  CHECK_THAT(error_of(kMinimal + "[training]\nlr_lmm = 1e-5\n"),
             Equals("config test.toml: line 6: unknown key 'training.lr_lmm' (did you mean "
                    "'training.lr_llm'?)"));
  CHECK_THAT(error_of(kMinimal + "[training]\nwarmup_step = 5\n"),
             Contains("(did you mean 'training.warmup_steps'?)"));
  // Wrong section: the reference's [training] keys that live elsewhere here.
  CHECK_THAT(error_of(kMinimal + "[training]\ntp_size = 2\n"),
             Contains("unknown key 'training.tp_size' (did you mean 'parallel.tp_size'? tp_size "
                      "belongs in [parallel])"));
  CHECK_THAT(error_of("[training]\nmodel_dir = \"/m\"\n"),
             Contains("(did you mean 'model.model_dir'?"));
  CHECK_THAT(error_of(kMinimal + "[training]\noutput_dir = \"x\"\n"),
             Contains("(did you mean 'checkpoint.output_dir'?"));
  CHECK_THAT(error_of(minimal("", "lr_llm = 1.0\n")), Contains("(did you mean 'training.lr_llm'?"));
  // Wrong section and misspelt.
  CHECK_THAT(error_of(minimal("save_step = 5\n", "")),
             Contains("(did you mean 'checkpoint.save_steps'?)"));
  // Reference keys in the section where the reference had them.
  CHECK_THAT(error_of(kMinimal + "[training]\nmodel_impl = \"native\"\n"),
             Contains("(did you mean 'model.model_impl'? model_impl belongs in [model])"));
  CHECK_THAT(error_of(minimal("bfloat16 = true\n", "")),
             Contains("(did you mean 'training.bfloat16'?"));
  // Outside any section.
  CHECK_THAT(error_of("seq_len = 10\n" + kMinimal),
             Contains("line 1: key 'seq_len' outside any section (did you mean 'data.seq_len'?"));
  // Nothing close: no suggestion. Keys the reference itself dropped are unknown too.
  const std::string far = error_of(kMinimal + "[training]\nzzzzzzzzzzzz = 1\n");
  CHECK_THAT(far, Contains("unknown key 'training.zzzzzzzzzzzz'"));
  CHECK_THAT(far, !Contains("did you mean"));
  CHECK_THAT(error_of(kMinimal + "[training]\nrandom_init_mlp = true\n"),
             Contains("unknown key 'training.random_init_mlp' (did you mean "
                      "'training.random_init'?)"));
  // Sections.
  CHECK_THAT(error_of(kMinimal + "[trainig]\nseed = 1\n"),
             Contains("config test.toml: line 5: unknown section [trainig] (did you mean "
                      "[training]?)"));
  CHECK_THAT(error_of(kMinimal + "[optimizer]\nlr = 1\n"),
             Contains("unknown section [optimizer] (valid sections: model, training, data"));
}

TEST_CASE("config: type errors name key, expected type and value", "[train][config]") {
  CHECK_THAT(error_of(kMinimal + "[training]\nlr_llm = \"1e-5\"\n"),
             Equals("config test.toml: line 6: training.lr_llm: expected a number, got string "
                    "\"1e-5\""));
  CHECK_THAT(error_of(kMinimal + "[training]\ntotal_steps = 10.5\n"),
             Contains("training.total_steps: expected an integer, got float 10.5"));
  CHECK_THAT(error_of(minimal("train_vit = 1\n", "")),
             Contains("model.train_vit: expected a boolean (true or false), got integer 1"));
  CHECK_THAT(error_of(kMinimal + "[training]\nac_mode = true\n"),
             Contains("training.ac_mode: expected a string, got boolean true"));
  CHECK_THAT(error_of(minimal("", "seq_len = [1, 2]\n")),
             Contains("data.seq_len: expected an integer, got array [ 1, 2 ]"));
  CHECK_THAT(error_of(kMinimal + "[checkpoint]\noutput_dir = 5\n"),
             Contains("checkpoint.output_dir: expected a string, got integer 5"));
  // Integers are fine for float keys.
  CHECK(parse(kMinimal + "[training]\nmax_grad_norm = 2\n").training.max_grad_norm == 2.0);
  // Syntax errors carry the position.
  CHECK_THAT(error_of("[model]\npreset = \n"),
             Contains("config test.toml: line 2, column 10: TOML syntax error"));
}

TEST_CASE("config: invalid values name key and value", "[train][config]") {
  auto training = [](const std::string& body) { return kMinimal + "[training]\n" + body + "\n"; };
  CHECK_THAT(error_of(training("lr_llm = -1e-5")),
             Equals("config test.toml: line 6: training.lr_llm = -1e-05 must be >= 0"));
  CHECK_THAT(error_of(training("total_steps = 100\nwarmup_steps = 200")),
             Contains("training.warmup_steps = 200 must be <= training.total_steps = 100"));
  // A default that conflicts with a given value says so.
  CHECK_THAT(error_of(training("total_steps = 10")),
             Equals("config test.toml: training.warmup_steps = 50 (default) must be <= "
                    "training.total_steps = 10"));
  CHECK_THAT(error_of(training("min_lr_ratio = 1.5")),
             Contains("training.min_lr_ratio = 1.5 must be in [0, 1]"));
  CHECK_THAT(error_of(training("min_lr_ratio = -0.1")),
             Contains("training.min_lr_ratio = -0.1 must be in [0, 1]"));
  CHECK_THAT(error_of(training("tpi_multiplier = 0.5")),
             Contains("training.tpi_multiplier = 0.5 must be in [1, 100000]"));
  CHECK_THAT(
      error_of(training("tpi_multiplier = 1.001")),
      Contains("training.tpi_multiplier = 1.001 does not repeat within 100 optimizer steps"));
  CHECK_THAT(error_of(training("ac_mode = \"partial\"")),
             Contains("training.ac_mode = \"partial\" is not one of off, full, selective (sac = "
                      "selective)"));
  CHECK_THAT(error_of(training("scheduler_type = \"step\"")),
             Contains("is not one of constant, linear, cosine, wsd"));
  CHECK_THAT(error_of(training("param_dtype = \"f16\"")),
             Contains("training.param_dtype = \"f16\" is not one of bf16, f32"));
  CHECK_THAT(error_of(training("adam_beta2 = 1.0")),
             Contains("training.adam_beta2 = 1.0 must be in [0, 1)"));
  CHECK_THAT(error_of(training("adam_eps = 0")), Contains("training.adam_eps = 0.0 must be > 0"));
  CHECK_THAT(error_of(training("weight_decay = nan")),
             Contains("training.weight_decay = nan must be a finite number"));
  CHECK_THAT(error_of(training("max_grad_norm = -1")),
             Contains("training.max_grad_norm = -1.0 must be >= 0"));
  CHECK_THAT(error_of(training("device = \"gpu\"")),
             Contains("training.device = \"gpu\" must be cpu, cuda or cuda:N"));
  CHECK_THAT(error_of(training("device = \"cuda:x\"")),
             Contains("training.device = \"cuda:x\" must be cpu, cuda or cuda:N"));
  CHECK(parse(training("device = \"cuda:3\"")).training.device == "cuda:3");
  CHECK_THAT(error_of(training("loss_vocab_chunk = -1")),
             Contains("training.loss_vocab_chunk = -1 must be >= 0"));
  CHECK_THAT(error_of(training("micro_batch_rows = 0")),
             Contains("training.micro_batch_rows = 0 must be in [1, 4096]"));
  // Values that size memory or threads have stated bounds (they grew memory or hung before).
  CHECK_THAT(error_of(training("micro_batch_rows = 1000000000")),
             Contains("training.micro_batch_rows = 1000000000 must be in [1, 4096]"));
  CHECK_THAT(error_of(minimal("", "seq_len = 1048576\n", "[training]\nmicro_batch_rows = 4096\n")),
             Contains("training.micro_batch_rows = 4096 x data.seq_len = 1048576 tokens per "
                      "micro-batch must be < 2^31"));
  CHECK_THAT(error_of(minimal("", "packing_buffer_size = 1e12\n")),
             Contains("data.packing_buffer_size"));
  CHECK_THAT(error_of(minimal("", "packing_buffer_size = 1000000000000\n")),
             Contains("data.packing_buffer_size = 1000000000000 must be in [1, 100000]"));
  CHECK_THAT(error_of(minimal("", "num_workers = 100000\n")),
             Contains("data.num_workers = 100000 must be in [1, 256]"));
  CHECK_THAT(error_of(minimal("", "shuffle_buffer_size = 100000000\n")),
             Contains("data.shuffle_buffer_size = 100000000 must be in [0, 1048576]"));
  CHECK_THAT(error_of(minimal("", "max_pixels = 1000000000\n")),
             Contains("data.max_pixels = 1000000000 must be in [1, 178956970]"));
  CHECK_THAT(error_of(minimal("", "max_skip_fraction = 1.5\n")),
             Contains("data.max_skip_fraction = 1.5 must be in [0, 1]"));
  CHECK_THAT(error_of(training("total_steps = 100\nwarmup_steps = 95")),
             Contains("training.wsd_decay_ratio = 0.1 (default) gives 10 decay steps"));
  CHECK_THAT(error_of(minimal("", "seq_len = 1\n")),
             Contains("data.seq_len = 1 must be in [2, 16777216]"));
  CHECK_THAT(error_of(minimal("", "min_pixels = 100\nmax_pixels = 99\n")),
             Contains("data.max_pixels = 99 must be >= data.min_pixels = 100"));
  CHECK_THAT(error_of(minimal("", "overlong_policy = \"split\"\n")),
             Contains("is not one of truncate, drop"));
  CHECK_THAT(error_of(kMinimal + "[parallel]\ntp_size = 0\n"),
             Contains("parallel.tp_size = 0 must be in [1, 1048576]"));
  CHECK_THAT(error_of(kMinimal + "[parallel]\nsequence_parallel = true\n"),
             Contains("parallel.sequence_parallel") && Contains("needs parallel.tp_size > 1"));
  // Mesh sizes are bounded, so their product cannot overflow into a "matching" world size.
  CHECK_THAT(error_of(kMinimal + "[parallel]\ndata_parallel = \"fsdp\"\n"
                                 "dp_replicate = 4294967296\ndp_shard = 4294967296\n"),
             Contains("parallel.dp_replicate = 4294967296 must be in [0, 1048576]"));
  CHECK_THAT(error_of(kMinimal + "[parallel]\ndata_parallel = \"hsdp\"\n"),
             Contains("is not one of ddp, fsdp"));
  CHECK_THAT(error_of(kMinimal + "[checkpoint]\nformat = \"pt\"\n"),
             Contains("is not one of safetensors, hdf5"));
  CHECK_THAT(error_of(kMinimal + "[logging]\nlog_every = 0\n"),
             Contains("logging.log_every = 0 must be >= 1"));
  CHECK_THAT(error_of(minimal("train_llm = false\ntrain_mlp = false\n", "")),
             Contains("nothing to train"));
  // [model] and [data] must say what to train on.
  CHECK_THAT(error_of("[data]\ndata_path = \"d\"\n"),
             Contains("model.model_dir = \"\" (default) is empty: set model.model_dir"));
  CHECK_THAT(error_of(minimal("model_dir = \"/m\"\n", "")),
             Contains("model.model_dir = \"/m\" and model.preset = \"tiny\" are both set"));
  CHECK_THAT(error_of("[model]\npreset = \"huge\"\n[data]\ndata_path = \"d\"\n"),
             Contains("model.preset = \"huge\" is not a preset; valid: ") && Contains("tiny") &&
                 Contains("qwen3-0.6b"));
  // Every registered preset is valid, not only the demo's (was: "valid: tiny").
  CHECK(parse("[model]\npreset = \"qwen3-0.6b\"\ntokenizer = \"t\"\n[data]\ndata_path = \"d\"\n")
            .model.preset == "qwen3-0.6b");
  CHECK_THAT(error_of("[model]\npreset = \"tiny\"\n"),
             Contains("data.data_path = \"\" (default) is empty"));
  CHECK_THAT(error_of(minimal("", "val_split = \"\"\n", "[training]\neval_steps = 10\n")),
             Contains("data.val_split = \"\" must not be empty when training.eval_steps > 0"));
  // Enum names are case-insensitive (the reference's scheduler_type was).
  CHECK(parse(training("scheduler_type = \"Cosine\"")).training.scheduler_type ==
        optim::ScheduleType::cosine);
}

TEST_CASE("config: --set overrides", "[train][config]") {
  TrainConfig c =
      parse(kMinimal + "[training]\ntotal_steps = 100\n",
            {"training.total_steps=200", "training.lr_llm=1e-5", "model.train_vit=true",
             "training.ac_mode=sac", "data.data_path = \"/x y\"", "checkpoint.output_dir='out'",
             "training.scheduler_type=cosine", "training.max_grad_norm=3", "data.val_split="});
  CHECK(c.training.total_steps == 200);
  CHECK(c.training.lr_llm == 1e-5);
  CHECK(c.model.train_vit);
  CHECK(c.training.ac_mode == AcMode::selective);
  CHECK(c.data.data_path == "/x y");
  CHECK(c.checkpoint.output_dir == "out");
  CHECK(c.logging.metrics_file == "out/metrics.jsonl"); // resolved after the overrides
  CHECK(c.training.scheduler_type == optim::ScheduleType::cosine);
  CHECK(c.training.max_grad_norm == 3.0);
  CHECK(c.data.val_split.empty());
  // Later overrides win.
  CHECK(parse(kMinimal, {"training.seed=1", "training.seed=2"}).training.seed == 2);
  // Errors name the source "--set".
  CHECK_THAT(error_of(kMinimal, {"training.total_steps"}),
             Equals("config --set: 'training.total_steps' is not section.key=value"));
  CHECK_THAT(error_of(kMinimal, {"training.lr_lmm=1"}),
             Equals("config --set: unknown key 'training.lr_lmm' (did you mean "
                    "'training.lr_llm'?)"));
  CHECK_THAT(error_of(kMinimal, {"training.tp_size=2"}),
             Contains("(did you mean 'parallel.tp_size'?"));
  CHECK_THAT(error_of(kMinimal, {"seq_len=2"}),
             Contains("config --set: 'seq_len' is not section.key (did you mean 'data.seq_len'?"));
  CHECK_THAT(error_of(kMinimal, {"trainig.seed=2"}),
             Contains("config --set: unknown section [trainig] in 'trainig.seed' (did you mean "
                      "[training]?)"));
  CHECK_THAT(error_of(kMinimal, {"training.total_steps=abc"}),
             Equals("config --set: training.total_steps: expected an integer, got 'abc'"));
  CHECK_THAT(error_of(kMinimal, {"training.total_steps=1.5"}),
             Contains("expected an integer, got '1.5'"));
  CHECK_THAT(error_of(kMinimal, {"model.train_llm=yes"}),
             Contains("model.train_llm: expected a boolean (true or false), got 'yes'"));
  CHECK_THAT(error_of(kMinimal, {"training.lr_llm=inf"}),
             Contains("config --set: training.lr_llm = inf must be a finite number"));
  CHECK_THAT(error_of(kMinimal, {"training.ac_mode=most"}),
             Contains("config --set: training.ac_mode = \"most\" is not one of off, full"));
  // A value error in the merged config is blamed on the source that set the key.
  CHECK_THAT(error_of(kMinimal, {"training.min_lr_ratio=2"}),
             Equals("config --set: training.min_lr_ratio = 2.0 must be in [0, 1]"));
  CHECK_THAT(error_of(kMinimal + "[training]\nwarmup_steps = 20\n", {"training.total_steps=10"}),
             Equals("config test.toml: line 6: training.warmup_steps = 20 must be <= "
                    "training.total_steps = 10"));
}

TEST_CASE("config: reference spellings and ignored reference keys", "[train][config]") {
  // Aliases.
  TrainConfig c = parse(kMinimal + "[training]\nbfloat16 = false\neps = 1e-6\nac_mode = \"sac\"\n");
  CHECK(c.training.param_dtype == DType::f32);
  CHECK(c.training.adam_eps == 1e-6);
  CHECK(c.training.ac_mode == AcMode::selective);
  CHECK(parse(kMinimal + "[training]\nbfloat16 = true\n").training.param_dtype == DType::bf16);
  CHECK(parse(kMinimal + "[training]\nbfloat16 = true\nparam_dtype = \"bf16\"\n")
            .training.param_dtype == DType::bf16);
  CHECK_THAT(error_of(kMinimal + "[training]\nbfloat16 = true\nparam_dtype = \"f32\"\n"),
             Contains("contradicts"));
  CHECK_THAT(error_of(kMinimal + "[training]\neps = 1e-6\nadam_eps = 1e-7\n"),
             Contains("set only one of them"));
  // A later source overrides an alias without a conflict.
  CHECK(parse(kMinimal + "[training]\nbfloat16 = true\n", {"training.param_dtype=f32"})
            .training.param_dtype == DType::f32);
  CHECK(parse(kMinimal, {"training.bfloat16=false"}).training.param_dtype == DType::f32);
  // The reference trainer's resume switch ([training]; ours was in [checkpoint]): "latest", with
  // no other key (checkpoints are resumable by default).
  CHECK(parse(kMinimal + "[training]\nresume_checkpoint = true\n").checkpoint.resume == "latest");
  CHECK(parse(kMinimal, {"checkpoint.resume_checkpoint=false"}).checkpoint.resume.empty());
  CHECK_THAT(error_of(kMinimal + "[training]\nresume_checkpoint = true\n[checkpoint]\n"
                                 "format = \"safetensors\"\n"),
             Contains("needs checkpoint.format = \"hdf5\""));

  // Ignored with one warning each; [wandb] as a whole.
  std::vector<std::string> warnings;
  c = parse(minimal("model_impl = \"native\"\n", "batch_size = 0\ntext_dataset = true\n",
                    "[wandb]\nrun_name = \"r\"\nproject_name = \"p\"\nlog_topk = true\n"
                    "[training]\ncompile = true\nasync_tp = false\nload_vision_model = false\n"
                    "vision_model_dir = \"NULL\"\n"),
            {"wandb.entity_name=e"}, &warnings);
  CHECK(c == parse(kMinimal));
  REQUIRE(warnings.size() == 9);
  CHECK(std::count_if(warnings.begin(), warnings.end(), [](const std::string& w) {
          return w.find("[wandb] is ignored") != std::string::npos;
        }) == 2);
  CHECK(std::any_of(warnings.begin(), warnings.end(), [](const std::string& w) {
    return w.find("training.compile is ignored") != std::string::npos;
  }));
  // Switches that would change the model are errors when on.
  CHECK_THAT(error_of(kMinimal + "[training]\nload_vision_model = true\n"),
             Contains("training.load_vision_model = true: transplanting a SigLIP2 vision tower is "
                      "not supported yet"));
  CHECK_THAT(error_of(kMinimal, {"training.load_text_model=true"}),
             Contains("config --set: training.load_text_model = true"));
}

TEST_CASE("config: to_toml round trip and to_json", "[train][config]") {
  // Every key away from its default, strings that need escaping, awkward floats.
  TrainConfig c;
  c.model.model_name = "Qwen/Qwen3-8B \"quoted\" \\ back\tslash é";
  c.model.model_dir = "/models/Qwen3-8B";
  c.model.tokenizer = "/tok";
  c.model.train_llm = false;
  c.model.train_mlp = false;
  c.model.train_vit = true;
  auto& t = c.training;
  t.seed = 7;
  t.device = "cuda:1";
  t.total_steps = 12345;
  t.warmup_steps = 100;
  t.scheduler_type = optim::ScheduleType::linear;
  t.min_lr_ratio = 1.0 / 3.0;
  t.wsd_decay_ratio = 0.2;
  t.wsd_decay = optim::WsdDecay::cosine;
  t.lr_llm = 1e-5;
  t.lr_mlp = 0.1 + 0.2;
  t.lr_vit = 3e-300;
  t.weight_decay = 0;
  t.decay_norms = t.decay_biases = t.decay_embeddings = true;
  t.adam_beta1 = 0.8;
  t.adam_beta2 = 0.95;
  t.adam_eps = 1e-12;
  t.max_grad_norm = 0;
  t.tpi_multiplier = 1.25;
  t.micro_batch_rows = 3;
  t.param_dtype = DType::f32;
  t.grad_dtype = DType::bf16;
  t.ac_mode = AcMode::selective;
  t.loss_vocab_chunk = 4096;
  t.deterministic_attention = true;
  t.attention_workspace_gb = 0.75;
  t.random_init = true;
  t.eval_steps = 50;
  t.eval_batches = 0;
  t.caption_eval_images = 7;
  t.nan_policy = NanPolicy::skip;
  t.max_skipped_steps = 0;
  auto& d = c.data;
  d.data_path = "/data/x.yaml";
  d.make_demo = true;
  d.train_split = "tr";
  d.val_split = "va";
  d.seq_len = 16144;
  d.packing_buffer_size = 7;
  d.packing_plan = "/plan";
  d.overlong_policy = io::OverlongPolicy::drop;
  d.shuffle_buffer_size = 0;
  d.max_samples_per_sequence = 0;
  d.num_workers = 5;
  d.epochs = 3;
  d.max_skip_fraction = 0.25;
  d.min_pixels = 1;
  d.max_pixels = 2;
  c.parallel.tp_size = 4;
  c.parallel.sequence_parallel = true;
  c.parallel.data_parallel = DataParallel::fsdp;
  c.parallel.dp_replicate = 2;
  c.parallel.dp_shard = 8;
  c.parallel.reshard_after_forward = false;
  c.parallel.reduce_dtype = DType::bf16;
  c.parallel.grad_reduce = GradReduce::last_micro_step;
  c.parallel.collective_timeout_s = 0.5;
  c.checkpoint.output_dir = "runs/a b";
  c.checkpoint.save_steps = 0;
  c.checkpoint.save_final = false;
  c.checkpoint.hf_snapshot = HfSnapshot::every_save;
  c.checkpoint.keep_last = 3;
  c.checkpoint.resume = "latest";
  c.logging.log_every = 3;
  c.logging.metrics_file = "m.jsonl";
  c.logging.progress = false;
  c.logging.peak_tflops = 989.4;

  // Every field but model.preset (exclusive with model_dir) and checkpoint.format (resume needs
  // the default, hdf5) differs from the default, so the round trip really covers each one.
  const nlohmann::json jc = to_json(c), jd = to_json(TrainConfig{});
  size_t keys = 0;
  for (const auto& [section, obj] : jc.items())
    for (const auto& [key, value] : obj.items()) {
      INFO(section << "." << key);
      const std::string full = section + "." + key;
      if (full != "model.preset" && full != "checkpoint.format") CHECK(value != jd[section][key]);
      keys++;
    }
  CHECK(keys == train_config_keys().size());

  const std::string text = to_toml(c);
  CHECK(parse(text) == c);
  for (const ConfigKeyInfo& k : train_config_keys()) CHECK_THAT(text, Contains(k.key + " = "));
  CHECK(parse(to_toml(parse(kMinimal))) == parse(kMinimal));

  CHECK(jc["training"]["ac_mode"] == "selective");
  CHECK(jc["training"]["param_dtype"] == "f32");
  CHECK(jc["training"]["lr_llm"] == 1e-5);
  CHECK(jc["data"]["seq_len"] == 16144);
  CHECK(jc["logging"]["progress"] == false);
  CHECK(jc["model"]["model_name"] == c.model.model_name);
}

TEST_CASE("config: accumulation pattern of tpi_multiplier", "[train][config]") {
  using V = std::vector<int>;
  // The examples of reference-trainer.md §1 #12.
  CHECK(accumulation_pattern(1.5) == V{1, 2});
  CHECK(accumulation_pattern(1.25) == V{1, 1, 1, 2});
  CHECK(accumulation_pattern(12) == V{12});
  CHECK(accumulation_pattern(1) == V{1});
  CHECK(accumulation_pattern(2.4) == V{2, 2, 3, 2, 3});
  CHECK(accumulation_pattern(4.0 / 3.0) == V{1, 1, 2});
  CHECK(accumulation_pattern(1.3333333333) == V{1, 1, 2}); // 10 digits: close enough to 4/3
  CHECK(accumulation_pattern(1.01).size() == 100);
  // The mean is exactly the multiplier.
  for (double tpi : {1.1, 1.75, 2.5, 3.2, 7.125, 1.01}) {
    INFO(tpi);
    const V p = accumulation_pattern(tpi);
    double sum = 0;
    for (int k : p) sum += k;
    CHECK(sum / double(p.size()) == Approx(tpi).epsilon(1e-12));
    CHECK(*std::min_element(p.begin(), p.end()) >= 1);
  }
}

TEST_CASE("config: accumulation pattern rejects what it cannot represent", "[train][config]") {
  CHECK_THROWS_WITH(accumulation_pattern(0.5), Contains("tpi_multiplier = 0.5 must be in [1,"));
  CHECK_THROWS_WITH(accumulation_pattern(NAN), Contains("must be in [1,"));
  CHECK_THROWS_WITH(accumulation_pattern(INFINITY), Contains("must be in [1,"));
  CHECK_THROWS_WITH(accumulation_pattern(1e6), Contains("must be in [1, 100000]"));
  CHECK_THROWS_WITH(accumulation_pattern(1.001),
                    Contains("tpi_multiplier = 1.001 does not repeat within 100 optimizer steps"));
  CHECK_THROWS_WITH(accumulation_pattern(M_PI), Contains("the closest that does is"));
}

TEST_CASE("config: configs/README.md holds the generated key reference", "[train][config]") {
  const std::string readme = read_file(std::string(VLM_SOURCE_DIR) + "/configs/README.md");
  const std::string table = train_config_keys_markdown();
  INFO("regenerate the table in configs/README.md from train_config_keys_markdown():\n" << table);
  CHECK_THAT(readme, Contains(table));
  // One row per key.
  for (const ConfigKeyInfo& k : train_config_keys()) {
    INFO(k.section << "." << k.key);
    CHECK(!k.help.empty());
    CHECK_THAT(table, Contains("| `" + k.key + "` |"));
  }
}

TEST_CASE("config: load_train_config reads files and names missing ones", "[train][config]") {
  testing::TempDir dir("config");
  const std::string path = dir.write("c.toml", kMinimal);
  CHECK(load_train_config(path, {"training.seed=3"}).training.seed == 3);
  CHECK_THROWS_WITH(load_train_config(dir.file("missing.toml")),
                    Contains("config " + dir.file("missing.toml") + ": cannot open the file"));
  // A directory is not read as an empty config of defaults.
  CHECK_THROWS_WITH(load_train_config(dir.dir.string()),
                    Contains("config " + dir.dir.string() + ": is a directory, not a TOML file"));
  dir.write("bad.toml", kMinimal + "[training]\nlr_lmm = 1\n");
  CHECK_THROWS_WITH(load_train_config(dir.file("bad.toml")),
                    Contains("config " + dir.file("bad.toml") + ": line 6: unknown key"));
}
