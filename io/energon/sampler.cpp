#include "io/energon/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include <nlohmann/json.hpp>

#include "src/base/check.h"
#include "src/base/rng.h"

namespace vlm::io {

// ---- Partitioning ----

std::vector<int64_t> generalized_bit_reversal(int64_t n) {
  VLM_CHECK(n >= 0, "generalized_bit_reversal: negative length ", n);
  // Recursive halving on index lists: the left half is the first len/2 entries.
  auto rec = [](auto&& self, const std::vector<int64_t>& v) -> std::vector<int64_t> {
    if (v.size() <= 2) return v;
    size_t mid = v.size() / 2;
    std::vector<int64_t> l = self(self, std::vector<int64_t>(v.begin(), v.begin() + int64_t(mid)));
    std::vector<int64_t> r = self(self, std::vector<int64_t>(v.begin() + int64_t(mid), v.end()));
    std::vector<int64_t> out;
    out.reserve(v.size());
    for (size_t i = 0; i < std::max(l.size(), r.size()); i++) {
      if (i < l.size()) out.push_back(l[i]);
      if (i < r.size()) out.push_back(r[i]);
    }
    return out;
  };
  std::vector<int64_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), int64_t(0));
  return rec(rec, ids);
}

std::vector<int64_t> partition_global_workers(int64_t start, int64_t end, int64_t global_workers,
                                              int64_t rotation_offset) {
  VLM_CHECK(global_workers >= 1, "partition: global_workers must be >= 1, got ", global_workers);
  VLM_CHECK(0 <= start && start <= end, "partition: bad sample range [", start, ", ", end, ")");
  const int64_t G = global_workers, total = end - start;
  const int64_t base = total / G, extra = total % G;
  // Sizes in linear worker order: the `extra` workers starting at the rotation offset get one
  // more sample ...
  std::vector<int64_t> linear(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; g++) {
    int64_t rotated = ((g - rotation_offset) % G + G) % G;
    linear[size_t(g)] = base + (rotated < extra ? 1 : 0);
  }
  // ... then the sizes are moved to bit-reversed positions so that the remainders spread over
  // ranks instead of piling up on the first ones.
  std::vector<int64_t> bitrev = generalized_bit_reversal(G);
  std::vector<int64_t> sizes(static_cast<size_t>(G));
  for (int64_t k = 0; k < G; k++) sizes[size_t(bitrev[size_t(k)])] = linear[size_t(k)];
  std::vector<int64_t> offsets{start};
  for (int64_t s : sizes) offsets.push_back(offsets.back() + s);
  return offsets;
}

namespace {

// Starts of the slices of one shard piece [a, b): energon cuts a piece longer than 1.5 × msps
// into round(L / msps) slices (round half to even, as Python's round on a float) starting at
// a + int(k × (L / n)), computed in double exactly as energon does.
void split_piece(int64_t a, int64_t b, int64_t msps, std::vector<int64_t>& out) {
  const int64_t len = b - a;
  if (msps > 0 && double(len) > double(msps) * 1.5) {
    int64_t n = std::max<int64_t>(int64_t(std::nearbyint(double(len) / double(msps))), 1);
    double per_slice = double(len) / double(n);
    for (int64_t k = 0; k < n; k++) out.push_back(a + int64_t(double(k) * per_slice));
  } else {
    out.push_back(a);
  }
}

} // namespace

std::vector<int64_t> slice_worker_range(const std::vector<int64_t>& shard_counts, int64_t begin,
                                        int64_t end, int64_t max_samples_per_sequence) {
  VLM_CHECK(begin <= end, "slice_worker_range: begin ", begin, " > end ", end);
  VLM_CHECK(max_samples_per_sequence >= 0, "slice_worker_range: negative msps");
  std::vector<int64_t> out;
  int64_t shard_begin = 0;
  for (int64_t count : shard_counts) {
    VLM_CHECK(count >= 0, "slice_worker_range: negative shard count ", count);
    int64_t shard_end = shard_begin + count;
    int64_t a = std::max(begin, shard_begin), b = std::min(end, shard_end);
    if (a < b) split_piece(a, b, max_samples_per_sequence, out);
    shard_begin = shard_end;
  }
  VLM_CHECK(end <= shard_begin || begin == end, "slice_worker_range: range end ", end,
            " is beyond the split's ", shard_begin, " samples");
  out.push_back(end);
  return out;
}

