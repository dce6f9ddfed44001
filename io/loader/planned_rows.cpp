#include "io/loader/planned_rows.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "io/loader/loader_inputs.h"
#include "src/base/check.h"

namespace vlm::io {

namespace fs = std::filesystem;

PackingPlan open_planned_rows(const LoaderConfig& cfg, size_t num_datasets, bool subset) {
  VLM_CHECK(num_datasets == 1, "data loader: a packing plan needs a single dataset, '", cfg.dataset,
            "' has ", num_datasets);
  VLM_CHECK(!subset, "data loader: a packing plan cannot be combined with a subset");
  PackingPlan plan = PackingPlan::load(cfg.packing_plan);
  try {
    plan.check_identity(loader_plan_identity(cfg));
  } catch (const vlm::Error& e) {
    VLM_FAIL("data loader: packing plan '", cfg.packing_plan,
             "' was made for other data: ", e.what());
  }
  return plan;
}

std::optional<PackedRow> read_planned_row(const PackingPlan& plan, int64_t r,
                                          const SamplePipeline& pipeline,
                                          const PackingConfig& packing, LoaderWorkerState* st) {
  std::vector<TokenizedSample> docs;
  for (int64_t index : plan.row(r)) {
    st->samples++;
    auto ps = pipeline.process(index, &st->skips, /*with_pixels=*/true);
    if (ps) docs.push_back(std::move(ps->tokens));
  }
  if (docs.empty()) return std::nullopt;
  return plan.pack(r, std::move(docs), packing);
}

// ---- `vlmtrain data pack` ----

PlanIdentity loader_plan_identity(const LoaderConfig& cfg) {
  VLM_CHECK(!is_metadataset_path(cfg.dataset),
            "packing plans are made for a single dataset folder, not a metadataset ('", cfg.dataset,
            "')");
  EnergonDataset ds = EnergonDataset::open(cfg.dataset);
  const EnergonDataset::Split& sp = ds.split(cfg.split);
  // Tokenizer::from_file accepts tokenizer.json or its folder.
  std::string tok_file = fs::is_directory(cfg.tokenizer)
                             ? (fs::path(cfg.tokenizer) / "tokenizer.json").string()
                             : cfg.tokenizer;
  const ImageProcessorConfig& im = cfg.image;
  const PackingConfig& p = cfg.packing;
  PlanIdentity id;
  id.dataset = folder_name(cfg.dataset);
  id.split = cfg.split;
  id.sample_count = sp.num_samples;
  id.seq_len = p.seq_len;
  id.overlong = p.overlong;
  std::string subflavors;
  for (const auto& [k, v] : ds.subflavors()) subflavors += k + "=" + v + ";";
  id.fingerprint = {
      {"shards", split_fingerprint(ds, sp)},
      {"subflavors", subflavors},
      {"tokenizer", file_fingerprint(tok_file)},
      {"image", "patch=" + std::to_string(im.patch_size) +
                    " merge=" + std::to_string(im.merge_size) +
                    " temporal=" + std::to_string(im.temporal_patch_size) + " min_pixels=" +
                    std::to_string(im.min_pixels) + " max_pixels=" + std::to_string(im.max_pixels)},
      {"chat", std::string("text_eos=") + (cfg.chat.text_eos ? "1" : "0") +
                   " drop_images=" + (cfg.chat.drop_images ? "1" : "0")},
      {"tokens", "image=" + std::to_string(p.image_token_id) +
                     " vision_start=" + std::to_string(p.vision_start_id) +
                     " vision_end=" + std::to_string(p.vision_end_id) +
                     " spatial_merge=" + std::to_string(p.spatial_merge_size)},
  };
  return id;
}

std::vector<int32_t> scan_sample_lengths(const LoaderConfig& cfg, int threads, SkipReport* report,
                                         const Tokenizer* tokenizer) {
  cfg.packing.validate();
  VLM_CHECK(!is_metadataset_path(cfg.dataset), "scan_sample_lengths: '", cfg.dataset,
            "' is a metadataset; scan a single dataset folder");
  Sources src = open_sources(cfg);
  const Leaf& leaf = src.leaves.at(0);
  Tokenizer tok = tokenizer ? *tokenizer : load_tokenizer(cfg.tokenizer);
  check_token_ids(cfg.packing, tok);
  SamplePipeline pipeline({{leaf.dataset, leaf.split, {}}}, std::move(tok),
                          SamplePipelineConfig{cfg.image, cfg.chat});
  const int64_t n = leaf.dataset->split(leaf.split).num_samples;
  std::vector<int32_t> lengths(static_cast<size_t>(n), 0);
  const int64_t T = std::max<int64_t>(1, std::min<int64_t>(threads, std::max<int64_t>(n, 1)));
  // Contiguous blocks per thread, reports merged in block order: deterministic output.
  std::vector<SkipReport> reports(static_cast<size_t>(T));
  std::vector<std::string> errors(static_cast<size_t>(T));
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < T; t++)
    pool.emplace_back([&, t] {
      SkipReport& rep = reports[size_t(t)];
      rep.max_examples = cfg.report_examples;
      try {
        for (int64_t i = n * t / T; i < n * (t + 1) / T; i++) {
          auto ps = pipeline.process(i, &rep);
          if (!ps) continue;
          TokenizedSample& s = ps->tokens;
          PrepareResult r = prepare_sample(s, cfg.packing);
          if (is_dropped(r.fate)) {
            rep.add({std::string("pack:") + sample_fate_name(r.fate), leaf.dataset->root(),
                     ps->shard, ps->key, i, r.reason});
            continue;
          }
          lengths[size_t(i)] = int32_t(s.length());
        }
      } catch (const std::exception& e) {
        errors[size_t(t)] = e.what();
      }
    });
  for (std::thread& th : pool) th.join();
  for (const std::string& e : errors) VLM_CHECK(e.empty(), "scan_sample_lengths: ", e);
  if (report) {
    report->max_examples = cfg.report_examples;
    for (const SkipReport& r : reports) report->merge(r);
  }
  return lengths;
}

} // namespace vlm::io
