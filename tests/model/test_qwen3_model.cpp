// Qwen3ForCausalLM beyond the golden files: parameter names and counts, HF initialisation, the
// label shift, packed == separate documents, loss reductions, activation checkpointing (full and
// selective bit-identical to off), finite differences of the whole model in f64, parameter kinds.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "io/packing.h"
#include "model/hf_weights.h"
#include "model/qwen3.h"
#include "src/core/ops.h"
#include "tests/golden/golden.h"

using namespace vlm;
using namespace vlm::model;
using vlm::testing::rel_error;

namespace {

std::string snapshot(const std::string& variant) {
  return std::string(VLM_SOURCE_DIR) + "/tests/data/qwen3_tiny_" + variant;
}

// Random token ids, HF-aligned labels (-100 on each document's first token and a few more) and
// per-document positions for the given document lengths.
TextBatch random_batch(const std::vector<int64_t>& lengths, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> ids, labels, pos;
  std::vector<int32_t> cu{0};
  for (int64_t len : lengths) {
    for (int64_t t = 0; t < len; t++) {
      ids.push_back(rng.randint(0, vocab));
      labels.push_back(t == 0 || rng.randint(0, 5) == 0 ? -100 : ids.back());
      pos.push_back(t);
    }
    cu.push_back(cu.back() + int32_t(len));
  }
  const int64_t T = int64_t(ids.size());
  return text_batch_from_labels(Tensor::from_vector(ids, {T}), Tensor::from_vector(labels, {T}),
                                Tensor::from_vector(pos, {T}),
                                Tensor::from_vector(cu, {int64_t(cu.size())}));
}

// Tokens [begin, end) of a batch as a batch of its own (one document).
TextBatch sub_batch(const TextBatch& b, int64_t begin, int64_t end) {
  TextBatch s;
  s.input_ids = slice(b.input_ids, 0, begin, end).contiguous();
  s.targets = slice(b.targets, 0, begin, end).contiguous();
  s.position_ids = slice(b.position_ids, 0, begin, end).contiguous();
  s.cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, int32_t(end - begin)}, {2});
  return s;
}

struct LossAndGrads {
  double loss = 0;
  std::vector<std::vector<double>> grads;
};

LossAndGrads loss_and_grads(Qwen3ForCausalLM& m, const TextBatch& b, ActivationCheckpointing ac) {
  m.zero_grad();
  ForwardOptions o;
  o.ac = ac;
  Tensor loss = m.loss(b, o);
  loss.backward();
  LossAndGrads r;
  r.loss = loss.item();
  for (const auto& p : m.named_parameters()) r.grads.push_back(p.tensor.grad().to_doubles());
  return r;
}

} // namespace

TEST_CASE("qwen3 model: HF parameter names, shapes and counts, untied and tied") {
  for (bool tie : {false, true}) {
    Qwen3Config c = tiny_qwen3_config(tie);
    Qwen3ForCausalLM m(c);
    Rng rng(1);
    m.init_weights(rng);
    std::vector<std::string> expected = {"model.embed_tokens.weight"};
    for (int i = 0; i < 2; i++) {
      std::string l = "model.layers." + std::to_string(i) + ".";
      for (const char* n :
           {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
            "input_layernorm.weight", "post_attention_layernorm.weight"})
        expected.push_back(l + n);
    }
    expected.push_back("model.norm.weight");
    if (!tie) expected.push_back("lm_head.weight");
    std::vector<std::string> names;
    for (const auto& p : m.named_parameters()) names.push_back(p.name);
    CHECK(names == expected);
    CHECK(m.find_parameter("model.layers.1.self_attn.q_proj.weight").shape() == Shape{128, 64});
    CHECK(m.find_parameter("model.layers.1.self_attn.o_proj.weight").shape() == Shape{64, 128});
    CHECK(m.find_parameter("model.layers.0.self_attn.k_norm.weight").shape() == Shape{32});
    CHECK(m.num_parameters() == c.num_parameters());
    CHECK(m.lm_head_weight().same(tie ? m.find_parameter("model.embed_tokens.weight")
                                      : m.find_parameter("lm_head.weight")));
  }
  // attention_bias adds q/k/v/o biases.
  Qwen3Config c = tiny_qwen3_config();
  c.attention_bias = true;
  Qwen3ForCausalLM m(c);
  m.materialize();
  CHECK(m.find_parameter("model.layers.0.self_attn.o_proj.bias").shape() == Shape{64});
  CHECK(m.find_parameter("model.layers.0.self_attn.k_proj.bias").shape() == Shape{64});
  CHECK(m.num_parameters() == c.num_parameters());
}

