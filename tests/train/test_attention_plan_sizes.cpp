// How many cuDNN attention plans a run meets (kernels/attention_cudnn.h: a graph per size class):
// the attention calls of real packed streams — the demo's micro-batches (the text model's and the
// vision tower's) and synthetic 4k / 8k / 32k rows of lognormal document lengths packed by the
// loader's own packer — fall in at most 16 size classes per configuration and rows level, each one
// of size_classes() (the set the trainer builds and checks in its first step), and every
// problem's rows fit the buffers and the backward's max_total. The counts are printed. And the
// batch of the trainer's forward before its first step (which builds the plans) runs every family.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "io/loader/packing.h"
#include "kernels/attention_cudnn.h"
#include "model/lm_loss.h"
#include "src/core/autograd.h"
#include "src/demo/demo_dataset.h"
#include "src/train/batches.h"
#include "src/train/config.h"
#include "src/train/trainer.h"
#include "tests/temp_dir.h"

using namespace vlm;
namespace ca = vlm::kernels::cudnn_attention;

namespace {

// The size classes met, per rows level.
using Classes = std::map<int64_t, std::set<std::pair<int64_t, int64_t>>>;

// One attention call on `cu_seqlens` (any head counts: the size class depends on the documents).
void add_call(Classes& met, const std::vector<int32_t>& cu_seqlens) {
  kernels::AttentionShape s;
  s.q_heads = 16;
  s.kv_heads = 8;
  s.head_dim = 128;
  s.tokens = cu_seqlens.back();
  s.docs = int64_t(cu_seqlens.size()) - 1;
  const ca::RaggedLayout l = ca::ragged_layout(cu_seqlens.data(), s);
  REQUIRE(l.batch > 0);
  INFO("T " << s.tokens << ", " << l.docs << " documents");
  const std::vector<ca::SizeClass> fixed = ca::size_classes(l.rows);
  CHECK(std::find(fixed.begin(), fixed.end(), l.size_class()) != fixed.end());
  CHECK(l.max_total >= s.tokens + l.spare_rows);
  met[l.rows].insert({l.batch, l.max_seq});
}

// Prints the classes met per rows level; returns how many plans they are in all.
size_t report(const char* stream, const Classes& met, int64_t calls) {
  size_t plans = 0;
  for (const auto& [rows, classes] : met) {
    std::printf(
        "attention plans, %s: %lld calls, rows level %lld: %zu size classes (of %zu):", stream,
        (long long)calls, (long long)rows, classes.size(), ca::size_classes(rows).size());
    for (const auto& [b, s] : classes) std::printf(" B%lld/S%lld", (long long)b, (long long)s);
    std::printf("\n");
    plans += classes.size();
  }
  return plans;
}

// Rows of `seq_len` packed by the loader's online packer from lognormal document lengths (median,
// sigma; at least 8 tokens, truncated to seq_len by the packer).
std::vector<io::PackedRow> lognormal_rows(int64_t seq_len, int64_t rows, double median,
                                          double sigma, uint32_t seed) {
  io::PackingConfig cfg;
  cfg.seq_len = seq_len;
  cfg.buffer_size = 200;
  io::OnlinePacker packer(cfg);
  std::mt19937 gen(seed);
  std::lognormal_distribution<double> length(std::log(median), sigma);
  std::vector<io::PackedRow> out;
  for (int64_t g = 0; int64_t(out.size()) < rows; g++) {
    io::TokenizedSample s;
    const int64_t n = std::max<int64_t>(8, int64_t(length(gen)));
    s.input_ids.assign(size_t(n), 100);
    s.labels.assign(size_t(n), 100);
    s.global_index = g;
    packer.push(std::move(s));
    while (packer.ready() && int64_t(out.size()) < rows) out.push_back(packer.pop());
  }
  return out;
}

} // namespace

