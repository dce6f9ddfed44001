#include "model/config_json.h"

#include <cmath>

#include "src/base/check.h"

namespace vlm::model {

using nlohmann::json;

bool has_key(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

namespace {

bool is_integral(const json& v) {
  return v.is_number_integer() ||
         (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
          std::fabs(v.get<double>()) < 9e18);
}

int64_t as_int(const json& v) {
  return v.is_number_integer() ? v.get<int64_t>() : int64_t(v.get<double>());
}

} // namespace

int64_t json_int(const json& j, const char* key, const std::string& where) {
  VLM_CHECK(has_key(j, key), where, ": missing required key '", key, "'");
  const json& v = j[key];
  VLM_CHECK(is_integral(v), where, ": key '", key, "' must be an integer, got ", v.dump());
  return as_int(v);
}

int64_t json_int(const json& j, const char* key, const std::string& where, int64_t fallback) {
  return has_key(j, key) ? json_int(j, key, where) : fallback;
}

double json_double(const json& j, const char* key, const std::string& where, double fallback) {
  if (!has_key(j, key)) return fallback;
  VLM_CHECK(j[key].is_number(), where, ": key '", key, "' must be a number, got ", j[key].dump());
  return j[key].get<double>();
}

bool json_bool(const json& j, const char* key, const std::string& where, bool fallback) {
  if (!has_key(j, key)) return fallback;
  VLM_CHECK(j[key].is_boolean(), where, ": key '", key, "' must be true or false, got ",
            j[key].dump());
  return j[key].get<bool>();
}

std::string json_string(const json& j, const char* key, const std::string& where,
                        const std::string& fallback) {
  if (!has_key(j, key)) return fallback;
  VLM_CHECK(j[key].is_string(), where, ": key '", key, "' must be a string, got ", j[key].dump());
  return j[key].get<std::string>();
}

std::vector<int64_t> json_int_list(const json& j, const char* key, const std::string& where,
                                   const std::vector<int64_t>& fallback) {
  if (!has_key(j, key)) return fallback;
  const json& v = j[key];
  VLM_CHECK(v.is_array(), where, ": key '", key, "' must be a list of integers, got ", v.dump());
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); i++) {
    VLM_CHECK(is_integral(v[i]), where, ": key '", key, "' entry ", i, " must be an integer, got ",
              v[i].dump());
    out.push_back(as_int(v[i]));
  }
  return out;
}

json json_object(const json& j, const char* key, const std::string& where) {
  if (!has_key(j, key)) return json::object();
  VLM_CHECK(j[key].is_object(), where, ": key '", key, "' must be an object, got ",
            j[key].type_name());
  return j[key];
}

std::string rope_type_of(const json& r, const char* key, const std::string& where) {
  VLM_CHECK(r.is_object(), where, ": key '", key, "' must be an object or null, got ", r.dump());
  if (has_key(r, "rope_type")) return json_string(r, "rope_type", where + " (" + key + ")", "");
  if (has_key(r, "type")) return json_string(r, "type", where + " (" + key + ")", "");
  return "default";
}

} // namespace vlm::model
