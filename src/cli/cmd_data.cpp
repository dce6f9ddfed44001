#include "src/cli/cmd_data.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>

#include "io/energon/dataset.h"
#include "io/image/decode.h"
#include "io/image/preprocess.h"
#include "io/loader/loader.h"
#include "io/loader/packing_plan.h"
#include "io/loader/sample_pipeline.h"
#include "io/text/chat_format.h"
#include "io/text/tokenizer.h"
#include "src/base/check.h"
#include "src/cli/args.h"
#include "src/demo/demo_dataset.h"
#include "src/train/batches.h"
#include "src/train/config.h"
#include "src/train/model_setup.h"

namespace vlm::cli {

namespace {

// `text` with every line after the first indented by `prefix`.
std::string indent(const std::string& text, const std::string& prefix) {
  std::string out;
  for (size_t i = 0; i < text.size(); i++) {
    out += text[i];
    if (text[i] == '\n' && i + 1 < text.size()) out += prefix;
  }
  return out;
}

constexpr int64_t kMaxDemoSamples = 10000000;

// `data make-demo`: the synthetic shapes dataset of the demo.
void add_make_demo(CLI::App& data, demo::DemoDatasetOptions& o, std::string& out) {
  CLI::App* sub = data.add_subcommand(
      "make-demo", "writes a small synthetic Energon dataset: PNG images of coloured shapes with "
                   "captions, conversations about them, text-only samples, and the tokenizer.json "
                   "it is tokenized with");
  sub->add_option("out", out, "the new dataset's folder")->required();
  // Bounded: the demo writes every sample (~5 KB each).
  sub->add_option("--train", o.train_samples, "training samples")
      ->check(CLI::Range(int64_t(0), kMaxDemoSamples));
  sub->add_option("--val", o.val_samples, "validation samples")
      ->check(CLI::Range(int64_t(0), kMaxDemoSamples));
  sub->add_option("--seed", o.seed, "the random seed")->check(unsigned_64());
}

int make_demo(const demo::DemoDatasetOptions& o, const std::string& out) {
  std::printf("writing demo dataset to %s (%lld train, %lld val samples)...\n", out.c_str(),
              (long long)o.train_samples, (long long)o.val_samples);
  demo::make_demo_dataset(out, o);
  std::printf("done\n");
  return 0;
}

struct Stats {
  int64_t n = 0;
  double sum = 0, min = 1e300, max = -1e300;
  void add(double v) {
    n++;
    sum += v;
    min = std::min(min, v);
    max = std::max(max, v);
  }
  std::string str() const {
    if (n == 0) return "-";
    char b[96];
    std::snprintf(b, sizeof b, "mean %.1f, min %.0f, max %.0f (n=%lld)", sum / double(n), min, max,
                  (long long)n);
    return b;
  }
};

struct InspectOptions {
  std::string path, only_split, tokenizer_path;
  int64_t samples = 200;
};

void add_inspect(CLI::App& data, InspectOptions& o) {
  CLI::App* sub = data.add_subcommand(
      "inspect", "splits, shards and sample counts; part types, image sizes, sample kinds and "
                 "(with a tokenizer) token counts over the first N samples of each split");
  sub->add_option("path", o.path, "the dataset folder")->required();
  sub->add_option("--split", o.only_split, "only this split (default: all)");
  sub->add_option("--samples", o.samples, "samples read per split")->check(at_least(0));
  sub->add_option("--tokenizer", o.tokenizer_path, "a tokenizer.json for token counts");
}

// What the first samples of one split hold.
struct SplitStats {
  std::map<std::string, int64_t> parts, kinds;
  io::SkipReport skipped;
  Stats width, height, tokens, image_tokens, trained;
};

// One sample into `st`: its parts, kind, image sizes and (with a tokenizer) token counts.
void add_sample(SplitStats& st, const io::RawSample& s, const io::Tokenizer* tok) {
  const io::ImageProcessorConfig image_cfg;
  for (const auto& [p, bytes] : s.parts) st.parts[p]++;
  io::ChatSample chat = io::parse_chat_sample(s);
  st.kinds[chat.kind == io::SampleKind::text      ? "text"
           : chat.kind == io::SampleKind::caption ? "caption"
                                                  : "conversation"]++;
  std::vector<int64_t> pads;
  for (const auto& part : chat.image_parts) {
    io::Image img = io::decode_image(s.parts.at(part), part);
    st.width.add(double(img.width));
    st.height.add(double(img.height));
    auto [h, w] = io::smart_resize(img.height, img.width, image_cfg);
    pads.push_back(h * w /
                   (image_cfg.patch_size * image_cfg.patch_size * image_cfg.merge_size *
                    image_cfg.merge_size));
    st.image_tokens.add(double(pads.back()));
  }
  if (tok) {
    io::TokenizedChat t = io::tokenize_chat(chat, *tok, pads);
    st.tokens.add(double(t.input_ids.size()));
    st.trained.add(double(
        std::count_if(t.labels.begin(), t.labels.end(), [](int32_t l) { return l != -100; })));
  }
}

// The first n samples of a split; a bad sample is skipped by the loader's rule and counted.
SplitStats scan_split(const io::EnergonDataset& ds, const io::EnergonDataset::Split& split,
                      int64_t n, const io::Tokenizer* tok) {
  SplitStats st;
  for (int64_t i = 0; i < n; i++) {
    std::string shard, key;
    try {
      io::RawSample s = ds.read_sample(split, i);
      if (s.excluded) {
        st.skipped.excluded++;
        continue;
      }
      shard = s.shard;
      key = s.key;
      add_sample(st, s, tok);
    } catch (const Error& e) {
      const std::string reason = io::sample_skip_reason(e); // the loader's rule
      if (reason.empty()) throw;                            // not about one sample
      if (const auto* r = dynamic_cast<const io::SampleError*>(&e)) {
        shard = r->shard;
        key = r->key;
      }
      st.skipped.add({reason, ds.root(), shard, key, i, e.what()});
    }
  }
  return st;
}

int inspect(const InspectOptions& o) {
  io::EnergonDataset ds = io::EnergonDataset::open(o.path);
  std::optional<io::Tokenizer> tok;
  if (!o.tokenizer_path.empty()) tok = io::Tokenizer::from_file(o.tokenizer_path);
  std::printf("dataset %s\n  class %s, energon %s\n", ds.root().c_str(), ds.dataset_class().c_str(),
              ds.energon_version().empty() ? "?" : ds.energon_version().c_str());
  for (const auto& [k, v] : ds.subflavors())
    std::printf("  subflavor %s = %s\n", k.c_str(), v.c_str());
  for (const std::string& name : ds.split_names()) {
    if (!o.only_split.empty() && name != o.only_split) continue;
    const auto& split = ds.split(name);
    std::printf("split %s: %lld samples in %zu shards\n", name.c_str(),
                (long long)split.num_samples, split.shards.size());
    const int64_t n = std::min(o.samples, split.num_samples);
    const SplitStats st = scan_split(ds, split, n, tok ? &*tok : nullptr);
    std::printf("  first %lld samples:\n    parts:", (long long)n);
    for (const auto& [p, c] : st.parts) std::printf(" %s %lld", p.c_str(), (long long)c);
    std::printf("\n    kinds:");
    for (const auto& [k, c] : st.kinds) std::printf(" %s %lld", k.c_str(), (long long)c);
    std::printf("\n    image width: %s\n    image height: %s\n    image tokens: %s\n",
                st.width.str().c_str(), st.height.str().c_str(), st.image_tokens.str().c_str());
    if (tok)
      std::printf("    tokens per sample: %s\n    trained tokens per sample: %s\n",
                  st.tokens.str().c_str(), st.trained.str().c_str());
    else
      std::printf("    (token statistics: pass --tokenizer PATH)\n");
    if (const std::string report = st.skipped.summary(); !report.empty())
      std::printf("    skipped: %s", indent(report, "    ").c_str());
  }
  return 0;
}

struct PackOptions {
  io::LoaderConfig cfg;
  io::PlanOptions plan;
  std::string out, config_path, overlong = "truncate";
  std::vector<std::string> overrides;
  int64_t threads = 2;
  bool no_shuffle = false;
};

// The options that set the loader by hand; with --config the training config decides them.
constexpr const char* kLoaderOptions[] = {"--tokenizer", "--seq-len",    "--split",
                                          "--overlong",  "--min-pixels", "--max-pixels",
                                          "--mrope",     "--drop-images"};

CLI::App* add_pack(CLI::App& data, PackOptions& o) {
  CLI::App* sub = data.add_subcommand(
      "pack", "offline packing: scans the length of every sample of the split (tokenized, images "
              "sized) and writes a packing plan that the loader replays (`data.packing_plan`). "
              "With --config the settings are the training run's (data.*, the tokenizer, images "
              "dropped for text models), so training accepts the plan; --drop-images packs for a "
              "text model by hand");
  io::LoaderConfig& c = o.cfg;
  c.packing.seq_len = 0;
  sub->add_option("path", c.dataset, "the dataset (default with --config: data.data_path)");
  sub->add_option("--out", o.out, "the plan file to write")->required();
  sub->add_option("--config", o.config_path, "a training config: its loader settings");
  sub->add_option("--set", o.overrides, "with --config: section.key=value (repeatable)")
      ->take_all()
      ->expected(1);
  sub->add_option("--tokenizer", c.tokenizer, "tokenizer.json or its folder");
  sub->add_option("--seq-len", c.packing.seq_len, "tokens per packed row")->check(at_least(1));
  sub->add_option("--split", c.split, "the split to pack");
  sub->add_option("--overlong", o.overlong, "a sample longer than a row")
      ->check(CLI::IsMember({"truncate", "drop"}));
  sub->add_option("--min-pixels", c.image.min_pixels, "smallest image size in pixels")
      ->check(at_least(0));
  sub->add_option("--max-pixels", c.image.max_pixels, "largest image size in pixels")
      ->check(at_least(0));
  sub->add_flag("--mrope", c.packing.mrope, "MRoPE position ids (a vision-language model)");
  sub->add_flag("--drop-images", c.chat.drop_images, "pack for a text model: images dropped");
  sub->add_option("--window", o.plan.window, "samples packed together (0: the whole split)")
      ->check(at_least(0));
  sub->add_option("--seed", o.plan.seed, "the row shuffle's seed")->check(unsigned_64());
  sub->add_flag("--no-shuffle", o.no_shuffle, "keep the rows in packing order");
  sub->add_option("--threads", o.threads, "scanning threads")
      ->check(CLI::Range(int64_t(1), int64_t(io::kMaxNumWorkers)));
  return sub;
}

// The loader settings the plan is made for, and the tokenizer: the training run's own (built by
// the function training uses, so the plan is made for exactly what the loader will check), or
// those of the options.
io::Tokenizer pack_loader_config(PackOptions& o, const CLI::App& sub) {
  io::LoaderConfig& cfg = o.cfg;
  cfg.packing.overlong = io::parse_overlong_policy(o.overlong);
  o.plan.shuffle_rows = !o.no_shuffle;
  if (!o.config_path.empty()) {
    for (const char* name : kLoaderOptions)
      VLM_CHECK(sub.count(name) == 0, "data pack: ", name,
                " comes from the training config with --config (use --set to change it)");
    const train::TrainConfig tc = train::load_train_config(o.config_path, o.overrides);
    io::Tokenizer tok = io::Tokenizer::from_file(tc.model.tokenizer);
    const std::string dataset = cfg.dataset;
    const bool vision = train::describe_model(tc, tok)->has_vision();
    cfg = train::loader_config(tc, tok, tc.model.tokenizer, tc.data.train_split, true, vision);
    VLM_CHECK(dataset.empty() || dataset == tc.data.data_path, "data pack: dataset '", dataset,
              "' differs from data.data_path '", tc.data.data_path, "' of ", o.config_path);
    cfg.packing_plan.clear();
    return tok;
  }
  VLM_CHECK(o.overrides.empty(), "data pack: --set needs --config");
  VLM_CHECK(!cfg.dataset.empty(), "data pack: missing dataset PATH (or --config)");
  VLM_CHECK(!cfg.tokenizer.empty(), "data pack: missing --tokenizer PATH (or --config)");
  VLM_CHECK(cfg.packing.seq_len > 0, "data pack: missing --seq-len N (or --config)");
  io::Tokenizer tok = io::Tokenizer::from_file(cfg.tokenizer);
  io::set_token_ids(cfg.packing, tok); // the tokenizer's own ids, as training takes them
  return tok;
}

int pack(PackOptions& o, const CLI::App& sub) {
  const io::Tokenizer tok = pack_loader_config(o, sub);
  io::LoaderConfig& cfg = o.cfg;
  const int64_t threads = o.threads;
  const std::string& out = o.out;
  const io::PlanOptions& opt = o.plan;
  cfg.validate();

  auto start = std::chrono::steady_clock::now();
  std::printf("scanning %s (split %s) with %lld threads...\n", cfg.dataset.c_str(),
              cfg.split.c_str(), (long long)threads);
  std::fflush(stdout);
  io::SkipReport skips;
  std::vector<int32_t> lengths = io::scan_sample_lengths(cfg, int(threads), &skips, &tok);
  double scan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  io::PackingPlan plan = io::write_packing_plan(out, lengths, io::loader_plan_identity(cfg), opt);
  std::printf("scanned %zu samples in %.1fs (%.0f samples/s)\n", lengths.size(), scan_s,
              double(lengths.size()) / std::max(scan_s, 1e-9));
  std::printf("wrote %s: %lld rows of %lld tokens, %lld samples packed, %lld skipped, "
              "fill %.4f (%lld real, %lld pad tokens)\n",
              out.c_str(), (long long)plan.num_rows(), (long long)cfg.packing.seq_len,
              (long long)plan.num_packed(), (long long)plan.num_skipped(), plan.efficiency(),
              (long long)plan.real_tokens(), (long long)plan.pad_tokens());
  std::string summary = skips.summary();
  if (!summary.empty()) std::printf("skipped samples:\n%s", summary.c_str());
  return 0;
}

} // namespace

int cmd_data(const std::vector<std::string>& args) {
  CLI::App app{"Dataset tools: make-demo, inspect, pack.", "vlmtrain data"};
  show_defaults(app);
  app.require_subcommand(1);
  demo::DemoDatasetOptions demo_options;
  std::string demo_out;
  add_make_demo(app, demo_options, demo_out);
  InspectOptions inspect_options;
  add_inspect(app, inspect_options);
  PackOptions pack_options;
  CLI::App* pack_command = add_pack(app, pack_options);
  if (args.empty()) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  if (!parse_args(app, args)) return 0;
  if (app.got_subcommand("make-demo")) return make_demo(demo_options, demo_out);
  if (app.got_subcommand("inspect")) return inspect(inspect_options);
  return pack(pack_options, *pack_command);
}

} // namespace vlm::cli
