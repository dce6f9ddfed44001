#include "io/energon/metadataset.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "io/energon/yaml.h"
#include "src/base/check.h"

namespace vlm::io {

namespace fs = std::filesystem;

namespace {

constexpr int kMaxNesting = 16;

// Where a node is: the YAML file, the node's line and its key path, for messages.
struct Where {
  std::string file;
  std::string key; // "splits.train.blend[1]"
  std::string str(const YAML::Node& n) const {
    std::string s = "metadataset '" + file + "'";
    if (n.IsDefined()) s += " line " + std::to_string(n.Mark().line + 1);
    return s + ", " + (key.empty() ? "(top level)" : key);
  }
  Where child(const std::string& k) const { return {file, key.empty() ? k : key + "." + k}; }
  Where item(size_t i) const { return {file, key + "[" + std::to_string(i) + "]"}; }
};

// A YAML scalar cast as energon's eyaml._cast_scalar does: quoted -> string; null/~ -> null;
// true/yes/false/no -> bool; containing '.' or 'e' -> float if it parses; else int if it
// parses; else string.
struct Scalar {
  enum class Kind { null, boolean, integer, floating, string } kind = Kind::null;
  int64_t i = 0;
  double d = 0;
  std::string s;
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating; }
  double number() const { return kind == Kind::integer ? double(i) : d; }
};

Scalar cast_scalar(const YAML::Node& n) {
  Scalar out;
  if (n.IsNull()) return out;
  out.s = n.Scalar();
  out.kind = Scalar::Kind::string;
  if (n.Tag() == "!") return out; // quoted
  std::string lower = out.s;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  if (lower == "null" || lower == "~") return Scalar{};
  if (lower == "true" || lower == "yes" || lower == "false" || lower == "no") {
    out.kind = Scalar::Kind::boolean;
    out.i = (lower == "true" || lower == "yes");
    return out;
  }
  const char* b = out.s.c_str();
  const char* e = b + out.s.size();
  if (lower.find('.') != std::string::npos || lower.find('e') != std::string::npos) {
    char* stop = nullptr;
    double v = std::strtod(b, &stop);
    if (stop == e && e != b) {
      out.kind = Scalar::Kind::floating;
      out.d = v;
    }
    return out;
  }
  if (b != e && *b == '+') b++;
  int64_t v = 0;
  auto r = std::from_chars(b, e, v);
  if (r.ec == std::errc() && r.ptr == e) {
    out.kind = Scalar::Kind::integer;
    out.i = v;
  }
  return out;
}

void check_keys(const YAML::Node& n, const Where& w, const std::set<std::string>& allowed) {
  VLM_CHECK(n.IsMap(), w.str(n), ": must be a mapping");
  for (const auto& kv : n) {
    std::string k = kv.first.Scalar();
    if (allowed.count(k) || k == "__module__" || k == "__class__") continue;
    if (k == "aux")
      VLM_FAIL(w.child(k).str(kv.first),
               ": auxiliary datasets are not supported (they need index.sqlite random access)");
    if (k == "join") VLM_FAIL(w.child(k).str(kv.first), ": join datasets are not supported");
    std::string known;
    for (const std::string& a : allowed) known += (known.empty() ? "" : ", ") + a;
    VLM_FAIL(w.child(k).str(kv.first), ": unknown key '", k, "' (known here: ", known, ")");
  }
}

double non_negative_number(const YAML::Node& n, const Where& w) {
  Scalar s = cast_scalar(n);
  VLM_CHECK(n.IsScalar() && s.is_number() && std::isfinite(s.number()) && s.number() >= 0, w.str(n),
            ": must be a non-negative number (got '", yaml_text(n), "')");
  return s.number();
}

std::string string_value(const YAML::Node& n, const Where& w) {
  VLM_CHECK(n.IsScalar(), w.str(n), ": must be a string (got '", yaml_text(n), "')");
  return n.Scalar();
}

// energon's Subset.as_dataset_subset.
DatasetSubset parse_subset(const YAML::Node& n, const Where& w) {
  check_keys(n, w, {"range"});
  const YAML::Node r = n["range"];
  Where wr = w.child("range");
  VLM_CHECK(r && r.IsSequence() && r.size() == 2, wr.str(r),
            ": must be a list [start, end] (ints, 'end', or percentages like '25%')");
  enum { absolute, relative, end } kind[2];
  int64_t abs[2] = {0, 0};
  double rel[2] = {0, 0};
  for (size_t i = 0; i < 2; i++) {
    Scalar s = cast_scalar(r[i]);
    std::string text = s.s;
    text.erase(0, text.find_first_not_of(" \t"));
    text.erase(text.find_last_not_of(" \t") + 1);
    if (s.kind == Scalar::Kind::integer) {
      kind[i] = absolute;
      abs[i] = s.i;
    } else if (s.kind == Scalar::Kind::string && text == "end") {
      kind[i] = end;
    } else if (s.kind == Scalar::Kind::string && !text.empty() && text.back() == '%') {
      char* stop = nullptr;
      std::string num = text.substr(0, text.size() - 1);
      double pct = std::strtod(num.c_str(), &stop);
      VLM_CHECK(!num.empty() && stop == num.c_str() + num.size() && pct >= 0 && pct <= 100,
                wr.item(i).str(r[i]), ": '", text, "' is not a percentage between 0% and 100%");
      kind[i] = relative;
      rel[i] = pct / 100.0;
    } else {
      VLM_FAIL(wr.item(i).str(r[i]), ": '", yaml_text(r[i]),
               "' must be an int, 'end' or a percentage like '25%'");
    }
  }
  DatasetSubset out;
  if (kind[0] == absolute) {
    VLM_CHECK(kind[1] != relative, wr.str(r),
              ": an absolute start needs an absolute end (an int or 'end')");
    VLM_CHECK(abs[0] >= 0 && (kind[1] == end || abs[1] >= abs[0]), wr.str(r), ": range [", abs[0],
              ", ", kind[1] == end ? "end" : std::to_string(abs[1]),
              "] must satisfy 0 <= start <= end");
    out.abs_start = abs[0];
    if (kind[1] == absolute) out.abs_end = abs[1];
  } else {
    VLM_CHECK(kind[0] == relative && kind[1] == relative, wr.str(r),
              ": a percentage start needs a percentage end");
    VLM_CHECK(rel[0] <= rel[1], wr.str(r), ": start must not exceed end");
    out.rel_start = rel[0];
    out.rel_end = rel[1];
  }
  return out;
}

// energon's Subset.merge: the outer (parent) relative range is applied within the inner one.
DatasetSubset merge_subset(const DatasetSubset& own, const DatasetSubset& parent) {
  DatasetSubset out = own;
  double total = own.rel_end - own.rel_start;
  out.rel_start = own.rel_start + parent.rel_start * total;
  out.rel_end = own.rel_start + parent.rel_end * total;
  return out;
}

std::optional<int64_t> combine_shuffle(std::optional<int64_t> outer, std::optional<int64_t> own) {
  if (!outer || !own) return std::nullopt;
  if (*outer == -1 || *own == -1) return -1;
  return *outer * *own;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_prepared_dataset(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p / ".nv-meta" / ".info.json", ec) ||
         fs::is_regular_file(p / ".nv-meta" / ".info.yaml", ec);
}

// What a level passes down to the next (energon's get_datasets arguments).
struct Inherited {
  std::string split;
  std::map<std::string, std::string> subflavors; // outer, overriding inner
  std::optional<int64_t> shuffle = 1;
  std::optional<DatasetSubset> subset;
};

class Resolver {
public:
  ResolvedSplit top(const std::string& yaml_path, const std::string& split) {
    return load(yaml_path, Inherited{split, {}, 1, std::nullopt}, "");
  }

private:
  std::vector<std::string> stack_; // nesting chain, for cycle detection

