#include "src/train/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <type_traits>
#include <variant>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "io/image/decode.h"
#include "io/loader/loader.h"
#include "model/model_spec.h"
#include "src/base/logging.h"
#include "src/core/device.h"
#include "src/train/config_keys.h"

namespace vlm::train {

namespace {

using namespace detail;

// "" or why `text` is not a device name (validation reports it against the key).
std::string device_error(const std::string& text) {
  try {
    parse_device(text);
    return "";
  } catch (const Error&) {
    return "must be cpu, cuda or cuda:N";
  }
}

std::string lower(std::string_view s) {
  std::string r(s);
  std::transform(r.begin(), r.end(), r.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return r;
}

// Reference spellings of our keys: the value converted, then set on the target key.
struct Alias {
  const char* section;
  const char* key;
  const char* target_section;
  const char* target;
  Kind kind; // of the alias's own value
  Value (*convert)(const Value&);
};
Value resume_from_bool(const Value& v) {
  return Value(std::string(std::get<bool>(v) ? "latest" : ""));
}
const Alias kAliases[] = {
    {"training", "bfloat16", "training", "param_dtype", Kind::boolean,
     [](const Value& v) { return Value(std::string(std::get<bool>(v) ? "bf16" : "f32")); }},
    {"training", "eps", "training", "adam_eps", Kind::floating, [](const Value& v) { return v; }},
    // The reference trainer's switch (in [training]; ours lived in [checkpoint]).
    {"training", "resume_checkpoint", "checkpoint", "resume", Kind::boolean, resume_from_bool},
    {"checkpoint", "resume_checkpoint", "checkpoint", "resume", Kind::boolean, resume_from_bool},
};

// Reference keys we accept and ignore (with one warning each); error_if_true: a boolean switch
// whose `true` would change what is trained, so ignoring it would be wrong.
struct Ignored {
  const char* section;
  const char* key;
  const char* why;
  bool error_if_true = false;
};
const Ignored kIgnored[] = {
    {"model", "model_impl", "vlmtrain has one (native) implementation of each model"},
    {"training", "compile", "there is no torch.compile; kernels are fused ahead of time"},
    {"training", "async_tp", "TP communication overlap is not a switch in vlmtrain"},
    {"training", "load_text_model", "transplanting a text LLM into a VLM is not supported yet",
     true},
    {"training", "text_model_dir", "only used by load_text_model, which is not supported yet"},
    {"training", "load_vision_model", "transplanting a SigLIP2 vision tower is not supported yet",
     true},
    {"training", "vision_model_dir", "only used by load_vision_model, which is not supported yet"},
    {"data", "batch_size",
     "rows are always packed (data.packing_buffer_size); rows per micro-step are "
     "training.micro_batch_rows"},
    {"data", "text_dataset", "text-only samples are recognised per sample"},
};
constexpr const char* kWandbWhy =
    "[wandb] is ignored: vlmtrain writes its metrics to logging.metrics_file (metrics.jsonl)";

const char* kind_name(Kind k) {
  switch (k) {
  case Kind::boolean: return "a boolean (true or false)";
  case Kind::integer: return "an integer";
  case Kind::floating: return "a number";
  case Kind::string: return "a string";
  case Kind::choice: return "a string";
  }
  return "?";
}

const char* node_type_name(const toml::node& n) {
  switch (n.type()) {
  case toml::node_type::string: return "string";
  case toml::node_type::integer: return "integer";
  case toml::node_type::floating_point: return "float";
  case toml::node_type::boolean: return "boolean";
  case toml::node_type::array: return "array";
  case toml::node_type::table: return "table";
  case toml::node_type::date: return "date";
  case toml::node_type::time: return "time";
  case toml::node_type::date_time: return "date-time";
  default: return "value";
  }
}

std::string node_text(const toml::node& n) {
  if (auto v = n.value_exact<std::string>()) return toml_string(*v);
  if (auto v = n.value_exact<int64_t>()) return std::to_string(*v);
  if (auto v = n.value_exact<double>()) return float_text(*v);
  if (auto v = n.value_exact<bool>()) return *v ? "true" : "false";
  std::ostringstream os;
  n.visit([&](auto&& x) { os << x; });
  std::string s = os.str();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// The node as a value of `kind`, or nullopt when its TOML type does not fit (ints fit floats).
std::optional<Value> node_value(const toml::node& n, Kind kind) {
  switch (kind) {
  case Kind::boolean:
    if (auto v = n.value_exact<bool>()) return Value(*v);
    break;
  case Kind::integer:
    if (auto v = n.value_exact<int64_t>()) return Value(*v);
    break;
  case Kind::floating:
    if (auto v = n.value_exact<double>()) return Value(*v);
    if (auto v = n.value_exact<int64_t>()) return Value(double(*v));
    break;
  case Kind::string:
  case Kind::choice:
    if (auto v = n.value_exact<std::string>()) return Value(*v);
    break;
  }
  return std::nullopt;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) b++;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) e--;
  return std::string(s.substr(b, e - b));
}

// A --set value (text) as a value of `kind`, or nullopt.
std::optional<Value> text_value(const std::string& t, Kind kind) {
  switch (kind) {
  case Kind::boolean: {
    const std::string l = lower(t);
    if (l == "true") return Value(true);
    if (l == "false") return Value(false);
    return std::nullopt;
  }
  case Kind::integer: {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec != std::errc() || p != t.data() + t.size() || t.empty()) return std::nullopt;
    return Value(v);
  }
  case Kind::floating: {
    double v = 0;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec != std::errc() || p != t.data() + t.size() || t.empty()) return std::nullopt;
    return Value(v);
  }
  case Kind::string:
  case Kind::choice:
    if (t.size() >= 2 && (t.front() == '"' || t.front() == '\'') && t.back() == t.front())
      return Value(t.substr(1, t.size() - 2));
    return Value(t);
  }
  return std::nullopt;
}