TEST_CASE("qwen3 model: HF initialisation (normal(0, initializer_range), norms 1, biases 0)") {
  Qwen3Config c = tiny_qwen3_config();
  c.attention_bias = true;
  c.initializer_range = 0.05;
  Qwen3ForCausalLM m(c), m2(c);
  Rng rng(7), rng2(7);
  m.init_weights(rng);
  m2.init_weights(rng2);
  for (const auto& p : m.named_parameters()) {
    INFO(p.name);
    auto v = p.tensor.to_doubles();
    CHECK(v == m2.find_parameter(p.name).to_doubles()); // same seed, same values
    double sum = 0, sq = 0;
    for (double x : v) sum += x, sq += x * x;
    const double mean = sum / double(v.size()),
                 std = std::sqrt(sq / double(v.size()) - mean * mean);
    switch (qwen3_param_kind(p.name)) {
    case ParamKind::norm: CHECK((mean == 1.0 && std == 0.0)); break;
    case ParamKind::bias: CHECK((mean == 0.0 && std == 0.0)); break;
    default: CHECK(std::abs(mean) < 0.01); CHECK(std == Approx(0.05).epsilon(0.05));
    }
  }
}

TEST_CASE("qwen3 model: labels to next-token targets as io::next_token_targets") {
  std::vector<int32_t> labels = {-100, 5, 6, -100, -100, 9, 10, 11};
  std::vector<int64_t> ids = {4, 5, 6, 7, 8, 9, 10, 11};
  std::vector<int64_t> pos = {0, 1, 2, 0, 1, 2, 3, 4};
  TextBatch b = text_batch_from_labels(
      Tensor::from_vector(ids, {1, 8}), Tensor::from_vector(labels, {1, 8}),
      Tensor::from_vector(pos, {1, 8}), Tensor::from_vector(std::vector<int64_t>{0, 3, 8}, {3}));
  auto expected = io::next_token_targets(labels);
  auto got = b.targets.to_doubles();
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); i++) CHECK(got[i] == double(expected[i]));
  CHECK(b.input_ids.shape() == Shape{8});
  CHECK(b.input_ids.dtype() == DType::i64);
  CHECK(b.cu_seqlens.dtype() == DType::i32);
  CHECK(count_targets(b) == 5);
  CHECK_THROWS_WITH(text_batch_from_labels(Tensor::from_vector(ids, {8}),
                                           Tensor::from_vector(labels, {1, 8}),
                                           Tensor::from_vector(pos, {2, 4}),
                                           Tensor::from_vector(std::vector<int32_t>{0, 8}, {2})),
                    Catch::Contains("position_ids"));
}

TEST_CASE("qwen3 model: a packed row equals its documents run separately") {
  for (const char* variant : {"untied", "tied"}) {
    INFO(variant);
    Qwen3Config c = Qwen3Config::load(snapshot(variant));
    Qwen3ForCausalLM m(c);
    load_hf_weights(m, snapshot(variant));
    const std::vector<int64_t> lengths = {5, 65, 63, 1};
    TextBatch packed = random_batch(lengths, c.vocab_size, 3);
    NoGradGuard no_grad;
    double sum = m.loss_sum(packed).item(), separate_sum = 0;
    int64_t begin = 0;
    for (int64_t len : lengths) {
      TextBatch doc = sub_batch(packed, begin, begin + len);
      Tensor logits = m.logits(doc);
      Tensor expected = slice(m.logits(packed), 0, begin, begin + len).contiguous();
      CHECK(rel_error(logits, expected) <= 1e-6);
      separate_sum += m.loss_sum(doc).item();
      begin += len;
    }
    CHECK(sum == Approx(separate_sum).epsilon(1e-6));
    const int64_t n = count_targets(packed);
    CHECK(m.loss(packed).item() == Approx(sum / double(n)).epsilon(1e-6));
  }
}

