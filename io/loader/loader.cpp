#include "io/loader/loader.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "io/energon/metadataset.h"
#include "src/base/check.h"
#include "src/base/logging.h"

namespace vlm::io {

namespace fs = std::filesystem;
using nlohmann::json;

void LoaderConfig::validate() const {
  VLM_CHECK(!dataset.empty(), "data loader: no dataset path given");
  VLM_CHECK(!split.empty(), "data loader: no split given");
  VLM_CHECK(!tokenizer.empty(), "data loader: no tokenizer path given");
  VLM_CHECK(epochs >= 0, "data loader: epochs must be >= 0 (0 = forever), got ", epochs);
  VLM_CHECK(dp_world >= 1 && 0 <= dp_rank && dp_rank < dp_world, "data loader: dp_rank ", dp_rank,
            " is not in [0, dp_world = ", dp_world, ")");
  VLM_CHECK(num_workers >= 1 && num_workers <= kMaxNumWorkers,
            "data loader: num_workers must be in [1, ", kMaxNumWorkers, "], got ", num_workers);
  VLM_CHECK(shuffle_buffer_size >= 0 && shuffle_buffer_size <= kMaxShuffleBufferSize,
            "data loader: shuffle_buffer_size must be in [0, ", kMaxShuffleBufferSize, "], got ",
            shuffle_buffer_size);
  VLM_CHECK(max_samples_per_sequence >= 0, "data loader: max_samples_per_sequence must be >= 0");
  VLM_CHECK(parallel_slices >= 1 && parallel_slices <= kMaxShuffleBufferSize,
            "data loader: parallel_slices must be in [1, ", kMaxShuffleBufferSize, "], got ",
            parallel_slices);
  VLM_CHECK(prefetch >= 1 && prefetch <= kMaxPrefetch, "data loader: prefetch must be in [1, ",
            kMaxPrefetch, "], got ", prefetch);
  VLM_CHECK(image.min_pixels >= 1 && image.max_pixels >= image.min_pixels &&
                image.max_pixels <= kMaxDecodePixels,
            "data loader: image pixels must satisfy 1 <= min_pixels <= max_pixels <= ",
            kMaxDecodePixels, ", got ", image.min_pixels, " and ", image.max_pixels);
  packing.validate();
}

namespace {

uint64_t fnv1a(const std::string& s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}
std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool is_metadataset_path(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  return ext == ".yaml" || ext == ".yml";
}

// The folder name of a dataset path ("a/b/ds/" -> "ds").
std::string folder_name(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

// Shard names, counts and excludes of a split: what decides its index space and content.
std::string split_fingerprint(const EnergonDataset& ds, const EnergonDataset::Split& split) {
  std::string s;
  for (const ShardInfo& sh : split.shards) s += sh.name + ":" + std::to_string(sh.count) + ";";
  for (const std::string& e : ds.excludes()) s += "exclude:" + e + ";";
  return hex64(fnv1a(s));
}

std::string file_fingerprint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VLM_CHECK(in, "cannot read '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return hex64(fnv1a(ss.str()));
}

// One leaf of the data: a dataset split (or subset of it) with its blend parameters.
struct Leaf {
  std::shared_ptr<const EnergonDataset> dataset;
  std::string split;
  int64_t start = 0, end = 0;
  double weight = 1.0, repetitions = 1.0;
  std::map<std::string, std::string> subflavors; // merged; empty = the dataset's own
  std::vector<int64_t> shard_counts;
};

struct Sources {
  std::vector<Leaf> leaves;
  BlendMode blend = BlendMode::none;
};

Sources open_sources(const LoaderConfig& cfg) {
  Sources out;
  auto open = [&](const std::string& path, const EnergonOpenOptions& opt) {
    try {
      return std::make_shared<const EnergonDataset>(EnergonDataset::open(path, opt));
    } catch (const vlm::Error& e) {
      VLM_FAIL("data loader: cannot open dataset '", path, "': ", e.what());
    }
  };
  auto add_leaf = [&](std::shared_ptr<const EnergonDataset> ds, const std::string& split,
                      const DatasetSubset& subset, const std::string& what) {
    Leaf leaf;
    leaf.dataset = std::move(ds);
    leaf.split = split;
    const EnergonDataset::Split* sp = nullptr;
    try {
      sp = &leaf.dataset->split(split);
    } catch (const vlm::Error& e) {
      VLM_FAIL("data loader: dataset '", leaf.dataset->root(), "': ", e.what());
    }
    for (const ShardInfo& sh : sp->shards) leaf.shard_counts.push_back(sh.count);
    std::tie(leaf.start, leaf.end) = subset.apply(sp->num_samples, what);
    out.leaves.push_back(std::move(leaf));
  };

  if (is_metadataset_path(cfg.dataset)) {
    ResolvedSplit rs = resolve_metadataset(cfg.dataset, cfg.split);
    out.blend = rs.mode;
    for (const MetadatasetLeaf& ml : rs.leaves) {
      VLM_CHECK(ml.shuffle_over_epochs && *ml.shuffle_over_epochs == 1, "data loader: ", ml.source,
                ": shuffle_over_epochs_multiplier other than 1 is not supported by this loader");
      EnergonOpenOptions opt;
      opt.dataset_config = ml.dataset_config;
      opt.split_config = ml.split_config;
      add_leaf(open(ml.path, opt), ml.split, ml.subset, ml.source);
      Leaf& leaf = out.leaves.back();
      leaf.weight = ml.weight;
      leaf.repetitions = ml.repetitions;
      if (!ml.subflavors.empty())
        leaf.subflavors = merge_subflavors(leaf.dataset->subflavors(), ml.subflavors);
    }
  } else {
    VLM_CHECK(fs::is_directory(cfg.dataset), "data loader: dataset '", cfg.dataset,
              "' is neither a prepared dataset folder nor a metadataset .yaml file");
    add_leaf(open(cfg.dataset, {}), cfg.split, DatasetSubset{}, cfg.dataset);
  }
  VLM_CHECK(!out.leaves.empty(), "data loader: '", cfg.dataset, "' has no datasets for split '",
            cfg.split, "'");
  return out;
}

Tokenizer load_tokenizer(const std::string& path) {
  try {
    return Tokenizer::from_file(path);
  } catch (const vlm::Error& e) {
    VLM_FAIL("data loader: cannot load the tokenizer '", path, "': ", e.what());
  }
}

// The packer's token ids must be the tokenizer's: a mismatch would silently break images.
void check_token_ids(const PackingConfig& p, const Tokenizer& tok) {
  auto check = [&](const char* field, int32_t id, const char* token) {
    auto found = tok.find_token(token);
    VLM_CHECK(found && *found == id, "data loader: packing.", field, " is ", id,
              " but the tokenizer '", tok.path(), "' has ", token, " = ",
              found ? std::to_string(*found) : "(none)");
  };
  check("image_token_id", p.image_token_id, "<|image_pad|>");
  check("vision_start_id", p.vision_start_id, "<|vision_start|>");
  check("vision_end_id", p.vision_end_id, "<|vision_end|>");
  VLM_CHECK(p.pad_id >= 0 && p.pad_id < tok.vocab_size(), "data loader: packing.pad_id ", p.pad_id,
            " is outside the tokenizer's vocabulary of ", tok.vocab_size());
}

// A row or the end of a worker's stream, with the worker's state right after it.
struct Item {
  enum Kind { row, end, failed } kind = row;
  PackedRow data;
  LoaderWorkerState state;
  std::string error;
};

// A bounded single-producer single-consumer queue; shutdown() unblocks the producer.
class RowQueue {
public:
  explicit RowQueue(size_t capacity) : cap_(capacity) {}
  bool push(Item&& item) {
    std::unique_lock<std::mutex> lock(m_);
    not_full_.wait(lock, [&] { return stop_ || q_.size() < cap_; });
    if (stop_) return false;
    q_.push_back(std::move(item));
    not_empty_.notify_one();
    return true;
  }
  Item pop() {
    std::unique_lock<std::mutex> lock(m_);
    not_empty_.wait(lock, [&] { return !q_.empty(); });
    Item item = std::move(q_.front());
    q_.pop_front();
    not_full_.notify_one();
    return item;
  }
  void shutdown() {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
    not_full_.notify_all();
  }
  bool stopped() {
    std::lock_guard<std::mutex> lock(m_);
    return stop_;
  }

private:
  std::mutex m_;
  std::condition_variable not_full_, not_empty_;
  std::deque<Item> q_;
  size_t cap_;
  bool stop_ = false;
};

json state_json(const LoaderWorkerState& w) {
  return {{"sampler", w.sampler.to_json()},
          {"packer_buffer", w.packer_buffer},
          {"packer_finished", w.packer_finished},
          {"exhausted", w.exhausted},
          {"rows", w.rows},
          {"samples", w.samples},
          {"unusable_run", w.unusable_run},
          {"skips", w.skips.to_json()}};
}

LoaderWorkerState worker_state_from_json(const json& j) {
  LoaderWorkerState w;
  w.sampler = SamplerState::from_json(j.at("sampler"));
  w.packer_buffer = j.at("packer_buffer").get<std::vector<int64_t>>();
  w.packer_finished = j.at("packer_finished").get<bool>();
  w.exhausted = j.at("exhausted").get<bool>();
  w.rows = j.at("rows").get<int64_t>();
  w.samples = j.at("samples").get<int64_t>();
  w.unusable_run = j.at("unusable_run").get<int64_t>();
  w.skips = SkipReport::from_json(j.at("skips"));
  return w;
}

} // namespace

// ---- LoaderState ----

json LoaderState::to_json() const {
  json ws = json::array();
  for (const LoaderWorkerState& w : workers) ws.push_back(state_json(w));
  return {{"format", "vlmtrain loader state"},
          {"version", 1},
          {"identity", json::parse(identity.empty() ? "{}" : identity)},
          {"workers", ws},
          {"next_worker", next_worker},
          {"rows", rows}};
}

LoaderState LoaderState::from_json(const json& j) {
  try {
    VLM_CHECK(j.at("format") == "vlmtrain loader state" && j.at("version") == 1,
              "loader state: not a version-1 vlmtrain loader state");
    LoaderState s;
    s.identity = j.at("identity").dump();
    for (const auto& w : j.at("workers")) s.workers.push_back(worker_state_from_json(w));
    s.next_worker = j.at("next_worker").get<int64_t>();
    s.rows = j.at("rows").get<int64_t>();
    return s;
  } catch (const json::exception& e) {
    VLM_FAIL("loader state: malformed JSON document: ", e.what());
  }
}

std::string LoaderState::serialize() const { return to_json().dump(); }

LoaderState LoaderState::deserialize(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    VLM_FAIL("loader state: not JSON: ", e.what());
  }
  return from_json(j);
}

// ---- DataLoader ----

struct DataLoader::Impl {
  LoaderConfig cfg;
  Sources sources;
  std::unique_ptr<SamplePipeline> pipeline;
  std::optional<PackingPlan> plan;
  std::string identity; // JSON text
  std::vector<SamplerConfig> sampler_cfgs;
  std::vector<int64_t> owned; // samples (or plan rows) per worker