// --- suggestions -----------------------------------------------------------------------------

// Optimal string alignment distance: insertions, deletions, substitutions, adjacent swaps.
size_t edit_distance(std::string_view a, std::string_view b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; i++) d[i][0] = i;
  for (size_t j = 0; j <= m; j++) d[0][j] = j;
  for (size_t i = 1; i <= n; i++)
    for (size_t j = 1; j <= m; j++) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

// " (did you mean 'x.y'?)" for the closest valid key (our keys, the reference spellings and the
// ignored reference keys), also in other sections: the score is the distance of the full names or
// of the key names plus one for a different section, so a key in the wrong section scores 1.
// Empty when nothing is close.
std::string suggest_key(const std::vector<Field>& fields, const std::string& section,
                        const std::string& key) {
  std::vector<std::pair<std::string, std::string>> candidates; // (section, key)
  for (const Field& f : fields) candidates.emplace_back(f.section, f.key);
  for (const Alias& a : kAliases) candidates.emplace_back(a.section, a.key);
  for (const Ignored& ig : kIgnored) candidates.emplace_back(ig.section, ig.key);
  const std::string full = lower(section.empty() ? key : section + "." + key);
  const std::pair<std::string, std::string>* best = nullptr;
  size_t best_score = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    const size_t score =
        std::min(edit_distance(full, c.first + "." + c.second),
                 edit_distance(lower(key), c.second) + (c.first == section ? 0 : 1));
    if (score < best_score) best = &c, best_score = score;
  }
  const size_t limit = std::max<size_t>(2, key.size() / 3);
  if (!best || best_score > limit) return "";
  std::string s = " (did you mean '" + best->first + "." + best->second + "'?";
  if (best->first != section && lower(key) == best->second)
    s += " " + best->second + " belongs in [" + best->first + "]";
  return s + ")";
}