TEST_CASE("qwen3 model: loss reductions; nothing to predict gives 0 and zero gradients") {
  Qwen3Config c = tiny_qwen3_config(true);
  Qwen3ForCausalLM m(c);
  Rng rng(3);
  m.init_weights(rng);
  TextBatch b = random_batch({9, 4}, c.vocab_size, 5);
  std::vector<int64_t> none(13, -100);
  b.targets = Tensor::from_vector(none, {13});
  Tensor loss = m.loss(b);
  CHECK(loss.item() == 0.0);
  loss.backward();
  for (const auto& p : m.named_parameters()) {
    INFO(p.name);
    for (double g : p.tensor.grad().to_doubles()) REQUIRE(g == 0.0);
  }
  CHECK(m.loss_sum(b).item() == 0.0);
  // The output dtypes: logits and loss in f32 for a bf16 model.
  Qwen3ForCausalLM mb(c, DType::bf16);
  Rng rng2(3);
  mb.init_weights(rng2);
  TextBatch b2 = random_batch({9, 4}, c.vocab_size, 5);
  CausalLMOutput out = mb.forward(b2);
  CHECK(out.logits.dtype() == DType::f32);
  CHECK(out.logits.shape() == Shape{13, 512});
  CHECK(out.loss.dtype() == DType::f32);
  CHECK(out.num_targets == count_targets(b2));
}

TEST_CASE("qwen3 model: activation checkpointing full and selective are bit-identical to off") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool tie : {false, true}) {
      for (bool bias : {false, true}) {
        INFO(dtype_name(dtype) << (tie ? " tied" : " untied") << (bias ? " with bias" : ""));
        Qwen3Config c = tiny_qwen3_config(tie);
        c.attention_bias = bias;
        Qwen3ForCausalLM m(c, dtype);
        Rng rng(11);
        m.init_weights(rng);
        if (bias) { // non-zero biases, so their use is checked too
          NoGradGuard no_grad;
          for (auto& p : m.named_parameters())
            if (qwen3_param_kind(p.name) == ParamKind::bias)
              copy_(p.tensor, Tensor::randn(p.tensor.shape(), rng, dtype, 0.1));
        }
        TextBatch b = random_batch({20, 17, 3}, c.vocab_size, 9);
        LossAndGrads off = loss_and_grads(m, b, ActivationCheckpointing::off);
        for (auto ac : {ActivationCheckpointing::full, ActivationCheckpointing::selective}) {
          INFO(activation_checkpointing_name(ac));
          LossAndGrads r = loss_and_grads(m, b, ac);
          CHECK(r.loss == off.loss);
          REQUIRE(r.grads.size() == off.grads.size());
          for (size_t i = 0; i < r.grads.size(); i++) CHECK(r.grads[i] == off.grads[i]);
        }
      }
    }
  }
  CHECK(parse_activation_checkpointing("sac") == ActivationCheckpointing::selective);
  CHECK_THROWS_WITH(parse_activation_checkpointing("some"), Catch::Contains("selective"));
}

TEST_CASE("qwen3 model: activation checkpointing keeps less memory between forward and backward") {
  // Bytes that the autograd graph holds after the forward (activations saved for backward):
  // full keeps only each layer's input, selective also the projection outputs, off everything.
  Qwen3Config c = tiny_qwen3_config();
  c.num_hidden_layers = 4;
  Qwen3ForCausalLM m(c);
  Rng rng(1);
  m.init_weights(rng);
  TextBatch b = random_batch({200, 56}, c.vocab_size, 2);
  auto held = [&](ActivationCheckpointing ac) {
    Allocator& alloc = allocator_for(Device::cpu());
    const size_t before = alloc.stats().current_bytes;
    ForwardOptions o;
    o.ac = ac;
    Tensor loss = m.loss(b, o);
    const size_t after = alloc.stats().current_bytes;
    loss.backward();
    m.zero_grad();
    return double(after - before);
  };
  const double off = held(ActivationCheckpointing::off), full = held(ActivationCheckpointing::full),
               sel = held(ActivationCheckpointing::selective);
  std::printf("bytes held after forward: off %.0f, selective %.0f, full %.0f\n", off, sel, full);
  CHECK(full < sel);
  CHECK(sel < off);
}