  // Consumer side (the thread calling next()).
  std::vector<LoaderWorkerState> current; // state after the last row handed out per worker
  int64_t next_worker = 0, rows = 0;
  std::string failure; // a worker error, re-thrown by every later next()

  // Pixel buffers handed back by recycle(): a row of images holds ~100 MB of floats, and
  // fresh pages for every row cost about as much as decoding the images.
  std::mutex pool_mutex;
  std::vector<std::vector<float>> pixel_pool;
  size_t pool_limit() const { return size_t(cfg.num_workers * (cfg.prefetch + 1) + 2); }
  std::vector<float> take_pixel_buffer() {
    std::lock_guard<std::mutex> lock(pool_mutex);
    if (pixel_pool.empty()) return {};
    std::vector<float> b = std::move(pixel_pool.back());
    pixel_pool.pop_back();
    b.clear(); // keeps the capacity
    return b;
  }

  // Reader threads.
  bool started = false;
  std::vector<std::unique_ptr<RowQueue>> queues;
  std::vector<std::thread> threads;

  void build_identity() {
    json src = json::array();
    for (const Leaf& l : sources.leaves) {
      const EnergonDataset::Split& sp = l.dataset->split(l.split);
      src.push_back({{"name", folder_name(l.dataset->root())},
                     {"split", l.split},
                     {"samples", sp.num_samples},
                     {"shards", split_fingerprint(*l.dataset, sp)},
                     {"start", l.start},
                     {"end", l.end},
                     {"weight", l.weight},
                     {"repetitions", l.repetitions}});
    }
    json id = {{"sources", src},
               {"blend", blend_mode_name(sources.blend)},
               {"split", cfg.split},
               {"training", cfg.training},
               {"epochs", cfg.epochs},
               {"dp_rank", cfg.dp_rank},
               {"dp_world", cfg.dp_world},
               {"num_workers", cfg.num_workers},
               {"seed", cfg.seed},
               {"shuffle_buffer_size", cfg.shuffle_buffer_size},
               {"max_samples_per_sequence", cfg.max_samples_per_sequence},
               {"parallel_slices", cfg.parallel_slices},
               {"seq_len", cfg.packing.seq_len},
               {"packing_buffer_size", plan ? int64_t(0) : cfg.packing.buffer_size},
               {"overlong", overlong_policy_name(cfg.packing.overlong)},
               {"packing_plan_rows", plan ? plan->num_rows() : int64_t(-1)}};
    identity = id.dump();
  }