  ResolvedSplit load(const std::string& file, const Inherited& in, const std::string& from) {
    VLM_CHECK(int(stack_.size()) < kMaxNesting, "metadataset nesting deeper than ", kMaxNesting,
              " at '", file, "' (a cycle?)", from);
    stack_.push_back(file);
    YAML::Node doc = load_yaml(file, "metadataset");
    Where w{file, ""};
    VLM_CHECK(doc.IsMap(), "metadataset '", file, "' must be a mapping");
    check_keys(doc, w, {"splits"});
    std::string cls = doc["__class__"] ? yaml_text(doc["__class__"]) : "";
    VLM_CHECK(cls != "Metadataset", "metadataset '", file,
              "': legacy `__class__: Metadataset` (V1) is not supported; convert it to "
              "MetadatasetV2");
    VLM_CHECK(cls == "MetadatasetV2", "metadataset '", file,
              "': `__class__` must be MetadatasetV2 (got '", cls, "')");
    const YAML::Node splits = doc["splits"];
    VLM_CHECK(splits && splits.IsMap(), w.child("splits").str(splits),
              ": must map split names to dataset nodes");
    const YAML::Node node = splits[in.split];
    if (!node) {
      std::string known;
      for (const auto& kv : splits)
        known += (known.empty() ? "'" : ", '") + kv.first.Scalar() + "'";
      VLM_FAIL(w.child("splits").str(splits), ": no split '", in.split, "' (defined: ", known, ")",
               from);
    }
    ResolvedSplit out =
        resolve_node(node, w.child("splits").child(in.split), fs::path(file).parent_path(), in);
    stack_.pop_back();
    return out;
  }

