#include "model/text/text_config.h"

#include <cmath>
#include <sstream>

#include "model/config_json.h"
#include "src/base/check.h"

namespace vlm::model {

namespace {

using nlohmann::json;

// Bounds of the sizes a config.json may declare (far above any released Qwen: vocab 248320,
// hidden 5120, intermediate 25600, 64 layers).
constexpr int64_t kMaxDimension = int64_t(1) << 24;
constexpr int64_t kMaxLayers = 4096;

} // namespace

void TextConfig::read_text_json(const json& t, const std::string& where,
                                const TextDefaults& defaults) {
  vocab_size = defaults.vocab_size > 0 ? json_int(t, "vocab_size", where, defaults.vocab_size)
                                       : json_int(t, "vocab_size", where);
  hidden_size = json_int(t, "hidden_size", where);
  intermediate_size = json_int(t, "intermediate_size", where);
  num_hidden_layers = json_int(t, "num_hidden_layers", where);
  num_attention_heads = json_int(t, "num_attention_heads", where);
  num_key_value_heads = json_int(t, "num_key_value_heads", where, num_attention_heads);
  head_dim = json_int(t, "head_dim", where, defaults.head_dim);
  rms_norm_eps = json_double(t, "rms_norm_eps", where, 1e-6);
  tie_word_embeddings = json_bool(t, "tie_word_embeddings", where, false);
  attention_bias = json_bool(t, "attention_bias", where, false);
  initializer_range = json_double(t, "initializer_range", where, 0.02);
  max_position_embeddings =
      json_int(t, "max_position_embeddings", where, defaults.max_position_embeddings);
  // transformers 5 writes "dtype", 4.x "torch_dtype".
  torch_dtype = json_string(t, "dtype", where, json_string(t, "torch_dtype", where, "bfloat16"));
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (has_key(t, key)) token_ids[key] = t[key];
  const std::string act = json_string(t, "hidden_act", where, "silu");
  VLM_CHECK(act == "silu", where, ": key 'hidden_act' is '", act,
            "'; the text MLP is SwiGLU (\"silu\"), nothing else is implemented");
}

void TextConfig::write_text_json(json& t) const {
  t["vocab_size"] = vocab_size;
  t["hidden_size"] = hidden_size;
  t["intermediate_size"] = intermediate_size;
  t["num_hidden_layers"] = num_hidden_layers;
  t["num_attention_heads"] = num_attention_heads;
  t["num_key_value_heads"] = num_key_value_heads;
  t["head_dim"] = head_dim;
  t["hidden_act"] = "silu";
  t["rms_norm_eps"] = rms_norm_eps;
  t["tie_word_embeddings"] = tie_word_embeddings;
  t["attention_bias"] = attention_bias;
  t["attention_dropout"] = 0.0;
  t["initializer_range"] = initializer_range;
  t["max_position_embeddings"] = max_position_embeddings;
  t["use_cache"] = true;
  t["dtype"] = torch_dtype;
  for (const auto& [k, v] : token_ids.items()) t[k] = v;
}

void TextConfig::validate_text(const std::string& who) const {
  // Sizes index int32 kernels and size allocations: each has a stated bound (the product is
  // checked against the machine's memory when the parameters are allocated).
  auto positive = [&](const char* name, int64_t v) {
    VLM_CHECK(v > 0 && v <= kMaxDimension, who, ": ", name, " must be in [1, ", kMaxDimension,
              "], got ", v);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("head_dim", head_dim);
  positive("max_position_embeddings", max_position_embeddings);
  VLM_CHECK(num_hidden_layers <= kMaxLayers, who, ": num_hidden_layers must be <= ", kMaxLayers,
            ", got ", num_hidden_layers);
  VLM_CHECK(num_attention_heads * head_dim <= kMaxDimension, who,
            ": num_attention_heads x head_dim must be <= ", kMaxDimension, ", got ",
            num_attention_heads, " x ", head_dim);
  VLM_CHECK(num_attention_heads % num_key_value_heads == 0, who, ": num_attention_heads (",
            num_attention_heads, ") must be a multiple of num_key_value_heads (",
            num_key_value_heads, ")");
  VLM_CHECK(head_dim % 2 == 0, who, ": head_dim must be even for RoPE, got ", head_dim);
  VLM_CHECK(rms_norm_eps > 0 && std::isfinite(rms_norm_eps), who,
            ": rms_norm_eps must be > 0, got ", rms_norm_eps);
  VLM_CHECK(rope_theta > 0 && std::isfinite(rope_theta), who, ": rope_theta must be > 0, got ",
            rope_theta);
  VLM_CHECK(initializer_range >= 0 && std::isfinite(initializer_range), who,
            ": initializer_range must be >= 0, got ", initializer_range);
  VLM_CHECK(token_ids.is_object(), who, ": token_ids must be a JSON object");
}

DecoderLayerConfig TextConfig::decoder_layer() const {
  return {hidden_size, intermediate_size, num_attention_heads, num_key_value_heads,
          head_dim,    rms_norm_eps,      attention_bias,      initializer_range};
}

int64_t TextConfig::decoder_layer_parameters() const {
  const int64_t H = hidden_size, D = head_dim, q = num_attention_heads * D,
                kv = num_key_value_heads * D;
  int64_t attn = H * q + 2 * H * kv + q * H + 2 * D;
  if (attention_bias) attn += q + 2 * kv + H;
  return attn + mlp_matmul_params() + 2 * H;
}

int64_t TextConfig::embedding_parameters() const {
  return vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2) + hidden_size;
}

std::string TextConfig::text_summary() const {
  std::ostringstream os;
  os << "H=" << hidden_size << ", L=" << num_hidden_layers << ", Hq=" << num_attention_heads
     << ", Hkv=" << num_key_value_heads << ", D=" << head_dim << ", I=" << intermediate_size
     << ", vocab=" << vocab_size << (tie_word_embeddings ? ", tied" : ", untied")
     << (attention_bias ? ", attention bias" : "");
  return os.str();
}

void TextConfig::set_tiny_sizes() {
  vocab_size = 512;
  hidden_size = 64;
  intermediate_size = 128;
  num_attention_heads = 4;
  num_key_value_heads = 2;
  rms_norm_eps = 1e-6;
  max_position_embeddings = 4096;
  torch_dtype = "float32";
}

} // namespace vlm::model