  void build_samplers() {
    for (int64_t w = 0; w < cfg.num_workers; w++) {
      SamplerConfig sc;
      if (plan) { // offline: the plan's rows are what gets partitioned and shuffled
        sc.sources = {SamplerSource{{plan->num_rows()}}};
      } else {
        for (const Leaf& l : sources.leaves)
          sc.sources.push_back({l.shard_counts, l.start, l.end, l.weight, l.repetitions});
        sc.blend = sources.blend;
      }
      sc.dp_rank = cfg.dp_rank;
      sc.dp_world = cfg.dp_world;
      sc.worker = w;
      sc.num_workers = cfg.num_workers;
      sc.seed = cfg.seed;
      sc.shuffle = cfg.training;
      sc.shuffle_buffer_size = cfg.shuffle_buffer_size;
      sc.max_samples_per_sequence = cfg.max_samples_per_sequence;
      sc.parallel_slices = cfg.parallel_slices;
      sc.epochs = cfg.epochs;
      Sampler s(sc); // validates
      owned.push_back(s.num_samples());
      LoaderWorkerState ws;
      ws.sampler = s.state();
      ws.skips.max_examples = cfg.report_examples;
      current.push_back(std::move(ws));
      sampler_cfgs.push_back(std::move(sc));
    }
  }

