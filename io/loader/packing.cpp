#include "io/loader/packing.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>
#include <utility>

#include "src/base/check.h"

namespace vlm::io {

const char* overlong_policy_name(OverlongPolicy p) {
  return p == OverlongPolicy::truncate ? "truncate" : "drop";
}

OverlongPolicy parse_overlong_policy(const std::string& s) {
  if (s == "truncate") return OverlongPolicy::truncate;
  if (s == "drop") return OverlongPolicy::drop;
  VLM_FAIL("unknown overlong policy '", s, "' (valid: truncate, drop)");
}

void PackingConfig::validate() const {
  VLM_CHECK(seq_len > 0 && seq_len <= kMaxSeqLen, "packing: seq_len must be in [1, ", kMaxSeqLen,
            "], got ", seq_len);
  VLM_CHECK(buffer_size >= 1 && buffer_size <= kMaxPackingBufferSize,
            "packing: buffer_size must be in [1, ", kMaxPackingBufferSize, "], got ", buffer_size);
  VLM_CHECK(spatial_merge_size >= 1, "packing: spatial_merge_size must be >= 1, got ",
            spatial_merge_size);
  VLM_CHECK(pad_id >= 0 && image_token_id >= 0 && vision_start_id >= 0 && vision_end_id >= 0,
            "packing: token ids must be >= 0 (pad_id ", pad_id, ", image_token_id ", image_token_id,
            ", vision_start_id ", vision_start_id, ", vision_end_id ", vision_end_id, ")");
}

const char* sample_fate_name(SampleFate f) {
  switch (f) {
  case SampleFate::kept: return "kept";
  case SampleFate::truncated: return "truncated";
  case SampleFate::dropped_overlong: return "dropped_overlong";
  case SampleFate::dropped_no_labels: return "dropped_no_labels";
  case SampleFate::invalid: return "invalid";
  }
  return "?";
}

namespace {

int64_t patches_of(const GridTHW& g) { return g[0] * g[1] * g[2]; }

} // namespace

std::string check_sample(const TokenizedSample& s, const PackingConfig& cfg) {
  using detail::str_cat;
  if (s.input_ids.empty()) return "empty sample (no tokens)";
  if (s.labels.size() != s.input_ids.size())
    return str_cat("labels has ", s.labels.size(), " entries but input_ids has ",
                   s.input_ids.size());
  for (size_t i = 0; i < s.input_ids.size(); i++) {
    if (s.input_ids[i] < 0) return str_cat("input_ids[", i, "] = ", s.input_ids[i], " < 0");
    if (s.labels[i] < 0 && s.labels[i] != -100)
      return str_cat("labels[", i, "] = ", s.labels[i], " (must be -100 or a token id >= 0)");
  }
  std::vector<ImageRun> runs;
  std::string why = find_image_runs(s.input_ids, s.image_grid_thw, cfg.image_token_id,
                                    cfg.spatial_merge_size, runs);
  if (!why.empty()) return why;
  int64_t patches = 0;
  for (const GridTHW& g : s.image_grid_thw) patches += patches_of(g);
  if (patches != s.num_patches)
    return str_cat("num_patches = ", s.num_patches, " but the image grids add up to ", patches,
                   " patches");
  if (!s.pixel_values.empty()) {
    if (s.patch_dim <= 0) return str_cat("pixel_values given but patch_dim = ", s.patch_dim);
    if (int64_t(s.pixel_values.size()) != s.num_patches * s.patch_dim)
      return str_cat("pixel_values has ", s.pixel_values.size(), " floats, expected num_patches ",
                     s.num_patches, " x patch_dim ", s.patch_dim);
  }
  return "";
}

int64_t image_safe_cut(const TokenizedSample& s, int64_t max_len, const PackingConfig& cfg) {
  const int64_t n = s.length();
  if (max_len >= n) return n;
  std::vector<ImageRun> runs;
  std::string why = find_image_runs(s.input_ids, s.image_grid_thw, cfg.image_token_id,
                                    cfg.spatial_merge_size, runs);
  VLM_CHECK(why.empty(), "image_safe_cut: ", why);
  int64_t cut = max_len;
  for (const ImageRun& r : runs) {
    // The image's span includes its <|vision_start|> / <|vision_end|> markers when present.
    int64_t begin = r.begin, end = r.end;
    if (begin > 0 && s.input_ids[size_t(begin - 1)] == cfg.vision_start_id) begin--;
    if (end < n && s.input_ids[size_t(end)] == cfg.vision_end_id) end++;
    if (begin < cut && cut < end) cut = begin; // spans are disjoint: at most one matches
  }
  return cut;
}

namespace {

// Cuts a checked sample to its first `cut` tokens (an image-safe cut), with the images wholly
// inside the prefix and their pixels.
void truncate_sample(TokenizedSample& s, int64_t cut, const PackingConfig& cfg) {
  std::vector<ImageRun> runs;
  find_image_runs(s.input_ids, s.image_grid_thw, cfg.image_token_id, cfg.spatial_merge_size, runs);
  size_t kept = 0;
  int64_t patches = 0;
  while (kept < runs.size() && runs[kept].end <= cut)
    patches += patches_of(s.image_grid_thw[kept++]);
  s.input_ids.resize(size_t(cut));
  s.labels.resize(size_t(cut));
  s.image_grid_thw.resize(kept);
  if (!s.pixel_values.empty()) s.pixel_values.resize(size_t(patches * s.patch_dim));
  s.num_patches = patches;
}

bool has_trainable_label(const TokenizedSample& s) {
  return std::any_of(s.labels.begin(), s.labels.end(), [](int32_t l) { return l != -100; });
}

} // namespace

PrepareResult prepare_sample(TokenizedSample& s, const PackingConfig& cfg) {
  using detail::str_cat;
  PrepareResult r;
  std::string why = check_sample(s, cfg);
  if (!why.empty()) return {SampleFate::invalid, why};
  const int64_t len = s.length();
  if (len > cfg.seq_len) {
    if (cfg.overlong == OverlongPolicy::drop)
      return {SampleFate::dropped_overlong,
              str_cat("length ", len, " > seq_len ", cfg.seq_len, " (overlong policy drop)")};
    int64_t cut = image_safe_cut(s, cfg.seq_len, cfg);
    truncate_sample(s, cut, cfg);
    r = {SampleFate::truncated, str_cat("truncated from ", len, " to ", cut, " tokens")};
  }
  if (!has_trainable_label(s))
    return {SampleFate::dropped_no_labels,
            r.fate == SampleFate::truncated
                ? str_cat("no trainable label left after truncation from ", len, " to ", s.length(),
                          " tokens (seq_len ", cfg.seq_len, ")")
                : std::string("no trainable label (all labels are -100)")};
  return r;
}

std::vector<std::vector<size_t>> best_fit_decreasing(const std::vector<int64_t>& lengths,
                                                     int64_t capacity) {
  for (size_t i = 0; i < lengths.size(); i++)
    VLM_CHECK(lengths[i] >= 1 && lengths[i] <= capacity, "best_fit_decreasing: item ", i,
              " has length ", lengths[i], ", outside [1, capacity ", capacity, "]");
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<size_t>> bins;
  std::set<std::pair<int64_t, size_t>> open; // (room left, bin), only bins with room > 0
  for (size_t item : order) {
    const int64_t len = lengths[item];
    auto it = open.lower_bound({len, 0}); // least room that fits; equal room: first opened
    size_t bin;
    int64_t room;
    if (it != open.end()) {
      bin = it->second;
      room = it->first - len;
      open.erase(it);
    } else {
      bin = bins.size();
      bins.emplace_back();
      room = capacity - len;
    }
    bins[bin].push_back(item);
    if (room > 0) open.insert({room, bin});
  }
  return bins;
}

PackedRow pack_row(const std::vector<TokenizedSample>& docs, const PackingConfig& cfg) {
  const int64_t T = cfg.seq_len;
  VLM_CHECK(!docs.empty(), "pack_row: no documents (a row of padding only would train nothing)");
  int64_t total = 0;
  for (size_t d = 0; d < docs.size(); d++) {
    std::string why = check_sample(docs[d], cfg);
    VLM_CHECK(why.empty(), "pack_row: document ", d, " (global index ", docs[d].global_index,
              "): ", why);
    total += docs[d].length();
  }
  VLM_CHECK(total <= T, "pack_row: ", docs.size(), " documents hold ", total,
            " tokens, more than seq_len ", T);

  PackedRow row;
  row.input_ids.reserve(size_t(T));
  row.labels.reserve(size_t(T));
  row.position_ids.assign(size_t(cfg.mrope ? 3 * T : T), 0);
  row.cu_seqlens.push_back(0);
  int64_t* pt = row.position_ids.data(); // plane t (the only plane for 1-D)
  int64_t* ph = cfg.mrope ? pt + T : nullptr;
  int64_t* pw = cfg.mrope ? pt + 2 * T : nullptr;
  bool deferred = false, decoded = false;

  for (const TokenizedSample& d : docs) {
    const int64_t at = int64_t(row.input_ids.size());
    row.input_ids.insert(row.input_ids.end(), d.input_ids.begin(), d.input_ids.end());
    row.labels.insert(row.labels.end(), d.labels.begin(), d.labels.end());
    row.labels[size_t(at)] = -100; // its target would be the previous document's last position
    row.cu_seqlens.push_back(int32_t(at + d.length()));
    if (cfg.mrope)
      mrope_position_ids(d.input_ids, d.image_grid_thw, cfg.image_token_id, cfg.spatial_merge_size,
                         pt + at, ph + at, pw + at);
    else
      text_position_ids(d.length(), pt + at);

    row.image_grid_thw.insert(row.image_grid_thw.end(), d.image_grid_thw.begin(),
                              d.image_grid_thw.end());
    if (d.num_patches > 0) {
      (d.pixel_values.empty() ? deferred : decoded) = true;
      VLM_CHECK(!(deferred && decoded), "pack_row: document with global index ", d.global_index,
                " mixes decoded and deferred pixel_values with the other documents of the row");
      if (decoded) {
        VLM_CHECK(row.patch_dim == 0 || row.patch_dim == d.patch_dim, "pack_row: patch_dim ",
                  d.patch_dim, " of global index ", d.global_index, " differs from the row's ",
                  row.patch_dim);
        row.pixel_values.insert(row.pixel_values.end(), d.pixel_values.begin(),
                                d.pixel_values.end());
      }
      if (row.patch_dim == 0) row.patch_dim = d.patch_dim;
      row.num_patches += d.num_patches;
    }
    row.sample_indices.push_back(d.global_index);
    row.doc_num_images.push_back(int32_t(d.image_grid_thw.size()));
  }
  row.num_docs = int64_t(docs.size());
  row.real_tokens = total;
  row.pad_tokens = T - total;

  if (row.pad_tokens > 0) { // one trailing pad segment (see the header for why)
    row.input_ids.resize(size_t(T), cfg.pad_id);
    row.labels.resize(size_t(T), -100);
    row.cu_seqlens.push_back(int32_t(T));
    for (int64_t i = 0; i < row.pad_tokens; i++) {
      pt[total + i] = i;
      if (cfg.mrope) ph[total + i] = pw[total + i] = i;
    }
  }
  return row;
}

std::vector<int32_t> next_token_targets(const std::vector<int32_t>& labels) {
  std::vector<int32_t> t(labels.size(), -100);
  for (size_t i = 0; i + 1 < labels.size(); i++) t[i] = labels[i + 1];
  return t;
}

double PackerStats::efficiency() const {
  int64_t all = real_tokens + pad_tokens;
  return all > 0 ? double(real_tokens) / double(all) : 0.0;
}

OnlinePacker::OnlinePacker(const PackingConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  buf_.reserve(size_t(cfg_.buffer_size));
}

PrepareResult OnlinePacker::push(TokenizedSample s) {
  VLM_CHECK(buf_.size() < size_t(cfg_.buffer_size), "OnlinePacker::push: the buffer is full (",
            cfg_.buffer_size, " samples): pop() while ready() before pushing more");
  PrepareResult r = prepare_sample(s, cfg_);
  stats_.pushed++;
  switch (r.fate) {
  case SampleFate::kept: stats_.kept++; break;
  case SampleFate::truncated: stats_.truncated++; break;
  case SampleFate::dropped_overlong: stats_.dropped_overlong++; break;
  case SampleFate::dropped_no_labels: stats_.dropped_no_labels++; break;
  case SampleFate::invalid: stats_.invalid++; break;
  }
  if (!is_dropped(r.fate)) buf_.push_back(std::move(s));
  return r;
}

bool OnlinePacker::ready() const {
  return buf_.size() >= size_t(cfg_.buffer_size) || (finished_ && !buf_.empty());
}

PackedRow OnlinePacker::pop() {
  VLM_CHECK(ready(), "OnlinePacker::pop: not ready (", buf_.size(), " of ", cfg_.buffer_size,
            " samples buffered, source ", finished_ ? "finished" : "not finished", ")");
  const size_t n = buf_.size();
  std::vector<int64_t> lengths(n);
  for (size_t i = 0; i < n; i++) lengths[i] = buf_[i].length();
  auto fill_of = [&](const std::vector<size_t>& items) {
    int64_t f = 0;
    for (size_t i : items) f += lengths[i];
    return f;
  };
  // Candidate (a): the bin of the oldest sample (position 0) in a best-fit-decreasing packing of
  // the whole buffer.
  std::vector<size_t> by_bfd;
  for (auto& bin : best_fit_decreasing(lengths, cfg_.seq_len))
    if (std::find(bin.begin(), bin.end(), size_t(0)) != bin.end()) by_bfd = std::move(bin);
  // Candidate (b): the oldest sample, then first-fit-decreasing into its remaining room.
  std::vector<size_t> order(n - 1);
  std::iota(order.begin(), order.end(), size_t(1));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return lengths[x] > lengths[y]; });
  std::vector<size_t> by_ffd{0};
  int64_t room = cfg_.seq_len - lengths[0];
  for (size_t i : order)
    if (lengths[i] <= room) {
      by_ffd.push_back(i);
      room -= lengths[i];
    }
  std::vector<size_t> chosen = fill_of(by_ffd) > fill_of(by_bfd) ? by_ffd : by_bfd;
  std::sort(chosen.begin(), chosen.end()); // documents in arrival order within the row

  std::vector<TokenizedSample> docs;
  docs.reserve(chosen.size());
  std::vector<TokenizedSample> rest;
  rest.reserve(buf_.size() - chosen.size());
  for (size_t i = 0, c = 0; i < buf_.size(); i++) {
    if (c < chosen.size() && chosen[c] == i) {
      docs.push_back(std::move(buf_[i]));
      c++;
    } else {
      rest.push_back(std::move(buf_[i]));
    }
  }
  buf_ = std::move(rest);

  PackedRow row = pack_row(docs, cfg_);
  stats_.rows++;
  stats_.real_tokens += row.real_tokens;
  stats_.pad_tokens += row.pad_tokens;
  return row;
}