  // A split node or a nested reference: blend, blend_epochized or a dataset reference.
  ResolvedSplit resolve_node(const YAML::Node& n, const Where& w, const fs::path& dir,
                             const Inherited& in) {
    VLM_CHECK(n.IsMap(), w.str(n), ": must be a mapping with 'path', 'blend' or 'blend_epochized'");
    if (n["join"]) VLM_FAIL(w.child("join").str(n["join"]), ": join datasets are not supported");
    bool weights = bool(n["blend"]);
    if (!weights && !n["blend_epochized"]) return reference(n, w, dir, in, {});
    const char* list_key = weights ? "blend" : "blend_epochized";
    check_keys(n, w, {list_key, "subset"});
    Inherited here = in;
    here.subset = subset_for(n, w, in);
    const YAML::Node list = n[list_key];
    Where wl = w.child(list_key);
    VLM_CHECK(list.IsSequence() && list.size() > 0, wl.str(list), ": must be a non-empty list");
    const char* factor_key = weights ? "weight" : "repetitions";
    std::vector<double> factor;
    double sum = 0;
    for (size_t i = 0; i < list.size(); i++) {
      const YAML::Node f = list[i].IsMap() ? list[i][factor_key] : YAML::Node();
      factor.push_back(f ? non_negative_number(f, wl.item(i).child(factor_key)) : 1.0);
      sum += factor.back();
    }
    VLM_CHECK(!weights || sum > 0, wl.str(list), ": the blend weights sum to 0");
    ResolvedSplit out;
    out.mode = weights ? BlendMode::weights : BlendMode::repetitions;
    for (size_t i = 0; i < list.size(); i++) {
      ResolvedSplit inner = reference(list[i], wl.item(i), dir, here, factor_key);
      VLM_CHECK(inner.mode == BlendMode::none || inner.mode == out.mode, wl.item(i).str(list[i]),
                ": cannot mix blend and blend_epochized in one metadataset tree");
      for (MetadatasetLeaf& leaf : inner.leaves) {
        if (weights) {
          double w_in = inner.mode == BlendMode::none ? 1.0 : leaf.weight;
          leaf.weight = w_in * factor[i] / sum;
        } else {
          double r_in = inner.mode == BlendMode::none ? 1.0 : leaf.repetitions;
          leaf.repetitions = factor[i] * r_in;
        }
        out.leaves.push_back(std::move(leaf));
      }
    }
    return out;
  }

  // energon's SubsetRatioMixin._get_subset: this node's subset merged with the parent's.
  std::optional<DatasetSubset> subset_for(const YAML::Node& n, const Where& w,
                                          const Inherited& in) {
    std::optional<DatasetSubset> own;
    if (n["subset"]) own = parse_subset(n["subset"], w.child("subset"));
    if (in.subset) {
      VLM_CHECK(!in.subset->has_absolute(), w.str(n),
                ": an absolute subset range is only allowed on a reference to a dataset folder");
      return own ? merge_subset(*own, *in.subset) : in.subset;
    }
    return own;
  }

