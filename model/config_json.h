// Readers for the fields of an HF config.json object, shared by every family's config parser.
// Each error names `where` (the file, or the file and the sub-object) and the key, and says what
// was expected; a key that is absent or null takes the fallback.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vlm::model {

// A present, non-null key.
bool has_key(const nlohmann::json& j, const char* key);

// An integer (a float with an integral value is accepted, as Python writes 1.0). Required.
int64_t json_int(const nlohmann::json& j, const char* key, const std::string& where);
int64_t json_int(const nlohmann::json& j, const char* key, const std::string& where,
                 int64_t fallback);
double json_double(const nlohmann::json& j, const char* key, const std::string& where,
                   double fallback);
bool json_bool(const nlohmann::json& j, const char* key, const std::string& where, bool fallback);
std::string json_string(const nlohmann::json& j, const char* key, const std::string& where,
                        const std::string& fallback);
// A list of integers (e.g. mrope_section); the fallback when absent.
std::vector<int64_t> json_int_list(const nlohmann::json& j, const char* key,
                                   const std::string& where, const std::vector<int64_t>& fallback);
// A sub-object (text_config, vision_config); an empty object when absent.
nlohmann::json json_object(const nlohmann::json& j, const char* key, const std::string& where);

// The RoPE type of a rope_parameters / rope_scaling object ("rope_type", legacy "type";
// "default" when neither is given).
std::string rope_type_of(const nlohmann::json& rope, const char* key, const std::string& where);

} // namespace vlm::model
