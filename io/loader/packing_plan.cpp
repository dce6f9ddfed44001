#include "io/loader/packing_plan.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "io/state/atomic_file.h"
#include "src/base/check.h"
#include "src/base/rng.h"

namespace vlm::io {

// The body is the in-memory arrays byte for byte.
static_assert(std::endian::native == std::endian::little, "packing plans are little-endian");

namespace {

constexpr char kMagic[8] = {'V', 'L', 'M', 'P', 'L', 'A', 'N', '\0'};
constexpr int kVersion = 1;
constexpr const char* kFormat = "vlmtrain packing plan";

// FNV-1a 64 over byte ranges: a cheap integrity check against truncated or altered files.
struct Fnv1a64 {
  uint64_t h = 0xcbf29ce484222325ull;
  void add(const void* p, size_t n) {
    auto c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
  }
  std::string hex() const {
    char s[17];
    std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(h));
    return s;
  }
};

template <typename T> size_t bytes_of(const std::vector<T>& v) { return v.size() * sizeof(T); }

std::string body_checksum(const std::vector<int64_t>& offsets, const std::vector<int64_t>& indices,
                          const std::vector<int32_t>& lengths) {
  Fnv1a64 f;
  f.add(offsets.data(), bytes_of(offsets));
  f.add(indices.data(), bytes_of(indices));
  f.add(lengths.data(), bytes_of(lengths));
  return f.hex();
}

nlohmann::ordered_json identity_json(const PlanIdentity& id) {
  return {{"dataset", id.dataset},
          {"split", id.split},
          {"sample_count", id.sample_count},
          {"seq_len", id.seq_len},
          {"overlong", overlong_policy_name(id.overlong)},
          {"fingerprint", id.fingerprint}};
}

} // namespace

int32_t scan_length(TokenizedSample s, const PackingConfig& cfg) {
  PrepareResult r = prepare_sample(s, cfg);
  return is_dropped(r.fate) ? 0 : int32_t(s.length());
}

PackingPlan PackingPlan::build(const std::vector<int32_t>& lengths, const PlanIdentity& id,
                               const PlanOptions& opt) {
  VLM_CHECK(id.seq_len > 0 && id.seq_len <= std::numeric_limits<int32_t>::max(),
            "packing plan: seq_len must be in [1, 2^31), got ", id.seq_len);
  VLM_CHECK(int64_t(lengths.size()) == id.sample_count, "packing plan: ", lengths.size(),
            " lengths for a split of sample_count ", id.sample_count);
  VLM_CHECK(opt.window >= 0, "packing plan: window must be >= 0, got ", opt.window);
  for (size_t i = 0; i < lengths.size(); i++)
    VLM_CHECK(lengths[i] >= 0 && lengths[i] <= id.seq_len, "packing plan: global index ", i,
              " has scan length ", lengths[i], ", outside [0, seq_len ", id.seq_len,
              "] (0 = skipped; apply prepare_sample / scan_length first)");

  // Pack each window (or the whole split) with best-fit-decreasing.
  std::vector<std::vector<int64_t>> rows;
  const int64_t n = id.sample_count, window = opt.window > 0 ? opt.window : std::max<int64_t>(n, 1);
  for (int64_t begin = 0; begin < n; begin += window) {
    const int64_t end = std::min(n, begin + window);
    std::vector<int64_t> idx, len;
    for (int64_t i = begin; i < end; i++)
      if (lengths[size_t(i)] > 0) {
        idx.push_back(i);
        len.push_back(lengths[size_t(i)]);
      }
    for (auto& bin : best_fit_decreasing(len, id.seq_len)) {
      std::vector<int64_t> row;
      for (size_t k : bin) row.push_back(idx[k]);
      std::sort(row.begin(), row.end());
      rows.push_back(std::move(row));
    }
  }
  if (opt.shuffle_rows) { // Fisher-Yates with the platform-independent Rng
    Rng rng(opt.seed);
    for (int64_t i = int64_t(rows.size()) - 1; i > 0; i--)
      std::swap(rows[size_t(i)], rows[size_t(rng.randint(0, i + 1))]);
  }

  PackingPlan p;
  p.id_ = id;
  p.opt_ = opt;
  for (const auto& row : rows) {
    for (int64_t g : row) {
      p.indices_.push_back(g);
      p.lengths_.push_back(lengths[size_t(g)]);
      p.real_tokens_ += lengths[size_t(g)];
    }
    p.offsets_.push_back(int64_t(p.indices_.size()));
  }
  p.check_consistent("packing plan (just built)");
  return p;
}

