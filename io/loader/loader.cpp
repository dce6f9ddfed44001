#include "io/loader/loader.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "io/energon/metadataset.h"
#include "io/loader/loader_inputs.h"
#include "io/loader/planned_rows.h"
#include "src/base/check.h"
#include "src/base/logging.h"

namespace vlm::io {

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

// Encoded images of the samples in a worker's packing buffer, by sample id (a sample may be
// buffered twice across an epoch boundary), for the pixels of the rows they end up in.
class BufferedImages {
public:
  void retain(int64_t id, std::vector<std::string>&& images) {
    auto& e = by_id_[id];
    if (e.second++ == 0) e.first = std::move(images);
  }
  void release(int64_t id) {
    auto it = by_id_.find(id);
    if (it != by_id_.end() && --it->second.second == 0) by_id_.erase(it);
  }
  const std::vector<std::string>& of(int64_t id) const { return by_id_.at(id).first; }

private:
  std::unordered_map<int64_t, std::pair<std::vector<std::string>, int>> by_id_; // images, uses
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

  // Re-reads the samples of a restored worker's packing buffer by id into its packer.
  void refill_packer(const std::vector<int64_t>& buffer, OnlinePacker& packer,
                     BufferedImages& images) const {
    std::vector<TokenizedSample> docs;
    for (int64_t id : buffer) {
      SkipReport why;
      auto ps = pipeline->process(id, &why);
      VLM_CHECK(ps, "restore: sample id ", id,
                " was in the packing buffer when the state was saved but is skipped now (",
                why.examples.empty() ? std::string("excluded by split.yaml")
                                     : why.examples[0].reason + ": " + why.examples[0].message,
                "); the dataset or the sample pipeline changed since");
      images.retain(id, std::move(ps->images));
      docs.push_back(std::move(ps->tokens));
    }
    packer.restore(std::move(docs), buffer);
  }

  // Sample `id` through the pipeline into the packer; false when it gives no document (skipped
  // by the pipeline or dropped by the packer, counted in *skips).
  bool pack_sample(int64_t id, OnlinePacker& packer, BufferedImages& images,
                   SkipReport* skips) const {
    std::optional<PipelineSample> ps = pipeline->process(id, skips);
    if (!ps) return false;
    std::string shard = ps->shard, key = ps->key;
    PrepareResult r = packer.push(std::move(ps->tokens));
    if (is_dropped(r.fate)) {
      skips->add({std::string("pack:") + sample_fate_name(r.fate),
                  pipeline->sources()[size_t(sample_id_source(id))].dataset->root(), shard, key, id,
                  r.reason});
      return false;
    }
    images.retain(id, std::move(ps->images));
    return true;
  }

  // The packer's next row with the pixels of its images, which it then no longer needs kept.
  PackedRow pop_row(OnlinePacker& packer, BufferedImages& images) {
    PackedRow row = packer.pop();
    if (row.num_patches > 0) row.pixel_values = take_pixel_buffer();
    pipeline->fill_row_pixels(
        row, [&](int64_t id) -> const std::vector<std::string>& { return images.of(id); });
    for (int64_t id : row.sample_indices) images.release(id);
    return row;
  }

  void run_online(int64_t w, LoaderWorkerState st, RowQueue& q) {
    Sampler sampler(sampler_cfgs[size_t(w)]);
    sampler.restore(st.sampler);
    OnlinePacker packer(cfg.packing);
    BufferedImages images;
    if (!st.packer_buffer.empty()) refill_packer(st.packer_buffer, packer, images);
    if (st.packer_finished) packer.finish();

    const int64_t limit = give_up_after(w);
    for (;;) {
      if (q.stopped()) return;
      if (packer.ready()) {
        PackedRow row = pop_row(packer, images);
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
      if (pack_sample(*id, packer, images, &st.skips)) {
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
      std::optional<PackedRow> row = read_planned_row(*plan, *r, *pipeline, cfg.packing, &st);
      if (!row) { // every sample of the row was skipped
        st.unusable_run++;
        continue;
      }
      st.unusable_run = 0;
      st.rows++;
      st.sampler = sampler.state();
      if (!q.push(Item{Item::row, std::move(*row), st, ""})) return;
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
    const Leaf& l = m.sources.leaves[0];
    const bool subset = l.start != 0 || l.end != l.dataset->split(l.split).num_samples;
    m.plan = open_planned_rows(cfg, m.sources.leaves.size(), subset);
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
  VLM_CHECK(s.rows >= 0, "data loader: saved rows = ", s.rows, " is negative (a count)");
  for (size_t w = 0; w < s.workers.size(); w++) {
    const LoaderWorkerState& ws = s.workers[w];
    const std::string field = "saved workers[" + std::to_string(w) + "]";
    Sampler check(m.sampler_cfgs[w]);
    try {
      check.restore(ws.sampler); // throws when it does not fit
    } catch (const Error& e) {
      VLM_FAIL("data loader: ", field, ".sampler: ", e.what());
    }
    for (const auto& [name, v] : {std::pair<const char*, int64_t>{"rows", ws.rows},
                                  {"samples", ws.samples},
                                  {"unusable_run", ws.unusable_run}})
      VLM_CHECK(v >= 0, "data loader: ", field, ".", name, " = ", v, " is negative (a count)");
    VLM_CHECK(!m.plan || ws.packer_buffer.empty(),
              "data loader: saved state has an online packing buffer but a plan is used");
    VLM_CHECK(int64_t(ws.packer_buffer.size()) <= m.cfg.packing.buffer_size,
              "data loader: saved packing buffer exceeds packing.buffer_size");
    // The buffer holds ids this worker's sampler gave out: each must be one of its samples (an
    // id past the data would fail only when the worker reads it, as a dataset error).
    for (size_t i = 0; i < ws.packer_buffer.size(); i++) {
      const int64_t id = ws.packer_buffer[i], src = sample_id_source(id), idx = sample_id_index(id);
      const bool known = id >= 0 && size_t(src) < m.sources.leaves.size();
      if (known && check.slices(size_t(src)).front() <= idx &&
          idx < check.slices(size_t(src)).back())
        continue;
      std::string what = "names source " + std::to_string(src) + "; the data has " +
                         std::to_string(m.sources.leaves.size()) + " source(s)";
      if (known) {
        const Leaf& l = m.sources.leaves[size_t(src)];
        what = "is sample " + std::to_string(idx) + " of '" + folder_name(l.dataset->root()) +
               "' split '" + l.split + "' (" +
               std::to_string(l.dataset->split(l.split).num_samples) + " samples), and reader " +
               "worker " + std::to_string(w) + " reads samples [" +
               std::to_string(check.slices(size_t(src)).front()) + ", " +
               std::to_string(check.slices(size_t(src)).back()) + ") of it";
      }
      VLM_FAIL("data loader: ", field, ".packer_buffer[", i, "] = ", id, " is out of range: it ",
               what);
    }
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

// ---- The packer's token ids ----

void set_token_ids(PackingConfig& p, const Tokenizer& tok) {
  p.pad_id = tok.token_to_id("<|endoftext|>");
  p.image_token_id = tok.token_to_id("<|image_pad|>");
  p.vision_start_id = tok.token_to_id("<|vision_start|>");
  p.vision_end_id = tok.token_to_id("<|vision_end|>");
}

} // namespace vlm::io
