// Qwen3ForCausalLM beyond the golden files: parameter names and counts, HF initialisation, the
// label shift, packed == separate documents, loss reductions, activation checkpointing (full and
// selective bit-identical to off), finite differences of the whole model in f64, parameter kinds.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "io/loader/packing.h"
#include "model/hf_weights.h"
#include "model/lm_loss.h"
#include "model/qwen3/model.h"
#include "model/text/decoder_layer.h"
#include "parallel/ac/activation_checkpointing.h"
#include "src/core/ops.h"
#include "tests/golden/golden.h"

using namespace vlm;
using namespace vlm::model;
using vlm::parallel::AcMode;
using vlm::testing::rel_error;

namespace {

std::string snapshot(const std::string& variant) {
  return std::string(VLM_SOURCE_DIR) + "/tests/data/qwen3_tiny_" + variant;
}

// Random token ids, HF-aligned labels (-100 on each document's first token and a few more) and
// per-document positions for the given document lengths.
Batch random_batch(const std::vector<int64_t>& lengths, int64_t vocab, uint64_t seed) {
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
  return batch_from_labels(Tensor::from_vector(ids, {T}), Tensor::from_vector(labels, {T}),
                           Tensor::from_vector(pos, {T}),
                           Tensor::from_vector(cu, {int64_t(cu.size())}));
}

// Tokens [begin, end) of a batch as a batch of its own (one document).
Batch sub_batch(const Batch& b, int64_t begin, int64_t end) {
  Batch s;
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

// Activation checkpointing applied to a model's blocks for one scope, then taken off again.
struct AcScope {
  std::vector<nn::Module*> blocks;
  std::vector<size_t> handles;
  AcScope(CausalLM& m, AcMode mode)
      : blocks(m.blocks()), handles(parallel::apply_activation_checkpointing(blocks, mode)) {}
  ~AcScope() {
    for (size_t i = 0; i < handles.size(); i++) blocks[i]->remove_forward_hook(handles[i]);
  }
};

Tensor mean_loss(const CausalLM& m, const Batch& b, int64_t vocab_chunk = 0) {
  return lm_loss(m, b, Reduction::mean, LossOptions{vocab_chunk});
}
Tensor loss_sum(const CausalLM& m, const Batch& b, int64_t vocab_chunk = 0) {
  return lm_loss(m, b, Reduction::sum, LossOptions{vocab_chunk});
}

LossAndGrads loss_and_grads(Qwen3ForCausalLM& m, const Batch& b, AcMode ac) {
  m.zero_grad();
  AcScope scope(m, ac);
  Tensor loss = mean_loss(m, b);
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
    CHECK(m.head_weight().same(tie ? m.find_parameter("model.embed_tokens.weight")
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
    switch (param_kind_by_name(p.name)) {
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
  Batch b = batch_from_labels(Tensor::from_vector(ids, {1, 8}), Tensor::from_vector(labels, {1, 8}),
                              Tensor::from_vector(pos, {1, 8}),
                              Tensor::from_vector(std::vector<int64_t>{0, 3, 8}, {3}));
  auto expected = io::next_token_targets(labels);
  auto got = b.targets.to_doubles();
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); i++) CHECK(got[i] == double(expected[i]));
  CHECK(b.input_ids.shape() == Shape{8});
  CHECK(b.input_ids.dtype() == DType::i64);
  CHECK(b.cu_seqlens.dtype() == DType::i32);
  CHECK(count_targets(b) == 5);
  CHECK_THROWS_WITH(batch_from_labels(Tensor::from_vector(ids, {8}),
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
    Batch packed = random_batch(lengths, c.vocab_size, 3);
    NoGradGuard no_grad;
    double sum = loss_sum(m, packed).item(), separate_sum = 0;
    int64_t begin = 0;
    for (int64_t len : lengths) {
      Batch doc = sub_batch(packed, begin, begin + len);
      Tensor logits = lm_logits(m, doc);
      Tensor expected = slice(lm_logits(m, packed), 0, begin, begin + len).contiguous();
      CHECK(rel_error(logits, expected) <= 1e-6);
      separate_sum += loss_sum(m, doc).item();
      begin += len;
    }
    CHECK(sum == Approx(separate_sum).epsilon(1e-6));
    const int64_t n = count_targets(packed);
    CHECK(mean_loss(m, packed).item() == Approx(sum / double(n)).epsilon(1e-6));
  }
}

TEST_CASE("qwen3 model: loss reductions, nothing to predict gives 0 and zero gradients") {
  Qwen3Config c = tiny_qwen3_config(true);
  Qwen3ForCausalLM m(c);
  Rng rng(3);
  m.init_weights(rng);
  Batch b = random_batch({9, 4}, c.vocab_size, 5);
  std::vector<int64_t> none(13, -100);
  b.targets = Tensor::from_vector(none, {13});
  Tensor loss = mean_loss(m, b);
  CHECK(loss.item() == 0.0);
  loss.backward();
  for (const auto& p : m.named_parameters()) {
    INFO(p.name);
    for (double g : p.tensor.grad().to_doubles()) REQUIRE(g == 0.0);
  }
  CHECK(loss_sum(m, b).item() == 0.0);
  // The output dtypes: logits and loss in f32 for a bf16 model.
  Qwen3ForCausalLM mb(c, DType::bf16);
  Rng rng2(3);
  mb.init_weights(rng2);
  Batch b2 = random_batch({9, 4}, c.vocab_size, 5);
  LMOutput out = lm_forward(mb, b2);
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
            if (param_kind_by_name(p.name) == ParamKind::bias)
              copy_(p.tensor, Tensor::randn(p.tensor.shape(), rng, dtype, 0.1));
        }
        Batch b = random_batch({20, 17, 3}, c.vocab_size, 9);
        LossAndGrads off = loss_and_grads(m, b, AcMode::off);
        for (auto ac : {AcMode::full, AcMode::selective}) {
          INFO(parallel::ac_mode_name(ac));
          LossAndGrads r = loss_and_grads(m, b, ac);
          CHECK(r.loss == off.loss);
          REQUIRE(r.grads.size() == off.grads.size());
          for (size_t i = 0; i < r.grads.size(); i++) CHECK(r.grads[i] == off.grads[i]);
        }
      }
    }
  }
  CHECK(parallel::parse_ac_mode("sac") == AcMode::selective);
  CHECK_THROWS_WITH(parallel::parse_ac_mode("some"), Catch::Contains("selective"));
}