void PackingPlan::check_consistent(const std::string& where) const {
  VLM_CHECK(!offsets_.empty() && offsets_.front() == 0 &&
                offsets_.back() == int64_t(indices_.size()) && indices_.size() == lengths_.size(),
            where, ": row offsets do not cover the ", indices_.size(), " entries");
  VLM_CHECK(int64_t(indices_.size()) <= id_.sample_count, where, ": ", indices_.size(),
            " entries for a split of ", id_.sample_count, " samples");
  int64_t real = 0;
  for (int64_t r = 0; r < num_rows(); r++) {
    const int64_t b = offsets_[size_t(r)], e = offsets_[size_t(r) + 1];
    VLM_CHECK(b < e, where, ": row ", r, " is empty or its offsets decrease (", b, ", ", e, ")");
    int64_t sum = 0;
    for (int64_t k = b; k < e; k++) {
      const int64_t g = indices_[size_t(k)];
      const int32_t len = lengths_[size_t(k)];
      VLM_CHECK(g >= 0 && g < id_.sample_count, where, ": row ", r, " names global index ", g,
                ", outside the split's [0, ", id_.sample_count, ")");
      VLM_CHECK(len >= 1 && len <= id_.seq_len, where, ": row ", r, ", global index ", g,
                ": length ", len, " outside [1, seq_len ", id_.seq_len, "]");
      sum += len;
    }
    VLM_CHECK(sum <= id_.seq_len, where, ": row ", r, " holds ", sum, " tokens > seq_len ",
              id_.seq_len);
    real += sum;
  }
  // Uniqueness by sorting a copy: memory bounded by the entries, not by a header's sample_count.
  std::vector<int64_t> sorted = indices_;
  std::sort(sorted.begin(), sorted.end());
  auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  VLM_CHECK(dup == sorted.end(), where, ": global index ", dup == sorted.end() ? 0 : *dup,
            " appears in more than one place");
  VLM_CHECK(real == real_tokens_, where, ": rows hold ", real, " tokens but the plan records ",
            real_tokens_);
}

std::span<const int64_t> PackingPlan::row(int64_t r) const {
  VLM_CHECK(r >= 0 && r < num_rows(), "packing plan: row ", r, " out of range [0, ", num_rows(),
            ")");
  const size_t b = size_t(offsets_[size_t(r)]), e = size_t(offsets_[size_t(r) + 1]);
  return {indices_.data() + b, e - b};
}

std::span<const int32_t> PackingPlan::row_lengths(int64_t r) const {
  VLM_CHECK(r >= 0 && r < num_rows(), "packing plan: row ", r, " out of range [0, ", num_rows(),
            ")");
  const size_t b = size_t(offsets_[size_t(r)]), e = size_t(offsets_[size_t(r) + 1]);
  return {lengths_.data() + b, e - b};
}

double PackingPlan::efficiency() const {
  const int64_t all = num_rows() * id_.seq_len;
  return all > 0 ? double(real_tokens_) / double(all) : 0.0;
}

void PackingPlan::check_identity(const PlanIdentity& expected) const {
  std::string diff;
  auto field = [&](const char* name, const auto& plan, const auto& want) {
    if (!(plan == want))
      diff += detail::str_cat("\n  ", name, ": plan has ", plan, ", expected ", want);
  };
  field("dataset", id_.dataset, expected.dataset);
  field("split", id_.split, expected.split);
  field("sample_count", id_.sample_count, expected.sample_count);
  field("seq_len", id_.seq_len, expected.seq_len);
  field("overlong", std::string(overlong_policy_name(id_.overlong)),
        std::string(overlong_policy_name(expected.overlong)));
  std::map<std::string, std::string> keys_union = id_.fingerprint;
  keys_union.insert(expected.fingerprint.begin(), expected.fingerprint.end());
  for (const auto& [key, unused] : keys_union) {
    auto a = id_.fingerprint.find(key), b = expected.fingerprint.find(key);
    std::string pa = a == id_.fingerprint.end() ? "(missing)" : "'" + a->second + "'";
    std::string pb = b == expected.fingerprint.end() ? "(missing)" : "'" + b->second + "'";
    field(("fingerprint." + key).c_str(), pa, pb);
  }
  VLM_CHECK(diff.empty(),
            "the packing plan was made for other data or settings; re-run `vlmtrain "
            "data pack` (with --config and the training config, the plan matches the run). "
            "Differences:",
            diff);
}

