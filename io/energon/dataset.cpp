#include "io/energon/dataset.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "io/energon/brace_expand.h"
#include "io/energon/tar.h"
#include "io/energon/yaml.h"
#include "src/base/logging.h"

namespace vlm::io {

// .tar.idx holds native-order uint64; every producer so far was little-endian (x86, ARM).
static_assert(std::endian::native == std::endian::little, ".tar.idx reading assumes little-endian");

namespace fs = std::filesystem;

namespace {

constexpr const char* kMetaDir = ".nv-meta";

std::string join(const std::string& root, const std::string& rel) {
  return (fs::path(root) / rel).string();
}

// pathlib's with_suffix(".tar.idx"): the last suffix of the file name is replaced.
std::string index_path_of(const std::string& tar_path) {
  fs::path p(tar_path);
  std::string name = p.filename().string();
  size_t dot = name.rfind('.');
  if (dot != std::string::npos && dot > 0 && dot + 1 < name.size()) name.resize(dot);
  return (p.parent_path() / (name + ".tar.idx")).string();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VLM_CHECK(in, "cannot read '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string quoted_list(const std::vector<std::string>& names, size_t max = 10) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < max; i++) s += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > max) s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s.empty() ? "(none)" : s;
}

// split.yaml / split.json content (energon's WebdatasetSplits).
struct SplitConfig {
  std::vector<std::pair<std::string, std::vector<std::string>>> split_parts; // file order
  std::vector<std::string> exclude;
};

std::vector<std::string> yaml_string_list(const YAML::Node& n, const std::string& path,
                                          const std::string& what) {
  std::vector<std::string> out;
  if (!n || n.IsNull()) return out;
  VLM_CHECK(n.IsSequence(), "'", path, "' line ", n.Mark().line + 1, ": ", what,
            " must be a list of strings");
  for (const YAML::Node& item : n) {
    VLM_CHECK(item.IsScalar(), "'", path, "' line ", item.Mark().line + 1, ": entries of ", what,
              " must be strings");
    out.push_back(item.Scalar());
  }
  return out;
}

SplitConfig parse_split_yaml(const std::string& path) {
  YAML::Node doc = load_yaml(path);
  VLM_CHECK(doc.IsMap(), "split config '", path, "' must be a mapping with 'split_parts'");
  SplitConfig cfg;
  bool have_parts = false;
  for (const auto& kv : doc) {
    std::string key = kv.first.Scalar();
    if (key == "split_parts") {
      have_parts = true;
      VLM_CHECK(kv.second.IsMap(), "split config '", path,
                "': 'split_parts' must map split names to lists of shards");
      for (const auto& sp : kv.second)
        cfg.split_parts.emplace_back(
            sp.first.Scalar(),
            yaml_string_list(sp.second, path, "split_parts." + sp.first.Scalar()));
    } else if (key == "exclude") {
      cfg.exclude = yaml_string_list(kv.second, path, "exclude");
    } else {
      VLM_FAIL("split config '", path, "' line ", kv.first.Mark().line + 1, ": unknown key '", key,
               "' (known: split_parts, exclude)");
    }
  }
  VLM_CHECK(have_parts, "split config '", path, "' has no 'split_parts'");
  return cfg;
}

SplitConfig parse_split_json(const std::string& path) {
  nlohmann::ordered_json doc;
  try {
    doc = nlohmann::ordered_json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    VLM_FAIL("cannot parse JSON '", path, "': ", e.what());
  }
  VLM_CHECK(doc.is_object() && doc.contains("split_parts") && doc["split_parts"].is_object(),
            "split config '", path, "' must be an object with 'split_parts'");
  auto strings = [&](const nlohmann::ordered_json& v, const std::string& what) {
    std::vector<std::string> out;
    if (v.is_null()) return out;
    VLM_CHECK(v.is_array(), "split config '", path, "': ", what, " must be a list of strings");
    for (const auto& s : v) {
      VLM_CHECK(s.is_string(), "split config '", path, "': entries of ", what, " must be strings");
      out.push_back(s.get<std::string>());
    }
    return out;
  };
  SplitConfig cfg;
  for (const auto& [key, value] : doc.items()) {
    if (key == "split_parts") {
      for (const auto& [name, list] : value.items())
        cfg.split_parts.emplace_back(name, strings(list, "split_parts." + name));
    } else if (key == "exclude") {
      cfg.exclude = strings(value, "exclude");
    } else {
      VLM_FAIL("split config '", path, "': unknown key '", key, "' (known: split_parts, exclude)");
    }
  }
  return cfg;
}

// .info.json / .info.yaml (energon's WebdatasetInfo): shard_counts in file order.
struct Info {
  std::string path;
  std::string energon_version;
  std::vector<std::pair<std::string, int64_t>> shard_counts;
  std::unordered_map<std::string, int64_t> count_of; // the same, for lookups
};

Info parse_info(const std::string& meta_dir) {
  Info info;
  std::string json_path = join(meta_dir, ".info.json");
  std::string yaml_path = join(meta_dir, ".info.yaml");
  std::error_code ec; // filesystem queries report problems as "missing", never throw
  if (fs::is_regular_file(json_path, ec)) {
    info.path = json_path;
    nlohmann::ordered_json doc;
    try {
      doc = nlohmann::ordered_json::parse(read_text(json_path));
    } catch (const nlohmann::json::exception& e) {
      VLM_FAIL("cannot parse JSON '", json_path, "': ", e.what());
    }
    VLM_CHECK(doc.is_object() && doc.contains("shard_counts") && doc["shard_counts"].is_object(),
              "'", json_path, "' must be an object with 'shard_counts'");
    if (doc.contains("energon_version") && doc["energon_version"].is_string())
      info.energon_version = doc["energon_version"].get<std::string>();
    for (const auto& [name, count] : doc["shard_counts"].items()) {
      VLM_CHECK(count.is_number_integer() && count.get<int64_t>() >= 0, "'", json_path,
                "': shard_counts['", name, "'] must be a non-negative integer");
      info.shard_counts.emplace_back(name, count.get<int64_t>());
    }
  } else if (fs::is_regular_file(yaml_path, ec)) {
    info.path = yaml_path;
    YAML::Node doc = load_yaml(yaml_path);
    VLM_CHECK(doc.IsMap() && doc["shard_counts"] && doc["shard_counts"].IsMap(), "'", yaml_path,
              "' must be a mapping with 'shard_counts'");
    if (doc["energon_version"] && doc["energon_version"].IsScalar())
      info.energon_version = doc["energon_version"].Scalar();
    for (const auto& kv : doc["shard_counts"]) {
      int64_t count = -1;
      try {
        count = kv.second.as<int64_t>();
      } catch (const YAML::Exception&) {
      }
      VLM_CHECK(count >= 0, "'", yaml_path, "' line ", kv.second.Mark().line + 1,
                ": shard_counts['", kv.first.Scalar(), "'] must be a non-negative integer");
      info.shard_counts.emplace_back(kv.first.Scalar(), count);
    }
  } else {
    VLM_FAIL("no dataset info: neither '", json_path, "' nor '", yaml_path,
             "' exists (was the dataset prepared with `energon prepare`?)");
  }
  info.count_of.insert(info.shard_counts.begin(), info.shard_counts.end());
  return info;
}

// Closes nothing itself: files are shared_ptrs, so an evicted file stays open until the last
// reader using it is done.
// The shard holding global index gi of a split (gi must be in range) and the index within it:
// the last shard whose first index is <= gi, so shards with count 0 are stepped over.
std::pair<size_t, int64_t> locate_in(const EnergonDataset::Split& split, int64_t gi) {
  auto it = std::upper_bound(split.shards.begin(), split.shards.end(), gi,
                             [](int64_t v, const ShardInfo& s) { return v < s.first_index; });
  size_t si = size_t(it - split.shards.begin()) - 1;
  return {si, gi - split.shards[si].first_index};
}

class FileCache {
public:
  explicit FileCache(size_t capacity) : capacity_(std::max<size_t>(capacity, 2)) {}

  std::shared_ptr<const ReadOnlyFile> get(const std::string& path) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = index_.find(path);
      if (it != index_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        return it->second->second;
      }
    }
    // Opened outside the lock: opens on a parallel filesystem can take milliseconds.
    auto file = std::make_shared<const ReadOnlyFile>(path);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(path);
    if (it != index_.end()) return it->second->second; // another thread was faster
    lru_.emplace_front(path, file);
    index_[path] = lru_.begin();
    while (lru_.size() > capacity_) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return file;
  }

private:
  using Entry = std::pair<std::string, std::shared_ptr<const ReadOnlyFile>>;
  std::mutex mu_;
  size_t capacity_;
  std::list<Entry> lru_; // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

} // namespace

// ---------------------------------------------------------------------------------------------

SampleError::SampleError(Reason r, std::string s, std::string k, int64_t gi,
                         const std::string& message)
    : vlm::Error(message), reason(r), shard(std::move(s)), key(std::move(k)), global_index(gi) {}

const char* sample_error_reason_name(SampleError::Reason r) {
  switch (r) {
  case SampleError::Reason::truncated: return "truncated";
  case SampleError::Reason::bad_header: return "bad_header";
  case SampleError::Reason::bad_index: return "bad_index";
  case SampleError::Reason::inconsistent_key: return "inconsistent_key";
  case SampleError::Reason::no_parts: return "no_parts";
  }
  return "unknown";
}

struct EnergonDataset::Impl {
  std::string root;
  std::string split_config_path;
  std::string dataset_class;
  std::map<std::string, std::string> subflavors;
  std::vector<std::string> part_filter;
  std::string energon_version;
  std::vector<std::string> excludes;
  std::unordered_set<std::string> exclude_set;
  std::vector<Split> splits;
  std::map<std::string, std::string> split_errors; // split -> why it cannot be used
  mutable FileCache files;