TEST_CASE("qwen3 model: activation checkpointing keeps less memory between forward and backward") {
  // Bytes that the autograd graph holds after the forward (activations saved for backward):
  // full keeps only each layer's input, selective also the projection outputs, off everything.
  Qwen3Config c = tiny_qwen3_config();
  c.num_hidden_layers = 4;
  Qwen3ForCausalLM m(c);
  Rng rng(1);
  m.init_weights(rng);
  Batch b = random_batch({200, 56}, c.vocab_size, 2);
  auto held = [&](AcMode ac) {
    Allocator& alloc = allocator_for(Device::cpu());
    AcScope scope(m, ac);
    const size_t before = alloc.stats().current_bytes;
    Tensor loss = mean_loss(m, b);
    const size_t after = alloc.stats().current_bytes;
    loss.backward();
    m.zero_grad();
    return double(after - before);
  };
  const double off = held(AcMode::off), full = held(AcMode::full), sel = held(AcMode::selective);
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
    Batch b = random_batch({7, 6}, c.vocab_size, 21);
    m.zero_grad();
    Tensor loss = mean_loss(m, b);
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
          fp = mean_loss(m, b).item();
          data[k] = orig - eps;
          fm = mean_loss(m, b).item();
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
  Batch b = random_batch({4, 4}, c.vocab_size, 1);
  Batch bad = b;
  bad.position_ids = slice(b.position_ids, 0, 0, 7).contiguous();
  CHECK_THROWS_WITH(lm_logits(m, bad), Catch::Contains("position_ids"));
  bad = b;
  bad.input_ids = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 512}, {8});
  CHECK_THROWS_WITH(lm_logits(m, bad), Catch::Contains("512"));
  bad = b;
  bad.cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, 4, 7}, {3});
  CHECK_THROWS_WITH(lm_logits(m, bad), Catch::Contains("cu_seqlens"));
  CHECK_THROWS_WITH(Qwen3ForCausalLM(c, DType::f16), Catch::Contains("f16"));
}