PackedRow PackingPlan::pack(int64_t r, std::vector<TokenizedSample> samples,
                            const PackingConfig& cfg) const {
  VLM_CHECK(cfg.seq_len == id_.seq_len && cfg.overlong == id_.overlong,
            "packing plan: made for seq_len ", id_.seq_len, ", overlong ",
            overlong_policy_name(id_.overlong), " but replayed with seq_len ", cfg.seq_len,
            ", overlong ", overlong_policy_name(cfg.overlong));
  auto idx = row(r);
  auto len = row_lengths(r);
  size_t k = 0; // next planned entry
  for (TokenizedSample& s : samples) {
    while (k < idx.size() && idx[k] != s.global_index) k++; // left-out samples are allowed
    VLM_CHECK(k < idx.size(), "packing plan: row ", r, " replay got global index ", s.global_index,
              ", which is not in the row or out of row order");
    PrepareResult res = prepare_sample(s, cfg);
    VLM_CHECK(!is_dropped(res.fate), "packing plan: row ", r, ", global index ", s.global_index,
              " is now ", sample_fate_name(res.fate), " (", res.reason,
              "); the data or tokenization changed since the plan was made: re-run `vlmtrain "
              "data pack`");
    VLM_CHECK(s.length() == len[k], "packing plan: row ", r, ", global index ", s.global_index,
              " has length ", s.length(), " but the plan expects ", len[k],
              "; the tokenizer, chat template or image settings changed since the plan was "
              "made: re-run `vlmtrain data pack`");
    k++;
  }
  return pack_row(samples, cfg);
}

void PackingPlan::save(const std::string& path) const {
  const std::string file = "packing plan '" + path + "'";
  nlohmann::ordered_json h;
  h["format"] = kFormat;
  h["version"] = kVersion;
  h["identity"] = identity_json(id_);
  h["options"] = {
      {"window", opt_.window}, {"shuffle_rows", opt_.shuffle_rows}, {"seed", opt_.seed}};
  h["num_rows"] = num_rows();
  h["num_entries"] = num_packed();
  h["num_skipped"] = num_skipped();
  h["real_tokens"] = real_tokens_;
  h["pad_tokens"] = pad_tokens();
  h["body_fnv1a64"] = body_checksum(offsets_, indices_, lengths_);
  std::string json;
  try {
    json = h.dump();
  } catch (const nlohmann::json::exception& e) { // e.g. a dataset name that is not UTF-8
    VLM_FAIL(file, ": cannot encode the header: ", e.what());
  }
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; i++) len_bytes[i] = (uint64_t(json.size()) >> (8 * i)) & 0xff;

  write_file_atomic(path,
                    {{kMagic, sizeof kMagic},
                     {len_bytes, 8},
                     {json.data(), json.size()},
                     {offsets_.data(), bytes_of(offsets_)},
                     {indices_.data(), bytes_of(indices_)},
                     {lengths_.data(), bytes_of(lengths_)}},
                    file);
}