std::vector<std::vector<int64_t>> shard_rank_workers(const std::vector<int64_t>& shard_counts,
                                                     int64_t start, int64_t end, int64_t dp_rank,
                                                     int64_t dp_world, int64_t num_workers,
                                                     int64_t max_samples_per_sequence,
                                                     int64_t rotation_offset) {
  const int64_t W = std::max<int64_t>(num_workers, 1);
  VLM_CHECK(dp_world >= 1 && 0 <= dp_rank && dp_rank < dp_world, "shard_rank_workers: dp_rank ",
            dp_rank, " is not in [0, ", dp_world, ")");
  std::vector<int64_t> o = partition_global_workers(start, end, dp_world * W, rotation_offset);
  std::vector<std::vector<int64_t>> out;
  for (int64_t w = 0; w < W; w++) {
    size_t g = size_t(dp_rank * W + w);
    out.push_back(slice_worker_range(shard_counts, o[g], o[g + 1], max_samples_per_sequence));
  }
  return out;
}

// ---- Config ----

void SamplerConfig::validate() const {
  VLM_CHECK(!sources.empty(), "sampler: no sources");
  VLM_CHECK(dp_world >= 1, "sampler: dp_world must be >= 1, got ", dp_world);
  VLM_CHECK(0 <= dp_rank && dp_rank < dp_world, "sampler: dp_rank ", dp_rank, " not in [0, ",
            dp_world, ")");
  VLM_CHECK(num_workers >= 1, "sampler: num_workers must be >= 1, got ", num_workers);
  VLM_CHECK(0 <= worker && worker < num_workers, "sampler: worker ", worker, " not in [0, ",
            num_workers, ")");
  VLM_CHECK(max_samples_per_sequence >= 0,
            "sampler: max_samples_per_sequence must be >= 0 (0 = "
            "no limit), got ",
            max_samples_per_sequence);
  VLM_CHECK(parallel_slices >= 1, "sampler: parallel_slices must be >= 1, got ", parallel_slices);
  VLM_CHECK(shuffle_buffer_size >= 0, "sampler: negative shuffle_buffer_size");
  VLM_CHECK(epochs >= 0, "sampler: negative epochs");
  VLM_CHECK(!(shuffle && blend == BlendMode::weights && epochs > 0),
            "sampler: a weighted blend has no epochs; epochs must be 0 (repeat forever)");
  for (size_t s = 0; s < sources.size(); s++) {
    const SamplerSource& src = sources[s];
    int64_t total = 0;
    for (int64_t c : src.shard_counts) {
      VLM_CHECK(c >= 0, "sampler: source ", s, " has a negative shard count");
      total += c;
    }
    int64_t end = src.end < 0 ? total : src.end;
    VLM_CHECK(0 <= src.start && src.start <= end && end <= total, "sampler: source ", s,
              " subset [", src.start, ", ", end, ") is not within its ", total, " samples");
    VLM_CHECK(total <= kSampleIdIndexMask, "sampler: source ", s, " has too many samples");
    VLM_CHECK(std::isfinite(src.weight) && src.weight >= 0, "sampler: source ", s,
              " has a bad weight ", src.weight);
    VLM_CHECK(std::isfinite(src.repetitions) && src.repetitions >= 0, "sampler: source ", s,
              " has bad repetitions ", src.repetitions);
  }
}

// ---- Sampler ----

namespace {

constexpr int64_t kEpochEnd = -1;

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
template <typename T> uint64_t fnv_value(uint64_t h, T v) { return fnv1a(h, &v, sizeof(v)); }

// Fisher-Yates with integer draws: the same permutation on every platform.
std::vector<int64_t> permutation(int64_t n, Rng& rng) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t(0));
  for (int64_t i = n - 1; i > 0; i--) std::swap(p[size_t(i)], p[size_t(rng.randint(0, i + 1))]);
  return p;
}

// Generator streams: one per (global worker, component), so that TP peers (same dp_rank) draw
// identical numbers and components do not perturb each other.
enum Stream : uint64_t { kBlendStream = 0, kShuffleStream = 1, kSourceStream = 2 };
Rng make_rng(uint64_t seed, int64_t global_worker, uint64_t component) {
  return Rng(seed, uint64_t(global_worker) * 0x10000ull + component);
}

} // namespace