std::string suggest_section(const std::string& section) {
  const char* best = nullptr;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const char* s : kSections) {
    const size_t d = edit_distance(lower(section), s);
    if (d < best_d) best = s, best_d = d;
  }
  if (best && best_d <= std::max<size_t>(2, section.size() / 3))
    return std::string(" (did you mean [") + best + "]?)";
  std::string r = " (valid sections: ";
  for (const char* s : kSections) r += std::string(s) + ", ";
  return r + "wandb (ignored))";
}

// --- accumulation pattern --------------------------------------------------------------------

// "" and the pattern in *out, or what is wrong with tpi.
std::string accumulation_error(double tpi, std::vector<int>* out) {
  if (!std::isfinite(tpi) || tpi < 1 || tpi > kMaxAccumulationMultiplier)
    return "must be in [1, " + std::to_string(int64_t(kMaxAccumulationMultiplier)) + "]";
  for (int n = 1; n <= kMaxAccumulationPeriod; n++) {
    const double x = double(n) * tpi;
    const int64_t k = std::llround(x);
    if (std::fabs(x - double(k)) <= 1e-9 * std::max(std::fabs(x), double(k))) {
      if (out) {
        out->resize(size_t(n));
        for (int64_t i = 0; i < n; i++) (*out)[size_t(i)] = int((i + 1) * k / n - i * k / n);
      }
      return "";
    }
  }
  int best_n = 1;
  double best_err = std::numeric_limits<double>::max();
  for (int n = 1; n <= kMaxAccumulationPeriod; n++) {
    const double err = std::fabs(double(n) * tpi - std::round(double(n) * tpi)) / n;
    if (err < best_err) best_n = n, best_err = err;
  }
  const auto k = std::llround(double(best_n) * tpi);
  return "does not repeat within " + std::to_string(kMaxAccumulationPeriod) +
         " optimizer steps (it is no fraction K/n with n <= " +
         std::to_string(kMaxAccumulationPeriod) + "); the closest that does is " +
         float_text(double(k) / best_n) + " = " + std::to_string(k) + "/" + std::to_string(best_n);
}

// The entries of a table in the order they appear in the file (toml++ keeps them sorted by
// name), so that the first error reported is the first one in the file.
std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const toml::table& t) {
  std::vector<std::pair<const toml::key*, const toml::node*>> v;
  for (auto&& [k, node] : t) v.emplace_back(&k, &node);
  auto pos = [](const auto& e) {
    const auto& b = e.first->source().begin;
    return std::pair(b.line, b.column);
  };
  std::stable_sort(v.begin(), v.end(),
                   [&](const auto& a, const auto& b) { return pos(a) < pos(b); });
  return v;
}

// --- building a config from sources ----------------------------------------------------------

class Builder {
public:
  Builder(std::string source, std::vector<std::string>* warnings)
      : source_(std::move(source)), warnings_(warnings) {}

  TrainConfig config;
  std::vector<Field> fields = fields_of(config);
  std::map<std::string, std::string> origin; // full key -> "FILE: line N" or "--set"

  void apply_toml(std::string_view text) {
    toml::table root;
    try {
      root = toml::parse(text, source_);
    } catch (const toml::parse_error& e) {
      const auto& b = e.source().begin;
      throw Error("config " + source_ + ": line " + std::to_string(b.line) + ", column " +
                  std::to_string(b.column) +
                  ": TOML syntax error: " + std::string(e.description()));
    }
    assigned_.clear();
    for (auto [kp, np] : in_file_order(root)) {
      const toml::key& k = *kp;
      const toml::node& node = *np;
      const std::string section(k.str());
      const std::string where = at_line(k.source().begin.line);
      if (section == "wandb") {
        warn(where, kWandbWhy);
        continue;
      }
      const toml::table* tbl = node.as_table();
      if (!tbl) { // a key outside any section
        fail(where, "key '" + section + "' outside any section" + suggest_key(fields, "", section));
      }
      if (std::find(std::begin(kSections), std::end(kSections), section) == std::end(kSections))
        fail(where, "unknown section [" + section + "]" + suggest_section(section));
      for (auto [kkp, vp] : in_file_order(*tbl)) {
        const toml::key& kk = *kkp;
        const toml::node& value = *vp;
        const std::string key(kk.str());
        const auto line =
            kk.source().begin.line ? kk.source().begin.line : value.source().begin.line;
        assign(
            at_line(line), section, key,
            [&](Kind kind) -> std::optional<Value> { return node_value(value, kind); },
            [&] { return std::string(node_type_name(value)) + " " + node_text(value); });
      }
    }
  }

