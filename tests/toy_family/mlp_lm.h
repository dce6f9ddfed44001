// A toy model family for tests: proof that a family plugs into the whole system — `vlmtrain
// train`, `export`, `dump`, activation checkpointing — as one folder plus one registry line
// (model::register_model_spec(toy::mlp_lm_spec()), the line model/registry.cpp holds for the
// built-in families). Header-only so the test binaries of any folder can use it.
//
// "toy_mlp_lm": embeddings -> num_blocks x (x + down(silu(up(norm(x))))) -> norm -> head. No
// attention: each token predicts the next from itself alone (a bigram model), which the demo data
// is enough to learn. config.json: {"model_type": "toy_mlp_lm", "vocab_size", "hidden_size",
// "intermediate_size", "num_blocks", "tie_word_embeddings"}.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/causal_lm.h"
#include "model/model_spec.h"
#include "src/core/ops/activation.h"
#include "src/core/ops/elementwise.h"
#include "src/nn/embedding.h"
#include "src/nn/linear.h"
#include "src/nn/rms_norm.h"

namespace vlm::testing::toy {

struct MlpLmConfig {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_blocks = 1;
  bool tie_word_embeddings = false;

  static MlpLmConfig from_json(const nlohmann::json& j, const std::string& where) {
    MlpLmConfig c;
    auto get = [&](const char* key) {
      VLM_CHECK(j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() > 0, where,
                ": toy_mlp_lm needs a positive integer '", key, "'");
      return j[key].get<int64_t>();
    };
    c.vocab_size = get("vocab_size");
    c.hidden_size = get("hidden_size");
    c.intermediate_size = get("intermediate_size");
    c.num_blocks = get("num_blocks");
    c.tie_word_embeddings = j.value("tie_word_embeddings", false);
    return c;
  }
  nlohmann::json to_json() const {
    return {{"model_type", "toy_mlp_lm"}, {"vocab_size", vocab_size},
            {"hidden_size", hidden_size}, {"intermediate_size", intermediate_size},
            {"num_blocks", num_blocks},   {"tie_word_embeddings", tie_word_embeddings}};
  }
};

class MlpBlock : public nn::Module {
public:
  MlpBlock(const MlpLmConfig& c, DType dtype) {
    nn::LinearOptions lin;
    lin.dtype = dtype;
    nn::RMSNormOptions norm;
    norm.dtype = dtype;
    norm_ = register_module("norm", std::make_shared<nn::RMSNorm>(c.hidden_size, norm));
    auto& mlp = *register_module("mlp", std::make_shared<nn::Module>());
    up_ = mlp.register_module(
        "up_proj", std::make_shared<nn::Linear>(c.hidden_size, c.intermediate_size, lin));
    down_ = mlp.register_module(
        "down_proj", std::make_shared<nn::Linear>(c.intermediate_size, c.hidden_size, lin));
  }
  std::string type_name() const override { return "MlpBlock"; }
  Tensor forward(const Tensor& x) const {
    return add(x, down_->forward(silu(up_->forward(norm_->forward(x)))));
  }

private:
  std::shared_ptr<nn::RMSNorm> norm_;
  std::shared_ptr<nn::Linear> up_, down_;
};

class MlpLm : public model::CausalLM {
public:
  MlpLm(const MlpLmConfig& c, DType dtype) : config_(c), dtype_(dtype) {
    auto& m = *register_module("model", std::make_shared<nn::Module>());
    embed_ = m.register_module("embed_tokens",
                               std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size,
                                                               nn::Init::normal(0.02), dtype));
    layers_ = m.register_module("layers", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < c.num_blocks; i++)
      layers_->append(std::make_shared<MlpBlock>(c, dtype));
    nn::RMSNormOptions norm;
    norm.dtype = dtype;
    norm_ = m.register_module("norm", std::make_shared<nn::RMSNorm>(c.hidden_size, norm));
    if (!c.tie_word_embeddings) {
      nn::LinearOptions lin;
      lin.dtype = dtype;
      head_ = register_module("lm_head",
                              std::make_shared<nn::Linear>(c.hidden_size, c.vocab_size, lin));
    }
  }
  std::string type_name() const override { return "MlpLm"; }

  std::string model_type() const override { return "toy_mlp_lm"; }
  DType param_dtype() const override { return dtype_; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  Tensor hidden_states(const model::Batch& b) const override {
    Tensor x = embed_->forward(b.input_ids);
    for (nn::Module* block : blocks()) {
      const auto& mlp = static_cast<const MlpBlock&>(*block);
      x = mlp.call(
          [&mlp](const std::vector<Tensor>& in) { return std::vector{mlp.forward(in[0])}; },
          {x})[0];
    }
    return norm_->forward(x);
  }
  const Tensor& head_weight() const override { return head_ ? head_->weight() : embed_->weight(); }
  std::vector<nn::Module*> blocks() const override {
    std::vector<nn::Module*> out;
    for (size_t i = 0; i < layers_->size(); i++) out.push_back(&(*layers_)[i]);
    return out;
  }
  model::ParamRole param_role(const std::string& name) const override {
    return {model::ParamGroup::llm, model::param_kind_by_name(name)};
  }
  nlohmann::json hf_config() const override { return config_.to_json(); }
  model::TrainingFlops training_flops(const std::vector<int32_t>& cu_seqlens, int64_t num_real_docs,
                                      const std::vector<std::array<int64_t, 3>>&) const override {
    model::TrainingFlops f;
    for (int64_t len : model::document_lengths(cu_seqlens, num_real_docs, "toy_mlp_lm"))
      f.tokens += len;
    const int64_t matmul =
        2 * config_.num_blocks * config_.hidden_size * config_.intermediate_size +
        config_.hidden_size * config_.vocab_size;
    f.linear = 6.0 * double(matmul) * double(f.tokens);
    return f;
  }
  std::string summary() const override {
    return "ToyMlpLm(H=" + std::to_string(config_.hidden_size) +
           ", blocks=" + std::to_string(config_.num_blocks) +
           ", vocab=" + std::to_string(config_.vocab_size) + ")";
  }

private:
  MlpLmConfig config_;
  DType dtype_;
  std::shared_ptr<nn::Embedding> embed_;
  std::shared_ptr<nn::ModuleList> layers_;
  std::shared_ptr<nn::RMSNorm> norm_;
  std::shared_ptr<nn::Linear> head_;
};

// The family's registry entry: model_type "toy_mlp_lm", preset "toy-tiny".
inline model::ModelSpec mlp_lm_spec() {
  model::ModelSpec s;
  s.model_type = "toy_mlp_lm";
  s.description = "test family: a one-block MLP language model";
  s.build = [](const nlohmann::json& j, const std::string& where, DType dtype) {
    return std::make_shared<MlpLm>(MlpLmConfig::from_json(j, where), dtype);
  };
  s.presets["toy-tiny"] = [](const model::PresetOptions& o) {
    MlpLmConfig c{std::max<int64_t>(64, o.min_vocab_size), 32, 64, 1, false};
    return c.to_json();
  };
  return s;
}

// Registers the family once per process (tests of one binary may each ask for it).
inline void register_mlp_lm() {
  static const bool registered = [] {
    model::register_model_spec(mlp_lm_spec());
    return true;
  }();
  (void)registered;
}

} // namespace vlm::testing::toy