TEST_CASE("attention plans: the demo's packed stream meets a small fixed set", "[train]") {
  testing::TempDir tmp("attention_plans");
  const std::string data = tmp.file("demo_data");
  demo::DemoDatasetOptions train_only; // the demo's whole training split
  train_only.val_samples = 0;
  demo::make_demo_dataset(data, train_only);
  const train::TrainConfig c = train::parse_train_config(
      train::builtin_demo_config_toml(), "built-in demo config",
      {"model.tokenizer=" + data, "data.data_path=" + data, "data.num_workers=1"});
  const io::Tokenizer tokenizer = io::Tokenizer::from_file(c.model.tokenizer);
  io::LoaderConfig lc =
      train::loader_config(c, tokenizer, c.model.tokenizer, c.data.train_split, true, true);
  lc.epochs = 1;
  io::DataLoader loader(lc, tokenizer);
  Classes text, vision;
  int64_t calls = 0;
  for (bool more = true; more;) {
    std::vector<io::PackedRow> rows;
    while (int64_t(rows.size()) < c.training.micro_batch_rows) {
      std::optional<io::PackedRow> r = loader.next();
      if (!r) break;
      rows.push_back(std::move(*r));
    }
    more = int64_t(rows.size()) == c.training.micro_batch_rows;
    if (!more) break; // training never ends an epoch: every micro-batch has its rows
    const model::Batch b = train::batch_from_rows(rows);
    const int32_t* cu_text = b.cu_seqlens.data<int32_t>();
    add_call(text, std::vector<int32_t>(cu_text, cu_text + b.cu_seqlens.numel()));
    // The vision tower: one segment per image and temporal slice (model/vision/vision_positions.h).
    std::vector<int32_t> cu = {0};
    for (const io::PackedRow& r : rows)
      for (const io::GridTHW& g : r.image_grid_thw)
        for (int64_t t = 0; t < g[0]; t++) cu.push_back(cu.back() + int32_t(g[1] * g[2]));
    if (cu.size() > 1) add_call(vision, cu);
    calls++;
  }
  REQUIRE(calls > 100);
  CHECK(report("demo text", text, calls) <= 16);
  CHECK(text.size() == 1); // a run at one seq_len: one rows level
  CHECK(report("demo vision tower", vision, calls) <= 16);
}

TEST_CASE("attention plans: 4k / 8k / 32k rows of realistic documents meet at most 16", "[train]") {
  struct Stream {
    int64_t seq_len, rows;
    double median, sigma;
  };
  // Chat/instruction lengths (median 700, the packing test's) and long-tailed web documents.
  for (Stream st :
       {Stream{4096, 400, 700, 0.9}, Stream{8192, 300, 700, 0.9}, Stream{32768, 120, 700, 0.9},
        Stream{32768, 120, 2000, 1.5}, Stream{8192, 300, 300, 1.2}}) {
    INFO("seq_len " << st.seq_len << ", median " << st.median << ", sigma " << st.sigma);
    Classes met;
    for (const io::PackedRow& r :
         lognormal_rows(st.seq_len, st.rows, st.median, st.sigma, uint32_t(st.seq_len)))
      add_call(met, r.cu_seqlens);
    char name[96];
    std::snprintf(name, sizeof name, "%lld-token rows, lognormal median %.0f sigma %.1f",
                  (long long)st.seq_len, st.median, st.sigma);
    CHECK(report(name, met, st.rows) <= 16);
    CHECK(met.size() == 1);
  }
}

TEST_CASE("attention plans: the trainer's forward before the first step runs every family",
          "[train]") {
  // On CUDA the trainer runs one forward without gradients on shape_batch (the run's micro-batch
  // shape, nothing to predict) to build the cuDNN plans before its first step. Here, on the CPU:
  // that batch is valid and the forward runs for each family, to a zero loss over zero targets.
  testing::TempDir tmp("shape_batch");
  const std::string data = tmp.file("demo_data");
  demo::DemoDatasetOptions small;
  small.train_samples = 300;
  small.val_samples = 0;
  demo::make_demo_dataset(data, small);
  for (const char* config : {"demo.toml", "demo-text.toml", "demo-qwen3.5.toml"}) {
    INFO(config);
    const train::TrainConfig c = train::load_train_config(
        std::string(VLM_SOURCE_DIR) + "/configs/" + config,
        {"model.tokenizer=" + data, "data.data_path=" + data, "data.num_workers=1",
         "checkpoint.output_dir=" + tmp.file(std::string("out-") + config),
         "logging.progress=false", "training.eval_steps=0", "training.caption_eval_images=0"});
    train::Trainer trainer(c);
    const bool mrope = trainer.model().has_vision();
    const model::Batch b = train::shape_batch(c, mrope);
    const int64_t T = c.training.micro_batch_rows * c.data.seq_len;
    CHECK(b.num_tokens() == T);
    CHECK(b.position_ids.numel() == (mrope ? 3 : 1) * T);
    CHECK(b.cu_seqlens.numel() == c.training.micro_batch_rows + 1);
    CHECK(model::count_targets(b) == 0);
    model::validate_batch(b, trainer.model().vocab_size());
    NoGradGuard no_grad;
    const Tensor loss = model::lm_loss(trainer.model(), b, Reduction::sum, {});
    CHECK(loss.to_doubles() == std::vector<double>{0.0});
  }
}