TEST_CASE("qwen3 model: parameter roles for the optimizer groups and weight decay") {
  CHECK(param_kind_by_name("model.embed_tokens.weight") == ParamKind::embedding);
  CHECK(param_kind_by_name("model.layers.3.input_layernorm.weight") == ParamKind::norm);
  CHECK(param_kind_by_name("model.layers.3.post_attention_layernorm.weight") == ParamKind::norm);
  CHECK(param_kind_by_name("model.layers.3.self_attn.q_norm.weight") == ParamKind::norm);
  CHECK(param_kind_by_name("model.layers.3.self_attn.k_norm.weight") == ParamKind::norm);
  CHECK(param_kind_by_name("model.norm.weight") == ParamKind::norm);
  CHECK(param_kind_by_name("model.layers.3.self_attn.q_proj.bias") == ParamKind::bias);
  CHECK(param_kind_by_name("model.layers.3.self_attn.q_proj.weight") == ParamKind::weight);
  CHECK(param_kind_by_name("model.layers.3.mlp.down_proj.weight") == ParamKind::weight);
  CHECK(param_kind_by_name("lm_head.weight") == ParamKind::weight);
  // Every Qwen3 parameter belongs to the language model.
  Qwen3ForCausalLM m(tiny_qwen3_config());
  for (const auto& spec : m.parameter_specs()) {
    INFO(spec.name);
    CHECK(m.param_role(spec.name).group == ParamGroup::llm);
    CHECK(m.param_role(spec.name).kind == param_kind_by_name(spec.name));
  }
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
      Batch b = random_batch({17, 30, 6}, c.vocab_size, 12);
      auto run = [&](int64_t chunk) {
        m.zero_grad();
        Tensor l = loss_sum(m, b, chunk);
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
      CHECK(mean_loss(m, b, 100).item() ==
            Approx(mean_loss(m, b).item()).epsilon(dt == DType::f64 ? 1e-12 : 1e-6));
    }
  }
}

TEST_CASE("qwen3 model: to_device on the CPU keeps the values and counts the targets") {
  Batch b = random_batch({9, 4}, 512, 5);
  Batch d = to_device(b, Device::cpu());
  CHECK(d.input_ids.to_doubles() == b.input_ids.to_doubles());
  CHECK(d.targets.to_doubles() == b.targets.to_doubles());
  CHECK(d.position_ids.to_doubles() == b.position_ids.to_doubles());
  CHECK(d.cu_seqlens.to_doubles() == b.cu_seqlens.to_doubles());
  CHECK(b.num_targets == -1);
  CHECK(d.num_targets == count_targets(b));
  CHECK(d.num_targets > 0);
  // i32 inputs come out as i64; a batch without targets moves too.
  Batch b32 = b;
  b32.input_ids = b.input_ids.to(DType::i32);
  b32.targets = Tensor();
  Batch d32 = to_device(b32, Device::cpu());
  CHECK(d32.input_ids.dtype() == DType::i64);
  CHECK(d32.input_ids.to_doubles() == b.input_ids.to_doubles());
  CHECK_FALSE(d32.targets.defined());
  CHECK(d32.num_targets == 0);
}

TEST_CASE("qwen3 model: a decoder layer takes its head counts from its (sharded) weights") {
  // Tensor parallelism gives each rank the rows of some heads of q/k/v and the matching columns
  // of o: a layer holding such shards must run with the local head counts. Rank 0's shard of a
  // 4-head layer (heads 0-1, KV head 0), swapped in with replace_parameter, gives exactly what a
  // 2-head layer with the same weights gives.
  Qwen3Config full = tiny_qwen3_config(); // Hq 4, Hkv 2, D 32
  Qwen3Config half = full;
  half.num_attention_heads = 2;
  half.num_key_value_heads = 1;
  DecoderLayer sharded(full.decoder_layer(), DType::f64), small(half.decoder_layer(), DType::f64);
  sharded.materialize();
  small.materialize();
  Rng rng(4);
  sharded.initialize(rng);
  NoGradGuard no_grad;
  for (const auto& p : sharded.named_parameters()) {
    Tensor local = p.tensor;
    if (p.name.find("q_proj") != std::string::npos || p.name.find("k_proj") != std::string::npos ||
        p.name.find("v_proj") != std::string::npos)
      local = slice(p.tensor, 0, 0, p.tensor.size(0) / 2).contiguous();
    else if (p.name.find("o_proj") != std::string::npos)
      local = slice(p.tensor, 1, 0, p.tensor.size(1) / 2).contiguous();
    if (!local.same(p.tensor)) sharded.replace_parameter(p.name, local.detach());
    Tensor dst = small.find_parameter(p.name);
    copy_(dst, local);
  }
  CHECK(sharded.find_parameter("self_attn.k_proj.weight").shape() == Shape{32, 64});
  const Tensor x = Tensor::randn({9, 64}, rng, DType::f64);
  const Tensor pos = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 4}, {9});
  const Tensor cu = Tensor::from_vector(std::vector<int32_t>{0, 4, 9}, {3});
  BlockContext ctx;
  ctx.varlen = VarlenLayout::of(cu, 9);
  ctx.rope = rope_tables(pos, full.head_dim, full.rope_theta, DType::f64);
  CHECK(sharded.forward(x, ctx).to_doubles() == small.forward(x, ctx).to_doubles());
}