struct Sampler::Impl {
  SamplerConfig cfg;
  bool concat = false; // read sources one after the other (validation, or a single source)
  int64_t slots = 1;   // open slices per source
  int64_t buffer = 0;  // shuffle buffer capacity (0: none)
  std::vector<std::vector<int64_t>> slices; // per source
  std::vector<int64_t> owned;               // samples per source on this worker
  std::vector<int64_t> quota0;              // repetitions: per meta-epoch
  std::vector<double> weights;              // weights: 0 for sources this worker owns none of
  uint64_t layout = 0;

  SamplerState st;
  std::vector<Rng> src_rng;
  std::vector<std::vector<int64_t>> perm; // per source: this epoch's slice order
  Rng blend_rng, shuffle_rng;

  int64_t num_slices(size_t s) const { return int64_t(slices[s].size()) - 1; }
  int64_t slice_len(size_t s, int64_t k) const {
    return slices[s][size_t(k) + 1] - slices[s][size_t(k)];
  }

  void open_next_slice(size_t s, SliceCursor& c) {
    SourceState& ss = st.sources[s];
    if (ss.pending_offset < num_slices(s)) {
      int64_t k = perm[s][size_t(ss.pending_offset++)];
      c = {k, slices[s][size_t(k)]};
    } else {
      c = {-1, 0};
    }
  }

  void make_perm(size_t s, Rng& rng) {
    perm[s] = cfg.shuffle ? permutation(num_slices(s), rng) : [&] {
      std::vector<int64_t> p(size_t(num_slices(s)));
      std::iota(p.begin(), p.end(), int64_t(0));
      return p;
    }();
  }

  void start_epoch(size_t s) {
    SourceState& ss = st.sources[s];
    ss.epoch_rng = src_rng[s].state();
    make_perm(s, src_rng[s]);
    ss.pending_offset = 0;
    ss.active.assign(size_t(slots), SliceCursor{});
    for (SliceCursor& c : ss.active) open_next_slice(s, c);
    ss.in_epoch = true;
    ss.epoch_samples = 0;
  }

  void end_epoch(size_t s) {
    SourceState& ss = st.sources[s];
    ss.in_epoch = false;
    ss.epoch++;
    ss.epoch_samples = 0;
  }

  // The next index of source s, or false when its epoch just ended (the next call starts a new
  // epoch). A source this worker owns nothing of always returns false.
  bool source_next(size_t s, int64_t* index) {
    if (num_slices(s) <= 0) return false;
    SourceState& ss = st.sources[s];
    if (!ss.in_epoch) start_epoch(s);
    int64_t total = 0, open = 0, slot = -1;
    for (size_t i = 0; i < ss.active.size(); i++)
      if (ss.active[i].slice >= 0) {
        total += slice_len(s, ss.active[i].slice);
        if (open++ == 0) slot = int64_t(i);
      }
    if (open == 0) {
      end_epoch(s);
      return false;
    }
    if (open > 1) { // weighted by the slice's total length, as energon
      int64_t r = src_rng[s].randint(0, total);
      for (size_t i = 0; i < ss.active.size(); i++) {
        if (ss.active[i].slice < 0) continue;
        r -= slice_len(s, ss.active[i].slice);
        if (r < 0) {
          slot = int64_t(i);
          break;
        }
      }
    }
    SliceCursor& c = ss.active[size_t(slot)];
    *index = c.next++;
    if (c.next >= slices[s][size_t(c.slice) + 1]) open_next_slice(s, c);
    ss.epoch_samples++;
    return true;
  }

  // Like source_next, but runs on into the source's next epoch (for blends, where source
  // epochs are invisible). Only called for sources that own samples.
  int64_t source_next_looping(size_t s) {
    int64_t i = 0;
    if (!source_next(s, &i)) VLM_CHECK(source_next(s, &i), "sampler: source ", s, " is empty");
    return make_sample_id(int64_t(s), i);
  }

  // The next id from the sources, or kEpochEnd.
  int64_t pull() {
    const size_t n = slices.size();
    if (concat) {
      while (size_t(st.concat_source) < n) {
        int64_t i = 0;
        if (source_next(size_t(st.concat_source), &i)) return make_sample_id(st.concat_source, i);
        st.concat_source++;
      }
      st.concat_source = 0;
      return kEpochEnd;
    }
    if (cfg.blend == BlendMode::repetitions) {
      int64_t total = 0;
      for (size_t s = 0; s < n; s++)
        if (st.quota[s] > 0) total += quota0[s];
      if (total == 0) { // meta-epoch done: fresh quotas, every source starts a fresh epoch
        st.quota = quota0;
        for (size_t s = 0; s < n; s++)
          if (st.sources[s].in_epoch) end_epoch(s);
        return kEpochEnd;
      }
      int64_t r = blend_rng.randint(0, total);
      size_t pick = 0;
      for (size_t s = 0; s < n; s++) {
        if (st.quota[s] <= 0) continue;
        pick = s;
        if ((r -= quota0[s]) < 0) break;
      }
      st.quota[pick]--;
      return source_next_looping(pick);
    }
    // weights: never ends
    double total = 0;
    for (double w : weights) total += w;
    double r = blend_rng.uniform() * total;
    size_t pick = n;
    for (size_t s = 0; s < n; s++) {
      if (weights[s] <= 0) continue;
      pick = s; // the last positive one absorbs rounding at the top end
      if ((r -= weights[s]) < 0) break;
    }
    return source_next_looping(pick);
  }