  void apply_override(const std::string& item) {
    const std::string where = "--set";
    const auto eq = item.find('=');
    if (eq == std::string::npos) fail(where, "'" + item + "' is not section.key=value");
    const std::string full = trim(std::string_view(item).substr(0, eq));
    const std::string text = trim(std::string_view(item).substr(eq + 1));
    const auto dot = full.find('.');
    if (dot == std::string::npos)
      fail(where, "'" + full + "' is not section.key" + suggest_key(fields, "", full));
    const std::string section = full.substr(0, dot), key = full.substr(dot + 1);
    if (section == "wandb") {
      warn(where, kWandbWhy);
      return;
    }
    if (std::find(std::begin(kSections), std::end(kSections), section) == std::end(kSections))
      fail(where, "unknown section [" + section + "] in '" + full + "'" + suggest_section(section));
    assigned_.clear();
    assign(
        where, section, key, [&](Kind kind) { return text_value(text, kind); },
        [&] { return "'" + text + "'"; });
  }

private:
  std::string source_;
  std::vector<std::string>* warnings_;
  // Keys set by the current source (alias conflicts): full target key -> "spelling = value".
  std::map<std::string, std::string> assigned_;

  std::string at_line(size_t line) const {
    return line ? source_ + ": line " + std::to_string(line) : source_;
  }
  [[noreturn]] void fail(const std::string& where, const std::string& msg) const {
    throw Error("config " + where + ": " + msg);
  }
  void warn(const std::string& where, const std::string& msg) {
    std::string w = "config " + where + ": " + msg;
    log_warn(w);
    if (warnings_) warnings_->push_back(std::move(w));
  }
  Field* find(const std::string& section, const std::string& key) {
    for (Field& f : fields)
      if (f.section == section && f.key == key) return &f;
    return nullptr;
  }

  // Sets section.key from a value source: get(kind) converts to the key's kind (nullopt on a type
  // mismatch), describe() shows the value given, for messages.
  void assign(const std::string& where, const std::string& section, const std::string& key,
              const std::function<std::optional<Value>(Kind)>& get,
              const std::function<std::string()>& describe) {
    const std::string full = section + "." + key;
    for (const Ignored& ig : kIgnored) {
      if (section != ig.section || key != ig.key) continue;
      const auto on = get(Kind::boolean);
      if (ig.error_if_true && on && std::get<bool>(*on))
        fail(where, full + " = true: " + ig.why + "; remove it or set it to false");
      warn(where, full + " is ignored: " + ig.why);
      return;
    }
    Field* f = find(section, key);
    Kind kind = f ? f->kind : Kind::string;
    const Alias* alias = nullptr;
    for (const Alias& a : kAliases)
      if (section == a.section && key == a.key) alias = &a;
    if (alias) {
      f = find(alias->target_section, alias->target);
      kind = alias->kind;
    }
    if (!f) fail(where, "unknown key '" + full + "'" + suggest_key(fields, section, key));
    std::optional<Value> v = get(kind);
    if (!v) fail(where, full + ": expected " + kind_name(kind) + ", got " + describe());
    const std::string given = full + " = " + value_text(*v);
    if (alias) v = alias->convert(*v);
    const Value before = f->get();
    const std::string err = f->set(*v);
    if (!err.empty()) fail(where, full + " = " + value_text(*v) + " " + err);
    const std::string target = f->full();
    auto it = assigned_.find(target);
    if (it != assigned_.end() && f->get() != before)
      fail(where, given + " contradicts " + it->second + "; set only one of them");
    assigned_[target] = given;
    origin[target] = where;
  }
};