PackingPlan PackingPlan::load(const std::string& path) {
  const std::string file = "packing plan '" + path + "'";
  std::ifstream in(path, std::ios::binary);
  VLM_CHECK(in, file, ": cannot open: ", std::strerror(errno));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  VLM_CHECK(!in.bad(), file, ": read error");
  VLM_CHECK(data.size() >= 16 && std::memcmp(data.data(), kMagic, 8) == 0, file,
            ": not a packing plan (bad magic; expected \"VLMPLAN\\0\")");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++)
    hlen |= uint64_t(static_cast<unsigned char>(data[8 + size_t(i)])) << (8 * i);
  VLM_CHECK(hlen <= data.size() - 16, file, ": header length ", hlen, " exceeds the file size ",
            data.size());

  PackingPlan p;
  int64_t num_rows = 0, num_entries = 0, num_skipped = 0, pad_tokens = 0;
  std::string checksum, overlong;
  try {
    auto h = nlohmann::json::parse(data.begin() + 16, data.begin() + 16 + std::ptrdiff_t(hlen));
    VLM_CHECK(h.value("format", "") == kFormat, file, ": header format is '", h.value("format", ""),
              "', expected '", kFormat, "'");
    const int version = h.at("version").get<int>();
    VLM_CHECK(version == kVersion, file, ": format version ", version, " (this build reads ",
              kVersion, "); re-run `vlmtrain data pack`");
    const auto& id = h.at("identity");
    p.id_.dataset = id.at("dataset").get<std::string>();
    p.id_.split = id.at("split").get<std::string>();
    p.id_.sample_count = id.at("sample_count").get<int64_t>();
    p.id_.seq_len = id.at("seq_len").get<int64_t>();
    overlong = id.at("overlong").get<std::string>();
    p.id_.fingerprint = id.at("fingerprint").get<std::map<std::string, std::string>>();
    const auto& opt = h.at("options");
    p.opt_.window = opt.at("window").get<int64_t>();
    p.opt_.shuffle_rows = opt.at("shuffle_rows").get<bool>();
    p.opt_.seed = opt.at("seed").get<uint64_t>();
    num_rows = h.at("num_rows").get<int64_t>();
    num_entries = h.at("num_entries").get<int64_t>();
    num_skipped = h.at("num_skipped").get<int64_t>();
    p.real_tokens_ = h.at("real_tokens").get<int64_t>();
    pad_tokens = h.at("pad_tokens").get<int64_t>();
    checksum = h.at("body_fnv1a64").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    VLM_FAIL(file, ": bad header: ", e.what());
  }
  VLM_CHECK(overlong == "truncate" || overlong == "drop", file, ": unknown overlong policy '",
            overlong, "' in the header");
  p.id_.overlong = parse_overlong_policy(overlong);
  VLM_CHECK(p.id_.seq_len > 0 && p.id_.sample_count >= 0 && num_rows >= 0 && num_entries >= 0 &&
                num_entries <= p.id_.sample_count,
            file, ": header values out of range (seq_len ", p.id_.seq_len, ", sample_count ",
            p.id_.sample_count, ", num_rows ", num_rows, ", num_entries ", num_entries, ")");
  const uint64_t body = uint64_t(num_rows + 1) * 8 + uint64_t(num_entries) * 12;
  VLM_CHECK(data.size() - 16 - hlen == body, file, ": body has ", data.size() - 16 - hlen,
            " bytes, the header's num_rows ", num_rows, " and num_entries ", num_entries, " need ",
            body, " (truncated or corrupted file)");
  const char* b = data.data() + 16 + hlen;
  p.offsets_.resize(size_t(num_rows + 1));
  p.indices_.resize(size_t(num_entries));
  p.lengths_.resize(size_t(num_entries));
  std::memcpy(p.offsets_.data(), b, bytes_of(p.offsets_));
  b += bytes_of(p.offsets_);
  std::memcpy(p.indices_.data(), b, bytes_of(p.indices_));
  b += bytes_of(p.indices_);
  std::memcpy(p.lengths_.data(), b, bytes_of(p.lengths_));
  const std::string actual = body_checksum(p.offsets_, p.indices_, p.lengths_);
  VLM_CHECK(actual == checksum, file, ": body checksum ", actual, " does not match the header's ",
            checksum, " (corrupted file)");
  p.check_consistent(file);
  VLM_CHECK(num_skipped == p.num_skipped() && pad_tokens == p.pad_tokens(), file,
            ": header totals (num_skipped ", num_skipped, ", pad_tokens ", pad_tokens,
            ") disagree with the body (", p.num_skipped(), ", ", p.pad_tokens(), ")");
  return p;
}

PackingPlan write_packing_plan(const std::string& path, const std::vector<int32_t>& lengths,
                               const PlanIdentity& id, const PlanOptions& opt) {
  PackingPlan p = PackingPlan::build(lengths, id, opt);
  p.save(path);
  return p;
}

} // namespace vlm::io
