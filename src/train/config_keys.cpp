#include "src/train/config_keys.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <span>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "src/base/enum_names.h"

namespace vlm::train {

namespace detail {

namespace {

// --- enums: canonical names (first) and aliases --------------------------------------------------

std::span<const EnumName<AcMode>> enum_names(AcMode*) { return parallel::ac_mode_names(); }
std::span<const EnumName<NanPolicy>> enum_names(NanPolicy*) {
  static constexpr EnumName<NanPolicy> t[] = {{"abort", NanPolicy::abort},
                                              {"skip", NanPolicy::skip}};
  return t;
}
std::span<const EnumName<CheckpointFormat>> enum_names(CheckpointFormat*) {
  static constexpr EnumName<CheckpointFormat> t[] = {{"safetensors", CheckpointFormat::safetensors},
                                                     {"hdf5", CheckpointFormat::hdf5}};
  return t;
}
std::span<const EnumName<HfSnapshot>> enum_names(HfSnapshot*) {
  static constexpr EnumName<HfSnapshot> t[] = {{"final", HfSnapshot::final},
                                               {"every_save", HfSnapshot::every_save},
                                               {"never", HfSnapshot::never}};
  return t;
}
std::span<const EnumName<DataParallel>> enum_names(DataParallel*) {
  static constexpr EnumName<DataParallel> t[] = {{"ddp", DataParallel::ddp},
                                                 {"fsdp", DataParallel::fsdp}};
  return t;
}
std::span<const EnumName<GradReduce>> enum_names(GradReduce*) {
  static constexpr EnumName<GradReduce> t[] = {{"auto", GradReduce::automatic},
                                               {"every_micro_step", GradReduce::every_micro_step},
                                               {"last_micro_step", GradReduce::last_micro_step}};
  return t;
}
std::span<const EnumName<optim::ScheduleType>> enum_names(optim::ScheduleType*) {
  using S = optim::ScheduleType;
  static constexpr EnumName<S> t[] = {
      {"constant", S::constant}, {"linear", S::linear}, {"cosine", S::cosine}, {"wsd", S::wsd}};
  return t;
}
std::span<const EnumName<optim::WsdDecay>> enum_names(optim::WsdDecay*) {
  static constexpr EnumName<optim::WsdDecay> t[] = {{"linear", optim::WsdDecay::linear},
                                                    {"cosine", optim::WsdDecay::cosine}};
  return t;
}
std::span<const EnumName<io::OverlongPolicy>> enum_names(io::OverlongPolicy*) {
  static constexpr EnumName<io::OverlongPolicy> t[] = {{"truncate", io::OverlongPolicy::truncate},
                                                       {"drop", io::OverlongPolicy::drop}};
  return t;
}
std::span<const EnumName<DType>> enum_names(DType*) { return model_dtype_names(); }

template <class E> const char* name_of(E v) {
  return enum_name(enum_names(static_cast<E*>(nullptr)), v);
}

// A field holding a plain value of type V of TOML kind `kind`; doubles must be finite.
template <class V>
void bind_value(std::vector<Field>& out, const char* s, const char* k, V& v, KeyBounds bounds,
                const char* help, Kind kind) {
  out.push_back({s,
                 k,
                 help,
                 kind,
                 bounds,
                 {},
                 {},
                 [&v] { return Value(v); },
                 [&v](const Value& x) {
                   const V value = std::get<V>(x);
                   if constexpr (std::is_same_v<V, double>)
                     if (!std::isfinite(value)) return std::string("must be a finite number");
                   v = value;
                   return std::string();
                 }});
}
// The TOML kind of a plain member type.
template <class V> constexpr Kind kind_of() {
  if constexpr (std::is_same_v<V, bool>) return Kind::boolean;
  if constexpr (std::is_same_v<V, int64_t>) return Kind::integer;
  if constexpr (std::is_same_v<V, double>) return Kind::floating;
  return Kind::string;
}
template <class V>
requires std::is_same_v<V, bool> || std::is_same_v<V, int64_t> || std::is_same_v<V, double> ||
    std::is_same_v<V, std::string>
void bind(std::vector<Field>& out, const char* s, const char* k, V& v, KeyBounds b,
          const char* help) {
  bind_value(out, s, k, v, b, help, kind_of<V>());
}
template <class E>
void bind(std::vector<Field>& out, const char* s, const char* k, E& v, KeyBounds,
          const char* help) {
  Field f{s, k, help, Kind::choice, {}, {}, {}, {}, {}};
  for (const auto& e : enum_names(static_cast<E*>(nullptr))) {
    if (e.alias)
      f.aliases.emplace_back(e.name, name_of(e.value));
    else
      f.choices.emplace_back(e.name);
  }
  f.get = [&v] {
    const char* n = name_of(v);
    return Value(std::string(n ? n : "?"));
  };
  f.set = [&v, choices = f.choices, aliases = f.aliases](const Value& x) {
    if (const auto* e = find_enum(enum_names(static_cast<E*>(nullptr)), std::get<std::string>(x))) {
      v = e->value;
      return std::string();
    }
    std::string msg = "is not one of ";
    for (size_t i = 0; i < choices.size(); i++) msg += (i ? ", " : "") + choices[i];
    for (const auto& [alias, canonical] : aliases) msg += " (" + alias + " = " + canonical + ")";
    return msg;
  };
  out.push_back(std::move(f));
}

} // namespace

std::vector<Field> fields_of(TrainConfig& c) {
  std::vector<Field> out;
#define VLM_BIND(type, name, value, bounds, help)                                                  \
  bind(out, section, #name, obj->name, bounds, help);
#define VLM_BIND_SECTION(member, TABLE)                                                            \
  {                                                                                                \
    const char* section = #member;                                                                 \
    auto* obj = &c.member;                                                                         \
    TABLE(VLM_BIND)                                                                                \
  }
  VLM_BIND_SECTION(model, VLM_TRAIN_CONFIG_MODEL)
  VLM_BIND_SECTION(training, VLM_TRAIN_CONFIG_TRAINING)
  VLM_BIND_SECTION(data, VLM_TRAIN_CONFIG_DATA)
  VLM_BIND_SECTION(parallel, VLM_TRAIN_CONFIG_PARALLEL)
  VLM_BIND_SECTION(checkpoint, VLM_TRAIN_CONFIG_CHECKPOINT)
  VLM_BIND_SECTION(logging, VLM_TRAIN_CONFIG_LOGGING)
#undef VLM_BIND_SECTION
#undef VLM_BIND
  return out;
}

// --- values as text --------------------------------------------------------------------------

std::string toml_string(std::string_view s) {
  std::string r = "\"";
  for (unsigned char c : s) {
    switch (c) {
    case '"': r += "\\\""; break;
    case '\\': r += "\\\\"; break;
    case '\n': r += "\\n"; break;
    case '\t': r += "\\t"; break;
    case '\r': r += "\\r"; break;
    default:
      if (c < 0x20 || c == 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        r += buf;
      } else {
        r += char(c);
      }
    }
  }
  return r + "\"";
}

// Shortest text that reads back as the same double, always with a '.' or an exponent (TOML).
std::string float_text(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::general);
  std::string s(buf, end);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

// A bound as people write it: 0, 1, 0.5 (%g).
std::string float_text_short(double d) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", d);
  return b;
}

std::string value_text(const Value& v) {
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) return float_text(*d);
  return toml_string(std::get<std::string>(v));
}

std::string bounds_text(const Field& f) {
  auto num = [&](double x) {
    return f.kind == Kind::integer ? std::to_string(int64_t(x)) : float_text_short(x);
  };
  const KeyBounds& b = f.bounds;
  if (std::isinf(b.max)) return ">= " + num(b.min);
  return "in [" + num(b.min) + ", " + num(b.max) + "]";
}

std::string type_text(const Field& f) {
  const bool bounded = !std::isinf(f.bounds.min) || !std::isinf(f.bounds.max);
  switch (f.kind) {
  case Kind::boolean: return "bool";
  case Kind::integer: return bounded ? "int " + bounds_text(f) : "int";
  case Kind::floating: return bounded ? "float " + bounds_text(f) : "float";
  case Kind::string: return "string";
  case Kind::choice: {
    std::string s;
    for (size_t i = 0; i < f.choices.size(); i++) s += (i ? " | " : "") + f.choices[i];
    return s;
  }
  }
  return "?";
}

} // namespace detail