// --- validation --------------------------------------------------------------------------------

class Validator {
public:
  Validator(const TrainConfig& c, std::string source,
            const std::map<std::string, std::string>* origin)
      : config_(c), fields_(fields_of(config_)), source_(std::move(source)), origin_(origin) {}

  // Throws "config WHERE: section.key = value RULE" unless ok.
  void check(bool ok, const std::string& full, const std::string& rule) const {
    if (ok) return;
    std::string where = source_, mark;
    if (origin_) {
      auto it = origin_->find(full);
      if (it != origin_->end())
        where = it->second;
      else
        mark = " (default)";
    }
    std::string value = "?";
    for (const Field& f : fields_)
      if (f.full() == full) value = value_text(f.get());
    throw Error("config " + where + ": " + full + " = " + value + mark + " " + rule);
  }

  void run() const {
    check_bounds();
    check_rules();
  }

private:
  // Every numeric key within its bounds (the key table), in table order.
  void check_bounds() const {
    for (const Field& f : fields_) {
      if (f.kind != Kind::integer && f.kind != Kind::floating) continue;
      const Value v = f.get();
      const double x = f.kind == Kind::integer ? double(std::get<int64_t>(v)) : std::get<double>(v);
      check(std::isfinite(x) && x >= f.bounds.min && x <= f.bounds.max, f.full(),
            "must be " + bounds_text(f));
    }
  }

  // The rules a key's bounds cannot say: exclusive bounds, names, and keys read together.
  void check_rules() const {
    const TrainConfig& c = config_;
    // [model]
    const auto& m = c.model;
    const std::vector<std::string> presets = model::preset_names();
    std::string valid;
    for (const std::string& p : presets) valid += (valid.empty() ? "" : ", ") + p;
    check(m.preset.empty() || std::find(presets.begin(), presets.end(), m.preset) != presets.end(),
          "model.preset", "is not a preset; valid: " + valid);
    check(!(m.preset.empty() && m.model_dir.empty()), "model.model_dir",
          "is empty: set model.model_dir (an HF snapshot folder) or model.preset");
    check(m.preset.empty() || m.model_dir.empty(), "model.model_dir",
          "and model.preset = " + toml_string(m.preset) + " are both set; set only one");
    check(m.train_llm || m.train_mlp || m.train_vit, "model.train_llm",
          "and train_mlp, train_vit are all false: nothing to train");
    // [training]
    const auto& t = c.training;
    check(t.warmup_steps <= t.total_steps, "training.warmup_steps",
          "must be <= training.total_steps = " + std::to_string(t.total_steps));
    if (t.scheduler_type == optim::ScheduleType::wsd) {
      const auto decay = int64_t(std::floor(t.wsd_decay_ratio * double(t.total_steps)));
      check(t.warmup_steps + decay <= t.total_steps, "training.wsd_decay_ratio",
            "gives " + std::to_string(decay) +
                " decay steps, which with warmup_steps = " + std::to_string(t.warmup_steps) +
                " exceed total_steps = " + std::to_string(t.total_steps));
    }
    check(t.adam_beta1 >= 0 && t.adam_beta1 < 1, "training.adam_beta1", "must be in [0, 1)");
    check(t.adam_beta2 >= 0 && t.adam_beta2 < 1, "training.adam_beta2", "must be in [0, 1)");
    check(std::isfinite(t.adam_eps) && t.adam_eps > 0, "training.adam_eps", "must be > 0");
    check(accumulation_error(t.tpi_multiplier, nullptr).empty(), "training.tpi_multiplier",
          accumulation_error(t.tpi_multiplier, nullptr));
    check(device_error(t.device).empty(), "training.device", device_error(t.device));
    check(t.param_dtype == DType::f32 || t.param_dtype == DType::bf16, "training.param_dtype",
          "must be bf16 or f32");
    check(t.grad_dtype == DType::f32 || t.grad_dtype == DType::bf16, "training.grad_dtype",
          "must be f32 or bf16");
    // [data]
    const auto& d = c.data;
    check(!d.data_path.empty(), "data.data_path", "is empty: set the dataset folder");
    check(!d.train_split.empty(), "data.train_split", "must not be empty");
    check(t.eval_steps == 0 || !d.val_split.empty(), "data.val_split",
          "must not be empty when training.eval_steps > 0");
    check(t.micro_batch_rows * d.seq_len <= std::numeric_limits<int32_t>::max(),
          "training.micro_batch_rows",
          "x data.seq_len = " + std::to_string(d.seq_len) +
              " tokens per micro-batch must be < 2^31 (cu_seqlens are int32)");
    check(d.max_pixels >= d.min_pixels, "data.max_pixels",
          "must be >= data.min_pixels = " + std::to_string(d.min_pixels));
    // [parallel]
    const auto& par = c.parallel;
    check(par.data_parallel == DataParallel::fsdp || par.dp_shard <= 1, "parallel.dp_shard",
          "must be 0 or 1 with parallel.data_parallel = \"ddp\" (ddp keeps the whole model on "
          "every rank; set data_parallel = \"fsdp\" to shard it)");
    check(!par.sequence_parallel || par.tp_size > 1, "parallel.sequence_parallel",
          "needs parallel.tp_size > 1 (it splits the tokens over the tensor-parallel ranks)");
    // [checkpoint]
    check(!c.checkpoint.output_dir.empty(), "checkpoint.output_dir", "must not be empty");
    check(c.checkpoint.resume.empty() || c.checkpoint.format == CheckpointFormat::hdf5,
          "checkpoint.resume",
          "needs checkpoint.format = \"hdf5\" (HF snapshots hold no optimizer or data state)");
    // [logging]
    check(!c.logging.metrics_file.empty(), "logging.metrics_file",
          "must not be empty (resolve_defaults sets output_dir/metrics.jsonl)");
  }