  explicit Impl(size_t max_open_files) : files(max_open_files) {}

  const Split* find(const std::string& name) const {
    for (const Split& s : splits)
      if (s.name == name) return &s;
    return nullptr;
  }

  std::string where(const Split& split, int64_t gi) const {
    return "dataset '" + root + "' split '" + split.name + "' sample " + std::to_string(gi);
  }

  RawSample read(const Split& split, int64_t gi) const;
  void parse_dataset_yaml(const std::string& path);
  void add_split(const std::string& name, const std::vector<std::string>& patterns,
                 const Info& info, std::map<std::string, std::string>& shard_problems);
  std::string validate_shard(const ShardInfo& shard) const;
};

void EnergonDataset::Impl::parse_dataset_yaml(const std::string& path) {
  std::error_code ec;
  VLM_CHECK(fs::is_regular_file(path, ec), "dataset config '", path,
            "' does not exist (energon prepare writes it unless --skip-dataset-yaml)");
  YAML::Node doc = load_yaml(path);
  VLM_CHECK(doc.IsMap(), "dataset config '", path, "' must be a mapping");
  std::vector<std::string> ignored;
  for (const auto& kv : doc) {
    std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (key == "__class__") {
      dataset_class = yaml_text(v);
    } else if (key == "__module__") {
      // megatron.energon; nothing to check in C++
    } else if (key == "sample_type") {
      if (dataset_class.empty() && v.IsMap() && v["__class__"])
        dataset_class = yaml_text(v["__class__"]);
    } else if (key == "subflavors") {
      if (v.IsNull()) continue;
      VLM_CHECK(v.IsMap(), "dataset config '", path, "' line ", v.Mark().line + 1,
                ": 'subflavors' must be a mapping");
      for (const auto& sf : v) subflavors[sf.first.Scalar()] = yaml_text(sf.second);
    } else if (key == "part_filter") {
      VLM_CHECK(v.IsSequence() || v.IsNull(), "dataset config '", path, "' line ",
                v.Mark().line + 1, ": part_filter '", yaml_text(v),
                "' is not a list of part names (Python part filters are not supported)");
      part_filter = yaml_string_list(v, path, "part_filter");
    } else {
      ignored.push_back(key);
    }
  }
  if (dataset_class != "CrudeWebdataset")
    log_warn("dataset '", root, "': ",
             dataset_class.empty() ? std::string("dataset.yaml names no __class__")
                                   : "dataset.yaml names class '" + dataset_class + "'",
             ", not CrudeWebdataset; reading raw parts (field_map / sample_loader are ignored)");
  if (!ignored.empty())
    log_info("dataset '", root, "': ignoring dataset.yaml key(s) ", quoted_list(ignored));
}

// "" when the shard is usable, else why not.
std::string EnergonDataset::Impl::validate_shard(const ShardInfo& shard) const {
  std::error_code ec;
  if (!fs::is_regular_file(shard.path, ec)) return "tar '" + shard.path + "' does not exist";
  uint64_t tar_size = fs::file_size(shard.path, ec);
  if (ec) return "cannot stat '" + shard.path + "': " + ec.message();
  if (!fs::is_regular_file(shard.index_path, ec))
    return "index '" + shard.index_path +
           "' does not exist (run `energon prepare --tar-index-only` on the dataset)";
  uint64_t idx_size = fs::file_size(shard.index_path, ec);
  uint64_t want = 8 * uint64_t(shard.count + 1);
  if (ec || idx_size != want)
    return "index '" + shard.index_path + "' has " + std::to_string(idx_size) +
           " bytes, expected " + std::to_string(want) + " = 8 x (" + std::to_string(shard.count) +
           " samples from .info + 1): a stale or truncated index, or wrong shard_counts";
  uint64_t last = 0;
  try {
    ReadOnlyFile idx(shard.index_path);
    if (idx.read_at(want - 8, &last, 8) != 8) return "cannot read '" + shard.index_path + "'";
  } catch (const vlm::Error& e) {
    return e.what();
  }
  if (last > tar_size)
    return "index '" + shard.index_path + "' ends at byte " + std::to_string(last) +
           " but the tar has " + std::to_string(tar_size) +
           " bytes: a truncated tar or a stale index";
  return "";
}

// Expands a split's patterns into shards (dropping excluded ones, counts from .info) and
// validates them; a problem is recorded in split_errors and reported when the split is used.
void EnergonDataset::Impl::add_split(const std::string& name,
                                     const std::vector<std::string>& patterns, const Info& info,
                                     std::map<std::string, std::string>& shard_problems) {
  Split split;
  split.name = name;
  for (const std::string& pattern : patterns) {
    std::vector<std::string> shard_names;
    try {
      shard_names = brace_expand(pattern);
    } catch (const vlm::Error& e) {
      VLM_FAIL("split config '", split_config_path, "': split '", name, "': ", e.what());
    }
    for (const std::string& shard_name : shard_names) {
      if (exclude_set.count(shard_name)) {
        split.excluded_shards++;
        continue;
      }
      auto it = info.count_of.find(shard_name);
      if (it == info.count_of.end()) {
        std::vector<std::string> known;
        for (const auto& sc : info.shard_counts) known.push_back(sc.first);
        VLM_FAIL("split config '", split_config_path, "': shard '", shard_name, "' of split '",
                 name, "' (from '", pattern, "') is not in '", info.path,
                 "' (known: ", quoted_list(known), ")");
      }
      ShardInfo shard;
      shard.name = shard_name;
      shard.path = join(root, shard_name);
      shard.index_path = index_path_of(shard.path);
      shard.count = it->second;
      shard.first_index = split.num_samples;
      split.num_samples += shard.count;
      split.shards.push_back(std::move(shard));
    }
  }
  for (const ShardInfo& shard : split.shards) {
    auto [it, fresh] = shard_problems.try_emplace(shard.name);
    if (fresh) it->second = validate_shard(shard);
    if (!it->second.empty() && !split_errors.count(name))
      split_errors[name] = "shard '" + shard.name + "': " + it->second;
  }
  // A split that lists no shards (`test: []`, which `energon prepare` writes) is a valid empty
  // split: it can be inspected; reading from it is refused by its users (SamplePipeline).
  splits.push_back(std::move(split));
}

EnergonDataset EnergonDataset::open(const std::string& root_in, const EnergonOpenOptions& opt) {
  std::string root = root_in;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  std::error_code ec;
  VLM_CHECK(fs::exists(root, ec), "dataset path '", root, "' does not exist");
  VLM_CHECK(fs::is_directory(root, ec), "dataset path '", root,
            "' is not a directory (a metadataset .yaml is opened with io/energon/metadataset.h)");
  std::string meta = join(root, kMetaDir);
  VLM_CHECK(fs::is_directory(meta, ec), "'", root, "' is not a prepared Energon dataset: '", meta,
            "' does not exist (run `energon prepare` on it)");

  auto impl = std::make_unique<Impl>(opt.max_open_files);
  impl->root = root;
  Info info = parse_info(meta);
  impl->energon_version = info.energon_version;

  std::string split_path = join(meta, opt.split_config);
  if (!fs::exists(split_path, ec) && opt.split_config == "split.yaml") {
    std::string json_path = join(meta, "split.json");
    VLM_CHECK(fs::exists(json_path, ec), "no split config: neither '", split_path, "' nor '",
              json_path, "' exists");
    split_path = json_path;
  }
  VLM_CHECK(fs::is_regular_file(split_path, ec), "split config '", split_path, "' does not exist");
  impl->split_config_path = split_path;
  auto ends_with = [](const std::string& s, const char* suffix) {
    size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
  };
  SplitConfig cfg;
  if (ends_with(split_path, ".yaml"))
    cfg = parse_split_yaml(split_path);
  else if (ends_with(split_path, ".json"))
    cfg = parse_split_json(split_path);
  else
    VLM_FAIL("split config '", split_path, "' must end in .yaml or .json (as energon requires)");

  impl->parse_dataset_yaml(join(meta, opt.dataset_config));

  for (const std::string& pattern : cfg.exclude) {
    std::vector<std::string> names;
    try {
      names = brace_expand(pattern);
    } catch (const vlm::Error& e) {
      VLM_FAIL("split config '", split_path, "': exclude entry: ", e.what());
    }
    for (std::string& n : names)
      if (impl->exclude_set.insert(n).second) impl->excludes.push_back(std::move(n));
  }

  std::map<std::string, std::string> shard_problems; // validated once per shard name
  for (const auto& [name, patterns] : cfg.split_parts)
    impl->add_split(name, patterns, info, shard_problems);
  return EnergonDataset(std::move(impl));
}

EnergonDataset::EnergonDataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EnergonDataset::~EnergonDataset() = default;
EnergonDataset::EnergonDataset(EnergonDataset&&) noexcept = default;
EnergonDataset& EnergonDataset::operator=(EnergonDataset&&) noexcept = default;

const std::string& EnergonDataset::root() const { return impl_->root; }
const std::string& EnergonDataset::dataset_class() const { return impl_->dataset_class; }
const std::map<std::string, std::string>& EnergonDataset::subflavors() const {
  return impl_->subflavors;
}
const std::vector<std::string>& EnergonDataset::part_filter() const { return impl_->part_filter; }
const std::string& EnergonDataset::energon_version() const { return impl_->energon_version; }
const std::vector<std::string>& EnergonDataset::excludes() const { return impl_->excludes; }

std::vector<std::string> EnergonDataset::split_names() const {
  std::vector<std::string> names;
  for (const Split& s : impl_->splits) names.push_back(s.name);
  return names;
}

bool EnergonDataset::has_split(const std::string& name) const {
  return impl_->find(name) != nullptr;
}

const EnergonDataset::Split& EnergonDataset::split(const std::string& name) const {
  const Split* s = impl_->find(name);
  VLM_CHECK(s, "dataset '", impl_->root, "' has no split '", name, "' in '",
            impl_->split_config_path, "' (splits: ", quoted_list(split_names()), ")");
  auto err = impl_->split_errors.find(name);
  VLM_CHECK(err == impl_->split_errors.end(), "dataset '", impl_->root, "' split '", name, "' (",
            impl_->split_config_path,
            ") cannot be used: ", err == impl_->split_errors.end() ? "" : err->second);
  return *s;
}

bool EnergonDataset::is_excluded(const std::string& shard, const std::string& key) const {
  return impl_->exclude_set.count(shard + "/" + key) != 0;
}

std::pair<size_t, int64_t> EnergonDataset::locate(const Split& split, int64_t gi) const {
  VLM_CHECK(gi >= 0 && gi < split.num_samples, "dataset '", impl_->root, "' split '", split.name,
            "': sample index ", gi, " out of range [0, ", split.num_samples, ")");
  return locate_in(split, gi);
}

RawSample EnergonDataset::read_sample(const std::string& split_name, int64_t gi) const {
  return impl_->read(split(split_name), gi);
}

RawSample EnergonDataset::read_sample(const Split& s, int64_t gi) const {
  return impl_->read(s, gi);
}

RawSample EnergonDataset::Impl::read(const Split& split, int64_t gi) const {
  VLM_CHECK(gi >= 0 && gi < split.num_samples, "dataset '", root, "' split '", split.name,
            "': sample index ", gi, " out of range [0, ", split.num_samples, ")");
  const auto [si, local] = locate_in(split, gi);
  const ShardInfo& shard = split.shards[si];
  using R = SampleError::Reason;
  auto fail = [&](R reason, const std::string& key, const std::string& msg) {
    return SampleError(reason, shard.name, key, gi,
                       where(split, gi) + " (shard '" + shard.name + "'" +
                           (key.empty() ? "" : ", key '" + key + "'") + ", " +
                           sample_error_reason_name(reason) + "): " + msg);
  };

  // The two index entries that bound the sample (validated to exist at open).
  uint64_t entry[2] = {0, 0};
  auto idx = files.get(shard.index_path);
  VLM_CHECK(idx->read_at(8 * uint64_t(local), entry, 16) == 16, "'", shard.index_path,
            "' is shorter than at open: cannot read entries ", local, "..", local + 1);
  const uint64_t begin = local == 0 ? 0 : entry[0]; // energon: sample 0 starts at byte 0
  const uint64_t end = entry[1];
  auto tar = files.get(shard.path);
  if (end < begin || end > tar->size())
    throw fail(R::bad_index, "",
               "index '" + shard.index_path + "' entries " + std::to_string(local) + ".." +
                   std::to_string(local + 1) + " give bytes [" + std::to_string(begin) + ", " +
                   std::to_string(end) + ") but the tar has " + std::to_string(tar->size()) +
                   " bytes");

  RawSample out;
  out.shard = shard.name;
  out.global_index = gi;
  out.subflavors = subflavors;
  bool have_key = false;
  try {
    TarRangeReader reader(*tar, begin, end);
    TarMember m;
    while (reader.next(&m)) {
      if (!m.is_regular() || tar_is_meta_name(m.name)) continue;
      std::string_view key, part;
      if (!tar_split_name(m.name, &key, &part)) continue;
      if (!have_key) {
        have_key = true;
        out.key = std::string(key);
        if (exclude_set.count(shard.name + "/" + out.key)) {
          out.excluded = true; // energon stops here too: the parts are never read
          return out;
        }
      } else if (key != out.key) {
        throw fail(R::inconsistent_key, out.key,
                   "member '" + m.name + "' at byte " + std::to_string(m.offset) +
                       " belongs to another sample, but the index range [" + std::to_string(begin) +
                       ", " + std::to_string(end) + ") holds one sample (stale .tar.idx?)");
      }
      if (!part_filter.empty() &&
          std::find(part_filter.begin(), part_filter.end(), part) == part_filter.end())
        continue;
      out.parts[std::string(part)] = reader.read_data(m); // a repeated part: the last wins
    }
    if (reader.position() < end)
      throw fail(R::truncated, out.key,
                 "end-of-archive block at byte " + std::to_string(reader.position()) +
                     " inside the sample's range [" + std::to_string(begin) + ", " +
                     std::to_string(end) + ")");
  } catch (const TarError& e) {
    throw fail(e.kind == TarError::Kind::truncated ? R::truncated : R::bad_header, out.key,
               e.what());
  }
  if (!have_key)
    throw fail(R::no_parts, "",
               "no sample member in bytes [" + std::to_string(begin) + ", " + std::to_string(end) +
                   ") of '" + shard.path + "'");
  if (out.parts.empty())
    throw fail(R::no_parts, out.key,
               "none of its parts is in part_filter " + quoted_list(part_filter));
  return out;
}

std::vector<uint64_t> EnergonDataset::read_shard_index(const ShardInfo& shard) const {
  auto idx = impl_->files.get(shard.index_path);
  std::vector<uint64_t> out(size_t(idx->size() / 8));
  size_t n = idx->read_at(0, out.data(), out.size() * 8);
  VLM_CHECK(n == out.size() * 8, "short read of '", shard.index_path, "'");
  return out;
}

} // namespace vlm::io