  std::string where(int64_t w) const {
    return "data loader (dp rank " + std::to_string(cfg.dp_rank) + ", reader worker " +
           std::to_string(w) + ")";
  }

  // A run of this many sample ids without a usable document means the worker has none: one
  // full epoch lies inside it (the shuffle buffer delays by at most its size).
  int64_t give_up_after(int64_t w) const {
    return 2 * owned[size_t(w)] + cfg.shuffle_buffer_size + 16;
  }

  void start() {
    if (started) return;
    queues.clear();
    for (int64_t w = 0; w < cfg.num_workers; w++)
      queues.push_back(std::make_unique<RowQueue>(size_t(cfg.prefetch)));
    for (int64_t w = 0; w < cfg.num_workers; w++) {
      if (current[size_t(w)].exhausted) continue; // next() never asks it again
      threads.emplace_back([this, w, st = current[size_t(w)]]() mutable {
        RowQueue& q = *queues[size_t(w)];
        try {
          if (plan)
            run_offline(w, std::move(st), q);
          else
            run_online(w, std::move(st), q);
        } catch (const std::exception& e) {
          Item item;
          item.kind = Item::failed;
          item.error = where(w) + ": " + e.what();
          q.push(std::move(item));
        }
      });
    }
    started = true;
  }

  void stop() {
    for (auto& q : queues) q->shutdown();
    for (std::thread& t : threads) t.join();
    threads.clear();
    queues.clear();
    started = false;
  }