  TrainConfig config_; // a copy: fields_ refer to it
  std::vector<Field> fields_;
  std::string source_;
  const std::map<std::string, std::string>* origin_;
};

TrainConfig finish(Builder& b, std::string_view source_name) {
  resolve_defaults(b.config);
  Validator(b.config, std::string(source_name), &b.origin).run();
  return b.config;
}

} // namespace

TrainConfig parse_train_config(std::string_view toml_text, std::string_view source_name,
                               const std::vector<std::string>& overrides,
                               std::vector<std::string>* warnings) {
  Builder b{std::string(source_name), warnings};
  b.apply_toml(toml_text);
  for (const std::string& o : overrides) b.apply_override(o);
  return finish(b, source_name);
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides,
                              std::vector<std::string>* warnings) {
  // A directory opens as an empty stream on Linux: it would read as a config of defaults.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error("config " + path + ": is a directory, not a TOML file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("config " + path + ": cannot open the file");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error("config " + path + ": read error");
  return parse_train_config(text.str(), path, overrides, warnings);
}

std::string_view builtin_demo_config_toml() {
  static constexpr std::string_view text =
#include "src/train/demo_config_toml.inc"
      ;
  return text;
}

void resolve_defaults(TrainConfig& c) {
  if (c.model.tokenizer.empty()) c.model.tokenizer = c.model.model_dir;
  if (!c.model.preset.empty()) c.training.random_init = true;
  if (c.logging.metrics_file.empty() && !c.checkpoint.output_dir.empty())
    c.logging.metrics_file = c.checkpoint.output_dir + "/metrics.jsonl";
}

void validate_train_config(const TrainConfig& config, std::string_view source_name) {
  Validator(config, std::string(source_name), nullptr).run();
}

std::vector<int> accumulation_pattern(double tpi) {
  std::vector<int> pattern;
  const std::string err = accumulation_error(tpi, &pattern);
  if (!err.empty()) throw Error("training.tpi_multiplier = " + float_text(tpi) + " " + err);
  return pattern;
}

} // namespace vlm::train