std::vector<int64_t> OnlinePacker::buffered_indices() const {
  std::vector<int64_t> out;
  out.reserve(buf_.size());
  for (const TokenizedSample& s : buf_) out.push_back(s.global_index);
  return out;
}

void OnlinePacker::restore(std::vector<TokenizedSample> samples,
                           const std::vector<int64_t>& saved_indices) {
  VLM_CHECK(buf_.empty(), "OnlinePacker::restore: the packer already holds ", buf_.size(),
            " samples; restore into a fresh packer");
  VLM_CHECK(samples.size() == saved_indices.size(), "OnlinePacker::restore: ", samples.size(),
            " samples given for ", saved_indices.size(), " saved indices");
  VLM_CHECK(samples.size() <= size_t(cfg_.buffer_size), "OnlinePacker::restore: ", samples.size(),
            " saved samples exceed buffer_size ", cfg_.buffer_size,
            " (was the checkpoint made with another packing buffer size?)");
  for (size_t i = 0; i < samples.size(); i++) {
    TokenizedSample& s = samples[i];
    VLM_CHECK(s.global_index == saved_indices[i], "OnlinePacker::restore: sample ", i,
              " has global index ", s.global_index, " but the saved state lists ",
              saved_indices[i]);
    PrepareResult r = prepare_sample(s, cfg_);
    VLM_CHECK(!is_dropped(r.fate), "OnlinePacker::restore: sample with global index ",
              s.global_index, " was buffered when the state was saved but is now ",
              sample_fate_name(r.fate), " (", r.reason,
              "): the data, tokenization or packing config changed since the checkpoint");
    buf_.push_back(std::move(s));
  }
}

} // namespace vlm::io