  void warn_give_up(int64_t w, const LoaderWorkerState& st) {
    log_warn(where(w), ": ", st.unusable_run,
             " sample ids in a row gave no usable document; this worker stops. ",
             st.skips.summary());
  }

  void run_online(int64_t w, LoaderWorkerState st, RowQueue& q) {
    Sampler sampler(sampler_cfgs[size_t(w)]);
    sampler.restore(st.sampler);
    OnlinePacker packer(cfg.packing);
    // Encoded images of the buffered samples (by id; a sample may be buffered twice across an
    // epoch boundary), for the pixels of the rows they end up in.
    std::unordered_map<int64_t, std::pair<std::vector<std::string>, int>> images;
    auto retain = [&](int64_t id, std::vector<std::string>&& imgs) {
      auto& e = images[id];
      if (e.second++ == 0) e.first = std::move(imgs);
    };
    auto release = [&](int64_t id) {
      auto it = images.find(id);
      if (it != images.end() && --it->second.second == 0) images.erase(it);
    };

    if (!st.packer_buffer.empty()) { // re-read the buffered samples by id
      std::vector<TokenizedSample> docs;
      for (int64_t id : st.packer_buffer) {
        SkipReport why;
        auto ps = pipeline->process(id, &why);
        VLM_CHECK(ps, "restore: sample id ", id,
                  " was in the packing buffer when the state was saved but is skipped now (",
                  why.examples.empty() ? std::string("excluded by split.yaml")
                                       : why.examples[0].reason + ": " + why.examples[0].message,
                  "); the dataset or the sample pipeline changed since");
        retain(id, std::move(ps->images));
        docs.push_back(std::move(ps->tokens));
      }
      packer.restore(std::move(docs), st.packer_buffer);
    }
    if (st.packer_finished) packer.finish();

    const int64_t limit = give_up_after(w);
    for (;;) {
      if (q.stopped()) return;
      if (packer.ready()) {
        PackedRow row = packer.pop();
        if (row.num_patches > 0) row.pixel_values = take_pixel_buffer();
        pipeline->fill_row_pixels(row, [&](int64_t id) -> const std::vector<std::string>& {
          return images.at(id).first;
        });
        for (int64_t id : row.sample_indices) release(id);
        st.rows++;
        st.sampler = sampler.state();
        st.packer_buffer = packer.buffered_indices();
        st.packer_finished = packer.finished();
        if (!q.push(Item{Item::row, std::move(row), st, ""})) return;
        continue;
      }
      if (packer.finished()) { // and empty: the end of this worker's data
        st.sampler = sampler.state();
        st.packer_buffer.clear();
        st.packer_finished = true;
        st.exhausted = true;
        q.push(Item{Item::end, {}, st, ""});
        return;
      }
      std::optional<int64_t> id = sampler.next();
      if (!id) {
        packer.finish();
        continue;
      }
      st.samples++;
      std::optional<PipelineSample> ps = pipeline->process(*id, &st.skips);
      if (ps) {
        std::string shard = ps->shard, key = ps->key;
        PrepareResult r = packer.push(std::move(ps->tokens));
        if (is_dropped(r.fate)) {
          st.skips.add({std::string("pack:") + sample_fate_name(r.fate),
                        pipeline->sources()[size_t(sample_id_source(*id))].dataset->root(), shard,
                        key, *id, r.reason});
          ps.reset();
        } else {
          retain(*id, std::move(ps->images));
        }
      }
      if (ps) {
        st.unusable_run = 0;
      } else if (++st.unusable_run >= limit) {
        warn_give_up(w, st);
        packer.finish(); // emit what is buffered, then end
      }
    }
  }