TEST_CASE("qwen3 model: finite differences of the whole model in f64") {
  // The golden weights in f64, a packed batch of two documents; the analytic gradient of the
  // mean loss vs central differences on a few elements of every parameter.
  for (const char* variant : {"untied", "tied"}) {
    INFO(variant);
    Qwen3Config c = Qwen3Config::load(snapshot(variant));
    Qwen3ForCausalLM m(c, DType::f64);
    load_hf_weights(m, snapshot(variant));
    TextBatch b = random_batch({7, 6}, c.vocab_size, 21);
    m.zero_grad();
    Tensor loss = m.loss(b);
    REQUIRE(loss.dtype() == DType::f64);
    loss.backward();
    Rng pick(5);
    const double eps = 1e-6;
    double worst = 0;
    std::string worst_at;
    for (const auto& p : m.named_parameters()) {
      auto grad = p.tensor.grad().to_doubles();
      double* data = p.tensor.data<double>();
      // Rows of the embedding / head that the batch touches matter most; sample anywhere but
      // include the largest gradient element.
      std::vector<int64_t> idx;
      int64_t arg_max = 0;
      for (int64_t k = 0; k < int64_t(grad.size()); k++)
        if (std::abs(grad[size_t(k)]) > std::abs(grad[size_t(arg_max)])) arg_max = k;
      idx.push_back(arg_max);
      for (int k = 0; k < 3; k++) idx.push_back(pick.randint(0, p.tensor.numel()));
      for (int64_t k : idx) {
        const double orig = data[k];
        double fp, fm;
        {
          NoGradGuard no_grad;
          data[k] = orig + eps;
          fp = m.loss(b).item();
          data[k] = orig - eps;
          fm = m.loss(b).item();
          data[k] = orig;
        }
        const double numeric = (fp - fm) / (2 * eps);
        const double err = std::abs(numeric - grad[size_t(k)]) / (1e-8 + 1e-5 * std::abs(numeric));
        if (err > worst) worst = err, worst_at = p.name + "[" + std::to_string(k) + "]";
      }
    }
    INFO("worst " << worst_at << ": " << worst);
    CHECK(worst <= 1.0);
  }
}

TEST_CASE("qwen3 model: bad batches are errors that name the tensor") {
  Qwen3Config c = tiny_qwen3_config();
  Qwen3ForCausalLM m(c);
  Rng rng(1);
  m.init_weights(rng);
  TextBatch b = random_batch({4, 4}, c.vocab_size, 1);
  TextBatch bad = b;
  bad.position_ids = slice(b.position_ids, 0, 0, 7).contiguous();
  CHECK_THROWS_WITH(m.logits(bad), Catch::Contains("position_ids"));
  bad = b;
  bad.input_ids = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 512}, {8});
  CHECK_THROWS_WITH(m.logits(bad), Catch::Contains("512"));
  bad = b;
  bad.cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, 4, 7}, {3});
  CHECK_THROWS_WITH(m.logits(bad), Catch::Contains("cu_seqlens"));
  CHECK_THROWS_WITH(Qwen3ForCausalLM(c, DType::f16), Catch::Contains("f16"));
}