  int64_t pop_random() {
    size_t j = size_t(shuffle_rng.randint(0, int64_t(st.shuffle_buffer.size())));
    int64_t id = st.shuffle_buffer[j];
    st.shuffle_buffer[j] = st.shuffle_buffer.back();
    st.shuffle_buffer.pop_back();
    return id;
  }

  int64_t emit(int64_t id) {
    st.emitted++;
    st.epoch_emitted++;
    return id;
  }

  std::optional<int64_t> next() {
    for (;;) {
      if (st.finished) return std::nullopt;
      if (st.draining) {
        if (!st.shuffle_buffer.empty()) return emit(pop_random());
        st.draining = false;
        st.epoch++;
        st.epoch_emitted = 0;
        if (cfg.epochs > 0 && st.epoch >= cfg.epochs) st.finished = true;
        continue;
      }
      if (buffer > 1 && int64_t(st.shuffle_buffer.size()) >= buffer) return emit(pop_random());
      int64_t id = pull();
      if (id == kEpochEnd) {
        st.draining = true;
        continue;
      }
      if (buffer <= 1) return emit(id);
      st.shuffle_buffer.push_back(id);
    }
  }
};

Sampler::Sampler(SamplerConfig cfg) : impl_(std::make_unique<Impl>()) {
  cfg.validate();
  Impl& m = *impl_;
  const size_t n = cfg.sources.size();
  m.concat = !cfg.shuffle || cfg.blend == BlendMode::none;
  VLM_CHECK(!(cfg.shuffle && cfg.blend == BlendMode::none && n != 1), "sampler: ", n,
            " sources need a blend mode (weights or repetitions)");
  m.slots = cfg.shuffle ? cfg.parallel_slices : 1;
  m.buffer = cfg.shuffle && cfg.shuffle_buffer_size > 1 ? cfg.shuffle_buffer_size : 0;

  const int64_t G = cfg.dp_world * cfg.num_workers;
  const int64_t g = cfg.dp_rank * cfg.num_workers + cfg.worker;
  int64_t rotation = 0; // energon rotates each later source by the samples before it
  for (const SamplerSource& src : cfg.sources) {
    int64_t total = std::accumulate(src.shard_counts.begin(), src.shard_counts.end(), int64_t(0));
    int64_t end = src.end < 0 ? total : src.end;
    std::vector<int64_t> o = partition_global_workers(src.start, end, G, rotation);
    m.slices.push_back(slice_worker_range(src.shard_counts, o[size_t(g)], o[size_t(g) + 1],
                                          cfg.max_samples_per_sequence));
    m.owned.push_back(o[size_t(g) + 1] - o[size_t(g)]);
    rotation = (rotation + (end - src.start)) % G;
    double whole = std::floor(src.repetitions);
    m.quota0.push_back(int64_t(whole) * m.owned.back() +
                       int64_t(std::floor((src.repetitions - whole) * double(m.owned.back()))));
    m.weights.push_back(m.owned.back() > 0 ? src.weight : 0.0);
  }

  uint64_t h = 0xcbf29ce484222325ull;
  h = fnv_value(h, uint64_t(1)); // layout version
  for (const auto& sl : m.slices) {
    h = fnv_value(h, uint64_t(sl.size()));
    h = fnv1a(h, sl.data(), sl.size() * sizeof(int64_t));
  }
  for (int64_t q : m.quota0) h = fnv_value(h, q);
  for (double w : m.weights) h = fnv_value(h, w);
  for (int64_t v : {int64_t(cfg.blend), int64_t(cfg.shuffle), m.slots, m.buffer, cfg.epochs, g, G})
    h = fnv_value(h, v);
  h = fnv_value(h, cfg.seed);
  m.layout = h;

  m.blend_rng = make_rng(cfg.seed, g, kBlendStream);
  m.shuffle_rng = make_rng(cfg.seed, g, kShuffleStream);
  m.src_rng.clear();
  for (size_t s = 0; s < n; s++) m.src_rng.push_back(make_rng(cfg.seed, g, kSourceStream + s));
  m.perm.assign(n, {});
  m.st.layout = m.layout;
  m.st.sources.assign(n, SourceState{});
  for (SourceState& ss : m.st.sources) ss.active.assign(size_t(m.slots), SliceCursor{});
  m.st.quota = m.quota0;

  // A worker that owns nothing (or only sources that can never be drawn) ends at once.
  bool any = false;
  for (size_t s = 0; s < n; s++) {
    bool usable = m.owned[s] > 0;
    if (!m.concat && cfg.blend == BlendMode::weights) usable = m.weights[s] > 0;
    if (!m.concat && cfg.blend == BlendMode::repetitions) usable = m.quota0[s] > 0;
    any = any || usable;
  }
  m.st.finished = !any;
  m.cfg = std::move(cfg);
}