  void run_offline(int64_t w, LoaderWorkerState st, RowQueue& q) {
    Sampler sampler(sampler_cfgs[size_t(w)]);
    sampler.restore(st.sampler);
    const int64_t limit = give_up_after(w);
    for (;;) {
      if (q.stopped()) return;
      std::optional<int64_t> r = sampler.next();
      if (!r || st.unusable_run >= limit) {
        if (r) warn_give_up(w, st);
        st.sampler = sampler.state();
        st.exhausted = true;
        q.push(Item{Item::end, {}, st, ""});
        return;
      }
      std::vector<TokenizedSample> docs;
      for (int64_t index : plan->row(*r)) {
        st.samples++;
        auto ps = pipeline->process(index, &st.skips, /*with_pixels=*/true);
        if (ps) docs.push_back(std::move(ps->tokens));
      }
      if (docs.empty()) { // every sample of the row was skipped
        st.unusable_run++;
        continue;
      }
      st.unusable_run = 0;
      PackedRow row = plan->pack(*r, std::move(docs), cfg.packing);
      st.rows++;
      st.sampler = sampler.state();
      if (!q.push(Item{Item::row, std::move(row), st, ""})) return;
    }
  }
};

DataLoader::DataLoader(LoaderConfig cfg) : DataLoader(cfg, load_tokenizer(cfg.tokenizer)) {}

DataLoader::DataLoader(LoaderConfig cfg, Tokenizer tok) : impl_(std::make_unique<Impl>()) {
  cfg.validate();
  Impl& m = *impl_;
  m.sources = open_sources(cfg);
  check_token_ids(cfg.packing, tok);
  if (!cfg.packing_plan.empty()) {
    VLM_CHECK(m.sources.leaves.size() == 1, "data loader: a packing plan needs a single dataset, '",
              cfg.dataset, "' has ", m.sources.leaves.size());
    const Leaf& l = m.sources.leaves[0];
    VLM_CHECK(l.start == 0 && l.end == l.dataset->split(l.split).num_samples,
              "data loader: a packing plan cannot be combined with a subset");
    m.plan = PackingPlan::load(cfg.packing_plan);
    try {
      m.plan->check_identity(loader_plan_identity(cfg));
    } catch (const vlm::Error& e) {
      VLM_FAIL("data loader: packing plan '", cfg.packing_plan,
               "' was made for other data: ", e.what());
    }
  }
  std::vector<PipelineSource> ps;
  for (const Leaf& l : m.sources.leaves) ps.push_back({l.dataset, l.split, l.subflavors});
  m.pipeline = std::make_unique<SamplePipeline>(std::move(ps), std::move(tok),
                                                SamplePipelineConfig{cfg.image, cfg.chat});
  m.cfg = std::move(cfg);
  m.build_samplers();
  m.build_identity();
}

DataLoader::~DataLoader() { impl_->stop(); }

std::optional<PackedRow> DataLoader::next() {
  Impl& m = *impl_;
  VLM_CHECK(m.failure.empty(), m.failure);
  m.start();
  const int64_t W = m.cfg.num_workers;
  for (;;) {
    bool all_done = std::all_of(m.current.begin(), m.current.end(),
                                [](const LoaderWorkerState& s) { return s.exhausted; });
    if (all_done) {
      // A rank that owns samples but could use none of them is broken data; one that owns none
      // (fewer samples than dp_world x num_workers) simply has nothing to give.
      int64_t owned = 0;
      for (int64_t n : m.owned) owned += n;
      VLM_CHECK(m.rows > 0 || owned == 0, "data loader: no usable sample on dp rank ",
                m.cfg.dp_rank, " (dataset '", m.cfg.dataset, "', split '", m.cfg.split,
                "'): ", report().summary());
      return std::nullopt;
    }
    const int64_t w = m.next_worker;
    m.next_worker = (w + 1) % W;
    if (m.current[size_t(w)].exhausted) continue;
    Item item = m.queues[size_t(w)]->pop();
    if (item.kind == Item::failed) {
      m.failure = item.error;
      VLM_FAIL(m.failure);
    }
    m.current[size_t(w)] = std::move(item.state);
    if (item.kind == Item::end) continue;
    m.rows++;
    return std::move(item.data);
  }
}

LoaderState DataLoader::state() const {
  const Impl& m = *impl_;
  return {m.identity, m.current, m.next_worker, m.rows};
}

void DataLoader::restore(const LoaderState& s) {
  Impl& m = *impl_;
  json saved = json::parse(s.identity.empty() ? "{}" : s.identity), now = json::parse(m.identity);
  if (saved != now) {
    std::string diff;
    for (const auto& [key, value] : now.items())
      if (!saved.contains(key) || saved[key] != value)
        diff += "\n  " + key + ": saved " + (saved.contains(key) ? saved[key].dump() : "(none)") +
                ", now " + value.dump();
    VLM_FAIL("data loader: the saved loader state belongs to another data configuration; "
             "resuming would not continue the same data stream:",
             diff.empty() ? std::string(" (format differs)") : diff);
  }
  VLM_CHECK(s.workers.size() == m.current.size(), "data loader: saved state has ", s.workers.size(),
            " workers, the config ", m.current.size());
  VLM_CHECK(0 <= s.next_worker && s.next_worker < int64_t(m.current.size()),
            "data loader: saved round-robin position ", s.next_worker, " out of range");
  for (size_t w = 0; w < s.workers.size(); w++) {
    Sampler check(m.sampler_cfgs[w]);
    check.restore(s.workers[w].sampler); // throws when it does not fit
    VLM_CHECK(!m.plan || s.workers[w].packer_buffer.empty(),
              "data loader: saved state has an online packing buffer but a plan is used");
    VLM_CHECK(int64_t(s.workers[w].packer_buffer.size()) <= m.cfg.packing.buffer_size,
              "data loader: saved packing buffer exceeds packing.buffer_size");
  }
  m.stop();
  m.current = s.workers;
  for (LoaderWorkerState& w : m.current) w.skips.max_examples = m.cfg.report_examples;
  m.next_worker = s.next_worker;
  m.rows = s.rows;
  m.failure.clear();
}

SkipReport DataLoader::report() const {
  SkipReport r;
  r.max_examples = impl_->cfg.report_examples;
  for (const LoaderWorkerState& w : impl_->current) r.merge(w.skips);
  return r;
}

int64_t DataLoader::rows() const { return impl_->rows; }

int64_t DataLoader::samples_read() const {
  int64_t n = 0;
  for (const LoaderWorkerState& w : impl_->current) n += w.samples;
  return n;
}

void DataLoader::recycle(PackedRow&& row) {
  if (row.pixel_values.capacity() == 0) return;
  std::lock_guard<std::mutex> lock(impl_->pool_mutex);
  if (impl_->pixel_pool.size() < impl_->pool_limit())
    impl_->pixel_pool.push_back(std::move(row.pixel_values));
}
const LoaderConfig& DataLoader::config() const { return impl_->cfg; }
std::vector<int64_t> DataLoader::worker_samples() const { return impl_->owned; }

// ---- Offline packing support ----

void set_token_ids(PackingConfig& p, const Tokenizer& tok) {
  p.pad_id = tok.token_to_id("<|endoftext|>");
  p.image_token_id = tok.token_to_id("<|image_pad|>");
  p.vision_start_id = tok.token_to_id("<|vision_start|>");
  p.vision_end_id = tok.token_to_id("<|vision_end|>");
}

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