  // A dataset reference ({path, split_part, subflavors, subset, ...}); `extra` is the blend
  // factor key allowed beside it.
  ResolvedSplit reference(const YAML::Node& n, const Where& w, const fs::path& dir,
                          const Inherited& in, const std::string& extra) {
    std::set<std::string> allowed = {"path",
                                     "split_part",
                                     "subflavors",
                                     "subset",
                                     "dataset_config",
                                     "split_config",
                                     "shuffle_over_epochs_multiplier"};
    if (!extra.empty()) allowed.insert(extra);
    check_keys(n, w, allowed);
    VLM_CHECK(n["path"], w.str(n), ": missing 'path'");
    std::string rel = string_value(n["path"], w.child("path"));
    fs::path resolved = (dir / rel).lexically_normal();

    Inherited next;
    next.split = n["split_part"] ? string_value(n["split_part"], w.child("split_part")) : in.split;
    if (const YAML::Node sf = n["subflavors"]; sf && !sf.IsNull()) {
      VLM_CHECK(sf.IsMap(), w.child("subflavors").str(sf), ": must be a mapping");
      for (const auto& kv : sf) next.subflavors[kv.first.Scalar()] = yaml_text(kv.second);
    }
    for (const auto& [k, v] : in.subflavors) next.subflavors[k] = v; // outer overrides
    std::optional<int64_t> own_shuffle = 1;
    if (const YAML::Node s = n["shuffle_over_epochs_multiplier"]) {
      Scalar c = cast_scalar(s);
      VLM_CHECK(c.kind == Scalar::Kind::null || c.kind == Scalar::Kind::integer,
                w.child("shuffle_over_epochs_multiplier").str(s), ": must be an int or null");
      own_shuffle = c.kind == Scalar::Kind::null ? std::nullopt : std::optional<int64_t>(c.i);
    }
    next.shuffle = combine_shuffle(in.shuffle, own_shuffle);
    next.subset = subset_for(n, w, in);

    std::error_code ec;
    std::string where_from = " (referenced from " + w.file + ": " + w.key + ".path)";
    if (fs::is_regular_file(resolved, ec) && ends_with(resolved.string(), ".yaml")) {
      VLM_CHECK(!n["dataset_config"] && !n["split_config"], w.str(n),
                ": dataset_config / split_config cannot be set on a nested metadataset");
      VLM_CHECK(!next.subset || !next.subset->has_absolute(), w.child("subset").str(n["subset"]),
                ": an absolute subset range is only allowed on a reference to a dataset folder, "
                "not on the nested metadataset '",
                resolved.string(), "'");
      return load(resolved.string(), next, where_from);
    }
    VLM_CHECK(!ends_with(resolved.string(), ".jsonl"), w.child("path").str(n["path"]),
              ": JSONL datasets are not supported");
    VLM_CHECK(fs::exists(resolved, ec), w.child("path").str(n["path"]), ": '", resolved.string(),
              "' does not exist");
    VLM_CHECK(is_prepared_dataset(resolved), w.child("path").str(n["path"]), ": '",
              resolved.string(),
              "' is neither a prepared Energon dataset (no .nv-meta/.info.json or .info.yaml) "
              "nor a .yaml metadataset");
    MetadatasetLeaf leaf;
    leaf.path = resolved.string();
    leaf.split = next.split;
    leaf.subflavors = next.subflavors;
    if (next.subset) leaf.subset = *next.subset;
    leaf.shuffle_over_epochs = next.shuffle;
    if (n["dataset_config"])
      leaf.dataset_config = string_value(n["dataset_config"], w.child("dataset_config"));
    if (n["split_config"])
      leaf.split_config = string_value(n["split_config"], w.child("split_config"));
    leaf.source = w.file + ": " + w.key;
    ResolvedSplit out;
    out.leaves.push_back(std::move(leaf));
    return out;
  }
};

} // namespace

const char* blend_mode_name(BlendMode mode) {
  switch (mode) {
  case BlendMode::none: return "none";
  case BlendMode::weights: return "weights";
  case BlendMode::repetitions: return "repetitions";
  }
  return "unknown";
}

std::pair<int64_t, int64_t> DatasetSubset::apply(int64_t total, const std::string& what) const {
  // energon's DatasetSubset.compute_subset, including the order of the float operations.
  int64_t start = 0, end = total;
  std::string ctx = what.empty() ? std::string("subset") : what;
  if (abs_start) {
    start = *abs_start;
    end = abs_end ? *abs_end : total;
    VLM_CHECK(end <= total && start <= end && start >= 0, ctx, ": absolute subset [", start, ", ",
              end, ") does not fit a split of ", total, " samples");
  }
  int64_t previous = end - start;
  end = start + int64_t(double(previous) * rel_end);
  start += int64_t(double(previous) * rel_start);
  VLM_CHECK(end <= total && start <= end && start >= 0, ctx, ": relative subset [", rel_start, ", ",
            rel_end, "] gives [", start, ", ", end, ") outside a split of ", total, " samples");
  return {start, end};
}

std::map<std::string, std::string>
merge_subflavors(const std::map<std::string, std::string>& inner,
                 const std::map<std::string, std::string>& outer) {
  std::map<std::string, std::string> out = inner;
  for (const auto& [k, v] : outer) out[k] = v;
  return out;
}

ResolvedSplit resolve_metadataset(const std::string& path, const std::string& split) {
  std::error_code ec;
  VLM_CHECK(fs::exists(path, ec), "dataset path '", path, "' does not exist");
  if (fs::is_directory(path, ec)) {
    VLM_CHECK(is_prepared_dataset(path), "'", path,
              "' is not a prepared Energon dataset (no .nv-meta/.info.json or .info.yaml)");
    ResolvedSplit out;
    MetadatasetLeaf leaf;
    leaf.path = fs::path(path).lexically_normal().string();
    leaf.split = split;
    leaf.source = path;
    out.leaves.push_back(std::move(leaf));
    return out;
  }
  VLM_CHECK(ends_with(path, ".yaml"), "'", path,
            "' is neither a dataset folder nor a metadataset .yaml file");
  return Resolver().top(path, split);
}

} // namespace vlm::io