using namespace detail;

const char* nan_policy_name(NanPolicy p) { return name_of(p); }
const char* checkpoint_format_name(CheckpointFormat f) { return name_of(f); }
const char* hf_snapshot_name(HfSnapshot h) { return name_of(h); }
const char* data_parallel_name(DataParallel d) { return name_of(d); }
const char* grad_reduce_name(GradReduce g) { return name_of(g); }

std::string to_toml(const TrainConfig& config) {
  TrainConfig c = config;
  const std::vector<Field> fields = fields_of(c);
  std::string out = "# vlmtrain training config: every key (configs/README.md describes them)\n";
  std::string section;
  for (const Field& f : fields) {
    if (f.section != section) {
      section = f.section;
      out += "\n[" + section + "]\n";
    }
    out += "# " + f.help + "\n" + f.key + " = " + value_text(f.get()) + "\n";
  }
  return out;
}

nlohmann::json to_json(const TrainConfig& config) {
  TrainConfig c = config;
  nlohmann::json j = nlohmann::json::object();
  for (const Field& f : fields_of(c))
    std::visit([&](const auto& v) { j[f.section][f.key] = v; }, f.get());
  return j;
}

std::vector<ConfigKeyInfo> train_config_keys() {
  TrainConfig c;
  std::vector<ConfigKeyInfo> out;
  for (const Field& f : fields_of(c))
    out.push_back({f.section, f.key, type_text(f), value_text(f.get()), f.help});
  return out;
}

std::string train_config_keys_markdown() {
  auto cell = [](const std::string& s) {
    std::string r;
    for (char ch : s) r += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return r;
  };
  std::string out, section;
  for (const ConfigKeyInfo& k : train_config_keys()) {
    if (k.section != section) {
      section = k.section;
      out += (out.empty() ? "" : "\n") + std::string("### [") + section + "]\n\n" +
             "| key | type | default | meaning |\n|---|---|---|---|\n";
    }
    out += "| `" + k.key + "` | " + cell(k.type) + " | `" + cell(k.default_value) + "` | " +
           cell(k.help) + " |\n";
  }
  return out;
}

} // namespace vlm::train