Sampler::~Sampler() = default;
Sampler::Sampler(Sampler&&) noexcept = default;
Sampler& Sampler::operator=(Sampler&&) noexcept = default;

std::optional<int64_t> Sampler::next() { return impl_->next(); }
int64_t Sampler::epoch() const { return impl_->st.epoch; }
int64_t Sampler::num_samples(size_t source) const {
  VLM_CHECK(source < impl_->owned.size(), "sampler: no source ", source);
  return impl_->owned[source];
}
int64_t Sampler::num_samples() const {
  return std::accumulate(impl_->owned.begin(), impl_->owned.end(), int64_t(0));
}
const std::vector<int64_t>& Sampler::slices(size_t source) const {
  VLM_CHECK(source < impl_->slices.size(), "sampler: no source ", source);
  return impl_->slices[source];
}
const SamplerConfig& Sampler::config() const { return impl_->cfg; }

SamplerState Sampler::state() const {
  const Impl& m = *impl_;
  SamplerState s = m.st;
  for (size_t i = 0; i < s.sources.size(); i++) s.sources[i].rng = m.src_rng[i].state();
  s.blend_rng = m.blend_rng.state();
  s.shuffle_rng = m.shuffle_rng.state();
  return s;
}

void Sampler::restore(const SamplerState& s) {
  Impl& m = *impl_;
  const size_t n = m.slices.size();
  VLM_CHECK(s.layout == m.layout,
            "sampler: the saved state belongs to another configuration (dataset shards, subset, "
            "dp rank/world, reader workers, seed, max_samples_per_sequence, parallel slices, "
            "shuffle buffer, blend or epochs differ)");
  VLM_CHECK(s.sources.size() == n, "sampler: saved state has ", s.sources.size(),
            " sources, the config ", n);
  for (size_t i = 0; i < n; i++) {
    const SourceState& ss = s.sources[i];
    VLM_CHECK(ss.active.size() == size_t(m.slots), "sampler: source ", i, " state has ",
              ss.active.size(), " open-slice slots, expected ", m.slots);
    VLM_CHECK(0 <= ss.pending_offset && ss.pending_offset <= m.num_slices(i), "sampler: source ", i,
              " pending offset ", ss.pending_offset, " out of range");
    VLM_CHECK(ss.epoch >= 0 && 0 <= ss.epoch_samples && ss.epoch_samples <= m.owned[i],
              "sampler: source ", i, " has epoch ", ss.epoch, " and epoch_samples ",
              ss.epoch_samples, " (expected >= 0, and at most the ", m.owned[i],
              " samples this worker owns)");
    for (const SliceCursor& c : ss.active) {
      if (c.slice < 0) continue;
      VLM_CHECK(c.slice < m.num_slices(i) && m.slices[i][size_t(c.slice)] <= c.next &&
                    c.next < m.slices[i][size_t(c.slice) + 1],
                "sampler: source ", i, " has an impossible slice cursor (slice ", c.slice,
                ", next ", c.next, ")");
    }
  }
  VLM_CHECK(s.quota.size() == n, "sampler: saved quota has ", s.quota.size(), " entries");
  for (size_t i = 0; i < n; i++)
    VLM_CHECK(0 <= s.quota[i] && s.quota[i] <= m.quota0[i], "sampler: saved quota[", i,
              "] = ", s.quota[i], " is out of range [0, ", m.quota0[i], "] (the samples source ", i,
              " owes per meta-epoch)");
  VLM_CHECK(s.epoch >= 0 && 0 <= s.epoch_emitted && s.epoch_emitted <= s.emitted,
            "sampler: saved epoch ", s.epoch, ", emitted ", s.emitted, ", epoch_emitted ",
            s.epoch_emitted, ": expected counts >= 0, epoch_emitted at most emitted");
  VLM_CHECK(0 <= s.concat_source && size_t(s.concat_source) <= n, "sampler: bad concat source");
  VLM_CHECK(int64_t(s.shuffle_buffer.size()) <= std::max<int64_t>(m.buffer, 0),
            "sampler: saved shuffle buffer holds ", s.shuffle_buffer.size(),
            " ids, more than its size ", m.buffer);
  for (int64_t id : s.shuffle_buffer) {
    int64_t src = sample_id_source(id), idx = sample_id_index(id);
    VLM_CHECK(id >= 0 && size_t(src) < n && m.slices[size_t(src)].front() <= idx &&
                  idx < m.slices[size_t(src)].back(),
              "sampler: saved shuffle buffer holds id ", id, ", which this worker does not own");
  }
  m.st = s;
  for (size_t i = 0; i < n; i++) {
    m.src_rng[i].set_state(s.sources[i].rng);
    if (s.sources[i].in_epoch) { // regenerate the epoch's permutation from its seed state
      Rng r;
      r.set_state(s.sources[i].epoch_rng);
      m.make_perm(i, r);
    }
  }
  m.blend_rng.set_state(s.blend_rng);
  m.shuffle_rng.set_state(s.shuffle_rng);
}