TEST_CASE("qwen3 model: parameter kinds for weight-decay groups") {
  CHECK(qwen3_param_kind("model.embed_tokens.weight") == ParamKind::embedding);
  CHECK(qwen3_param_kind("model.layers.3.input_layernorm.weight") == ParamKind::norm);
  CHECK(qwen3_param_kind("model.layers.3.post_attention_layernorm.weight") == ParamKind::norm);
  CHECK(qwen3_param_kind("model.layers.3.self_attn.q_norm.weight") == ParamKind::norm);
  CHECK(qwen3_param_kind("model.layers.3.self_attn.k_norm.weight") == ParamKind::norm);
  CHECK(qwen3_param_kind("model.norm.weight") == ParamKind::norm);
  CHECK(qwen3_param_kind("model.layers.3.self_attn.q_proj.bias") == ParamKind::bias);
  CHECK(qwen3_param_kind("model.layers.3.self_attn.q_proj.weight") == ParamKind::weight);
  CHECK(qwen3_param_kind("model.layers.3.mlp.down_proj.weight") == ParamKind::weight);
  CHECK(qwen3_param_kind("lm_head.weight") == ParamKind::weight);
  CHECK(is_no_decay_param("model.norm.weight"));
  CHECK(is_no_decay_param("model.embed_tokens.weight"));
  CHECK_FALSE(is_no_decay_param("lm_head.weight"));
  CHECK_FALSE(is_no_decay_param("model.layers.0.mlp.up_proj.weight"));
}

TEST_CASE("qwen3 model: the head fused with the loss in vocabulary chunks gives the same loss") {
  // loss_vocab_chunk = N runs linear_cross_entropy (chunks of N head rows, logits never whole)
  // instead of logits then cross-entropy: same values up to summation order. f64 makes that
  // order invisible (1e-12); f32 shows it (observed ~1e-7 on the loss, ~1e-6 on gradients).
  for (DType dt : {DType::f64, DType::f32}) {
    for (bool tied : {false, true}) {
      INFO(dtype_name(dt) << (tied ? " tied" : " untied"));
      Qwen3Config c = tiny_qwen3_config(tied);
      Qwen3ForCausalLM m(c, dt);
      Rng rng(11);
      m.init_weights(rng);
      TextBatch b = random_batch({17, 30, 6}, c.vocab_size, 12);
      auto run = [&](int64_t chunk) {
        m.zero_grad();
        ForwardOptions o;
        o.loss_vocab_chunk = chunk;
        Tensor l = m.loss_sum(b, o);
        l.backward();
        std::vector<Tensor> grads;
        for (const auto& p : m.named_parameters()) grads.push_back(p.tensor.grad().clone());
        return std::make_pair(l.item(), grads);
      };
      auto [want, want_grads] = run(0);
      for (int64_t chunk : {int64_t(100), int64_t(512), int64_t(1000)}) {
        INFO("chunk " << chunk);
        auto [got, got_grads] = run(chunk);
        const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
        CHECK(std::abs(got - want) <= tol * std::abs(want));
        for (size_t i = 0; i < got_grads.size(); i++)
          CHECK(rel_error(got_grads[i], want_grads[i]) <= (dt == DType::f64 ? 1e-11 : 1e-4));
      }
      // The mean form too.
      ForwardOptions o;
      o.loss_vocab_chunk = 100;
      CHECK(m.loss(b, o).item() ==
            Approx(m.loss(b).item()).epsilon(dt == DType::f64 ? 1e-12 : 1e-6));
    }
  }
}

TEST_CASE("qwen3 model: to_device on the CPU keeps the values and counts the targets") {
  TextBatch b = random_batch({9, 4}, 512, 5);
  TextBatch d = to_device(b, Device::cpu());
  CHECK(d.input_ids.to_doubles() == b.input_ids.to_doubles());
  CHECK(d.targets.to_doubles() == b.targets.to_doubles());
  CHECK(d.position_ids.to_doubles() == b.position_ids.to_doubles());
  CHECK(d.cu_seqlens.to_doubles() == b.cu_seqlens.to_doubles());
  CHECK(b.num_targets == -1);
  CHECK(d.num_targets == count_targets(b));
  CHECK(d.num_targets > 0);
  // i32 inputs come out as i64; a batch without targets moves too.
  TextBatch b32 = b;
  b32.input_ids = b.input_ids.to(DType::i32);
  b32.targets = Tensor();
  TextBatch d32 = to_device(b32, Device::cpu());
  CHECK(d32.input_ids.dtype() == DType::i64);
  CHECK(d32.input_ids.to_doubles() == b.input_ids.to_doubles());
  CHECK_FALSE(d32.targets.defined());
  CHECK(d32.num_targets == 0);
}