namespace {

// A feed-forward kind of its own, without parameters: h -> 2h.
class DoublingFeedForward final : public FeedForward {
public:
  std::string type_name() const override { return "DoublingFeedForward"; }
  Tensor forward(const Tensor& h, const BlockContext&) const override { return affine(h, 2.0); }
};

} // namespace

TEST_CASE("qwen3 model: a decoder layer takes a feed-forward kind: an explicit SwiGLU MLP is the "
          "default bit for bit, and a kind of its own runs in its place") {
  const DecoderLayerConfig c = tiny_qwen3_config().decoder_layer();
  auto attention = [&] { return std::make_shared<SelfAttention>(c.attention(), DType::f64); };
  DecoderLayer base(c, DType::f64);
  DecoderLayer explicit_mlp(c, "self_attn", attention(),
                            std::make_shared<SwiGluMlp>(c.hidden_size, c.intermediate_size,
                                                        c.initializer_range, DType::f64),
                            DType::f64);
  DecoderLayer doubling(c, "self_attn", attention(), std::make_shared<DoublingFeedForward>(),
                        DType::f64);
  for (DecoderLayer* l : {&base, &explicit_mlp, &doubling}) l->materialize();
  Rng rng(5);
  base.initialize(rng);
  NoGradGuard no_grad;
  std::vector<std::string> base_names, explicit_names;
  for (const auto& p : base.named_parameters()) {
    base_names.push_back(p.name);
    Tensor dst = explicit_mlp.find_parameter(p.name);
    copy_(dst, p.tensor);
    if (p.name.rfind("mlp.", 0) == 0) continue; // the doubling kind has none
    Tensor own = doubling.find_parameter(p.name);
    copy_(own, p.tensor);
  }
  for (const auto& p : explicit_mlp.named_parameters()) explicit_names.push_back(p.name);
  CHECK(explicit_names == base_names); // the same HF names, in the same order
  for (const auto& p : doubling.named_parameters()) CHECK(p.name.rfind("mlp.", 0) != 0);

  const Tensor x = Tensor::randn({9, c.hidden_size}, rng, DType::f64);
  const Tensor pos = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 4}, {9});
  BlockContext ctx;
  ctx.varlen = VarlenLayout::of(Tensor::from_vector(std::vector<int32_t>{0, 4, 9}, {3}), 9);
  ctx.rope = rope_tables(pos, c.head_dim, tiny_qwen3_config().rope_theta, DType::f64);
  CHECK(explicit_mlp.forward(x, ctx).to_doubles() == base.forward(x, ctx).to_doubles());
  // out = x1 + 2 post_attention_layernorm(x1), x1 = x + self_attn(input_layernorm(x)).
  const auto& attn = dynamic_cast<const SelfAttention&>(doubling.find_module("self_attn"));
  const auto& in_norm = dynamic_cast<const nn::RMSNorm&>(doubling.find_module("input_layernorm"));
  const auto& post_norm =
      dynamic_cast<const nn::RMSNorm&>(doubling.find_module("post_attention_layernorm"));
  const Tensor x1 = add(x, attn.forward(in_norm.forward(x), ctx));
  const Tensor want = add(x1, affine(post_norm.forward(x1), 2.0));
  CHECK(rel_error(doubling.forward(x, ctx), want) < 1e-12);
}