// ---- JSON ----

nlohmann::json SamplerState::to_json() const {
  nlohmann::json j;
  j["layout"] = layout;
  j["sources"] = nlohmann::json::array();
  for (const SourceState& s : sources) {
    nlohmann::json a = nlohmann::json::array();
    for (const SliceCursor& c : s.active) a.push_back({c.slice, c.next});
    j["sources"].push_back({{"rng", s.rng},
                            {"epoch_rng", s.epoch_rng},
                            {"in_epoch", s.in_epoch},
                            {"pending_offset", s.pending_offset},
                            {"active", a},
                            {"epoch", s.epoch},
                            {"epoch_samples", s.epoch_samples}});
  }
  j["blend_rng"] = blend_rng;
  j["quota"] = quota;
  j["concat_source"] = concat_source;
  j["shuffle_rng"] = shuffle_rng;
  j["shuffle_buffer"] = shuffle_buffer;
  j["draining"] = draining;
  j["finished"] = finished;
  j["epoch"] = epoch;
  j["emitted"] = emitted;
  j["epoch_emitted"] = epoch_emitted;
  return j;
}

SamplerState SamplerState::from_json(const nlohmann::json& j) {
  try {
    SamplerState s;
    s.layout = j.at("layout").get<uint64_t>();
    for (const auto& js : j.at("sources")) {
      SourceState ss;
      ss.rng = js.at("rng").get<std::array<uint64_t, 5>>();
      ss.epoch_rng = js.at("epoch_rng").get<std::array<uint64_t, 5>>();
      ss.in_epoch = js.at("in_epoch").get<bool>();
      ss.pending_offset = js.at("pending_offset").get<int64_t>();
      for (const auto& c : js.at("active"))
        ss.active.push_back({c.at(0).get<int64_t>(), c.at(1).get<int64_t>()});
      ss.epoch = js.at("epoch").get<int64_t>();
      ss.epoch_samples = js.at("epoch_samples").get<int64_t>();
      s.sources.push_back(std::move(ss));
    }
    s.blend_rng = j.at("blend_rng").get<std::array<uint64_t, 5>>();
    s.quota = j.at("quota").get<std::vector<int64_t>>();
    s.concat_source = j.at("concat_source").get<int64_t>();
    s.shuffle_rng = j.at("shuffle_rng").get<std::array<uint64_t, 5>>();
    s.shuffle_buffer = j.at("shuffle_buffer").get<std::vector<int64_t>>();
    s.draining = j.at("draining").get<bool>();
    s.finished = j.at("finished").get<bool>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.emitted = j.at("emitted").get<int64_t>();
    s.epoch_emitted = j.at("epoch_emitted").get<int64_t>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    VLM_FAIL("sampler state: malformed JSON document: ", e.what());
  }
}

} // namespace vlm::io
