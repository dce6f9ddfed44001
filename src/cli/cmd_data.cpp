#include "src/cli/cmd_data.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
#include "src/demo/demo_dataset.h"
#include "src/train/batches.h"
#include "src/train/config.h"
#include "src/train/model_setup.h"

namespace vlm::cli {

namespace {

const char* kDataUsage = R"(usage:
  vlmtrain data make-demo OUT [--train N (4000)] [--val N (200)] [--seed S (0)]
      writes a small synthetic Energon dataset: PNG images of coloured shapes with captions,
      conversations about them, text-only samples, and the tokenizer.json it is tokenized with
  vlmtrain data inspect PATH [--split NAME] [--samples N (200)] [--tokenizer PATH]
      splits, shards and sample counts; part types, image sizes, sample kinds and (with a
      tokenizer) token counts over the first N samples of each split
  vlmtrain data pack --config FILE [--set section.key=value ...] --out FILE [plan options]
  vlmtrain data pack PATH --tokenizer PATH --seq-len N --out FILE [--split NAME (train)]
                    [--overlong truncate|drop] [--min-pixels N] [--max-pixels N] [--mrope]
                    [--drop-images] [plan options]
      plan options: [--window N (0: whole split)] [--seed S (0)] [--no-shuffle] [--threads N (2)]
      offline packing: scans the length of every sample of the split (tokenized, images sized)
      and writes a packing plan that the loader replays (`data.packing_plan`). With --config the
      settings are the training run's (data.*, the tokenizer, images dropped for text models),
      so training accepts the plan; --drop-images packs for a text model by hand
)";

// `text` with every line after the first indented by `prefix`.
std::string indent(const std::string& text, const std::string& prefix) {
  std::string out;
  for (size_t i = 0; i < text.size(); i++) {
    out += text[i];
    if (text[i] == '\n' && i + 1 < text.size()) out += prefix;
  }
  return out;
}

// The value of option args[i] as an integer in [0, most], naming the option otherwise.
int64_t int_arg(const std::vector<std::string>& args, size_t& i,
                int64_t most = std::numeric_limits<int64_t>::max()) {
  VLM_CHECK(i + 1 < args.size(), "option ", args[i], " needs a value");
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(args[i + 1].c_str(), &end, 10);
  VLM_CHECK(end && *end == '\0' && errno == 0 && v >= 0 && v <= most, "option ", args[i],
            " expects an integer in [0, ", most, "], got '", args[i + 1], "'");
  i++;
  return v;
}

constexpr int64_t kMaxDemoSamples = 10000000;

int make_demo(const std::vector<std::string>& args) {
  demo::DemoDatasetOptions o;
  std::string out;
  for (size_t i = 0; i < args.size(); i++) {
    if (args[i] == "--train") // bounded: the demo writes every sample (~5 KB each)
      o.train_samples = int_arg(args, i, kMaxDemoSamples);
    else if (args[i] == "--val")
      o.val_samples = int_arg(args, i, kMaxDemoSamples);
    else if (args[i] == "--seed")
      o.seed = uint64_t(int_arg(args, i));
    else if (out.empty() && args[i][0] != '-')
      out = args[i];
    else
      VLM_FAIL("data make-demo: unexpected argument '", args[i], "'\n", kDataUsage);
  }
  VLM_CHECK(!out.empty(), "data make-demo: missing OUT folder\n", kDataUsage);
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

int inspect(const std::vector<std::string>& args) {
  std::string path, only_split, tokenizer_path;
  int64_t samples = 200;
  for (size_t i = 0; i < args.size(); i++) {
    if (args[i] == "--samples")
      samples = int_arg(args, i);
    else if (args[i] == "--split" && i + 1 < args.size())
      only_split = args[++i];
    else if (args[i] == "--tokenizer" && i + 1 < args.size())
      tokenizer_path = args[++i];
    else if (path.empty() && args[i][0] != '-')
      path = args[i];
    else
      VLM_FAIL("data inspect: unexpected argument '", args[i], "'\n", kDataUsage);
  }
  VLM_CHECK(!path.empty(), "data inspect: missing PATH\n", kDataUsage);
  io::EnergonDataset ds = io::EnergonDataset::open(path);
  std::optional<io::Tokenizer> tok;
  if (!tokenizer_path.empty()) tok = io::Tokenizer::from_file(tokenizer_path);
  io::ImageProcessorConfig image_cfg;

  std::printf("dataset %s\n  class %s, energon %s\n", ds.root().c_str(), ds.dataset_class().c_str(),
              ds.energon_version().empty() ? "?" : ds.energon_version().c_str());
  for (const auto& [k, v] : ds.subflavors())
    std::printf("  subflavor %s = %s\n", k.c_str(), v.c_str());
  for (const std::string& name : ds.split_names()) {
    if (!only_split.empty() && name != only_split) continue;
    const auto& split = ds.split(name);
    std::printf("split %s: %lld samples in %zu shards\n", name.c_str(),
                (long long)split.num_samples, split.shards.size());
    std::map<std::string, int64_t> parts, kinds;
    io::SkipReport skipped;
    Stats width, height, tokens, image_tokens, trained;
    int64_t n = std::min(samples, split.num_samples);
    for (int64_t i = 0; i < n; i++) {
      std::string shard, key;
      try {
        io::RawSample s = ds.read_sample(split, i);
        if (s.excluded) {
          skipped.excluded++;
          continue;
        }
        shard = s.shard;
        key = s.key;
        for (const auto& [p, bytes] : s.parts) parts[p]++;
        io::ChatSample chat = io::parse_chat_sample(s);
        kinds[chat.kind == io::SampleKind::text      ? "text"
              : chat.kind == io::SampleKind::caption ? "caption"
                                                     : "conversation"]++;
        std::vector<int64_t> pads;
        for (const auto& part : chat.image_parts) {
          io::Image img = io::decode_image(s.parts.at(part), part);
          width.add(double(img.width));
          height.add(double(img.height));
          auto [h, w] = io::smart_resize(img.height, img.width, image_cfg);
          pads.push_back(h * w /
                         (image_cfg.patch_size * image_cfg.patch_size * image_cfg.merge_size *
                          image_cfg.merge_size));
          image_tokens.add(double(pads.back()));
        }
        if (tok) {
          io::TokenizedChat t = io::tokenize_chat(chat, *tok, pads);
          tokens.add(double(t.input_ids.size()));
          trained.add(double(std::count_if(t.labels.begin(), t.labels.end(),
                                           [](int32_t l) { return l != -100; })));
        }
      } catch (const Error& e) {
        const std::string reason = io::sample_skip_reason(e); // the loader's rule
        if (reason.empty()) throw;                            // not about one sample
        if (const auto* r = dynamic_cast<const io::SampleError*>(&e)) {
          shard = r->shard;
          key = r->key;
        }
        skipped.add({reason, ds.root(), shard, key, i, e.what()});
      }
    }
    std::printf("  first %lld samples:\n    parts:", (long long)n);
    for (const auto& [p, c] : parts) std::printf(" %s %lld", p.c_str(), (long long)c);
    std::printf("\n    kinds:");
    for (const auto& [k, c] : kinds) std::printf(" %s %lld", k.c_str(), (long long)c);
    std::printf("\n    image width: %s\n    image height: %s\n    image tokens: %s\n",
                width.str().c_str(), height.str().c_str(), image_tokens.str().c_str());
    if (tok)
      std::printf("    tokens per sample: %s\n    trained tokens per sample: %s\n",
                  tokens.str().c_str(), trained.str().c_str());
    else
      std::printf("    (token statistics: pass --tokenizer PATH)\n");
    if (const std::string report = skipped.summary(); !report.empty())
      std::printf("    skipped: %s", indent(report, "    ").c_str());
  }
  return 0;
}

int pack(const std::vector<std::string>& args) {
  io::LoaderConfig cfg;
  cfg.packing.seq_len = 0;
  io::PlanOptions opt;
  std::string out, config_path;
  std::vector<std::string> overrides;
  std::vector<std::string> loader_flags; // flags the training config decides instead
  int64_t threads = 2;
  auto str_arg = [&](size_t& i) -> std::string {
    VLM_CHECK(i + 1 < args.size(), "option ", args[i], " needs a value");
    return args[++i];
  };
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    const bool loader_flag = a == "--tokenizer" || a == "--seq-len" || a == "--split" ||
                             a == "--overlong" || a == "--min-pixels" || a == "--max-pixels" ||
                             a == "--mrope" || a == "--drop-images";
    if (loader_flag) loader_flags.push_back(a);
    if (a == "--config")
      config_path = str_arg(i);
    else if (a == "--set")
      overrides.push_back(str_arg(i));
    else if (a == "--tokenizer")
      cfg.tokenizer = str_arg(i);
    else if (a == "--seq-len")
      cfg.packing.seq_len = int_arg(args, i);
    else if (a == "--out")
      out = str_arg(i);
    else if (a == "--split")
      cfg.split = str_arg(i);
    else if (a == "--overlong")
      cfg.packing.overlong = io::parse_overlong_policy(str_arg(i));
    else if (a == "--window")
      opt.window = int_arg(args, i);
    else if (a == "--seed")
      opt.seed = uint64_t(int_arg(args, i));
    else if (a == "--no-shuffle")
      opt.shuffle_rows = false;
    else if (a == "--threads")
      threads = int_arg(args, i, io::kMaxNumWorkers);
    else if (a == "--min-pixels")
      cfg.image.min_pixels = int_arg(args, i);
    else if (a == "--max-pixels")
      cfg.image.max_pixels = int_arg(args, i);
    else if (a == "--mrope")
      cfg.packing.mrope = true;
    else if (a == "--drop-images")
      cfg.chat.drop_images = true;
    else if (cfg.dataset.empty() && a[0] != '-')
      cfg.dataset = a;
    else
      VLM_FAIL("data pack: unexpected argument '", a, "'\n", kDataUsage);
  }
  VLM_CHECK(!out.empty(), "data pack: missing --out FILE\n", kDataUsage);
  VLM_CHECK(threads >= 1 && threads <= io::kMaxNumWorkers, "data pack: --threads must be in [1, ",
            io::kMaxNumWorkers, "], got ", threads);
  std::optional<io::Tokenizer> tok;
  if (!config_path.empty()) {
    // The loader settings of the training run itself, built by the function training uses, so
    // the plan is made for exactly what the loader will check.
    VLM_CHECK(loader_flags.empty(), "data pack: ", loader_flags[0],
              " comes from the training config with --config (use --set to change it)");
    const train::TrainConfig tc = train::load_train_config(config_path, overrides);
    tok = io::Tokenizer::from_file(tc.model.tokenizer);
    const std::string dataset = cfg.dataset;
    const bool vision = train::describe_model(tc, *tok)->has_vision();
    cfg = train::loader_config(tc, *tok, tc.model.tokenizer, tc.data.train_split, true, vision);
    VLM_CHECK(dataset.empty() || dataset == tc.data.data_path, "data pack: dataset '", dataset,
              "' differs from data.data_path '", tc.data.data_path, "' of ", config_path);
    cfg.packing_plan.clear();
  } else {
    VLM_CHECK(overrides.empty(), "data pack: --set needs --config");
    VLM_CHECK(!cfg.dataset.empty(), "data pack: missing dataset PATH\n", kDataUsage);
    VLM_CHECK(!cfg.tokenizer.empty(), "data pack: missing --tokenizer PATH\n", kDataUsage);
    VLM_CHECK(cfg.packing.seq_len > 0, "data pack: missing --seq-len N\n", kDataUsage);
    tok = io::Tokenizer::from_file(cfg.tokenizer);
    io::set_token_ids(cfg.packing, *tok); // the tokenizer's own ids, as training takes them
  }
  cfg.validate();

  auto start = std::chrono::steady_clock::now();
  std::printf("scanning %s (split %s) with %lld threads...\n", cfg.dataset.c_str(),
              cfg.split.c_str(), (long long)threads);
  std::fflush(stdout);
  io::SkipReport skips;
  std::vector<int32_t> lengths = io::scan_sample_lengths(cfg, int(threads), &skips, &*tok);
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
  std::string sub = args.empty() ? "help" : args[0];
  std::vector<std::string> rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  if (sub == "make-demo") return make_demo(rest);
  if (sub == "inspect") return inspect(rest);
  if (sub == "pack") return pack(rest);
  if (sub == "help" || sub == "--help" || sub == "-h") {
    std::printf("%s", kDataUsage);
    return 0;
  }
  std::fprintf(stderr, "unknown data command '%s'\n%s", sub.c_str(), kDataUsage);
  return 2;
}

} // namespace vlm::cli
