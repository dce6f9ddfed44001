#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>

#include "src/core/ops.h"
#include "src/core/ops/index.h"
#include "src/core/ops/norm.h"
#include "src/nn/embedding.h"
#include "src/nn/linear.h"
#include "src/nn/module.h"
#include "src/nn/rms_norm.h"

using namespace vlm;
using namespace vlm::nn;
using Catch::Matchers::Contains;

namespace {

// A miniature decoder: model.{embed_tokens, layers.N.{self_attn.q_proj, input_layernorm},
// norm} + lm_head, declared with the init rules a real model would use.
struct Attention : Module {
  std::shared_ptr<Linear> q_proj;
  explicit Attention(int64_t h) {
    q_proj = register_module("q_proj", std::make_shared<Linear>(h, h, LinearOptions{.bias = true}));
  }
};

struct Layer : Module {
  std::shared_ptr<Attention> self_attn;
  explicit Layer(int64_t h) {
    self_attn = register_module("self_attn", std::make_shared<Attention>(h));
    declare_parameter("input_layernorm", {h}, Init::ones());
  }
};

struct Decoder : Module {
  explicit Decoder(int64_t layers, int64_t h = 4, int64_t vocab = 10) {
    declare_parameter("embed_tokens", {vocab, h}, Init::normal(0.02));
    auto list = register_module("layers", std::make_shared<ModuleList>());
    for (int64_t i = 0; i < layers; i++) list->append(std::make_shared<Layer>(h));
    declare_parameter("norm", {h}, Init::zeros());
  }
};

struct Model : Module {
  explicit Model(int64_t layers = 2) {
    register_module("model", std::make_shared<Decoder>(layers));
    register_module("lm_head", std::make_shared<Linear>(4, 10));
  }
};

std::vector<std::string> names_of(const Module& m) {
  std::vector<std::string> out;
  for (const auto& np : m.named_parameters()) out.push_back(np.name);
  return out;
}

} // namespace

TEST_CASE("module: hierarchical HF-style names in registration order", "[nn]") {
  Model m;
  m.materialize();
  const std::vector<std::string> expected = {"model.embed_tokens",
                                             "model.norm",
                                             "model.layers.0.input_layernorm",
                                             "model.layers.0.self_attn.q_proj.weight",
                                             "model.layers.0.self_attn.q_proj.bias",
                                             "model.layers.1.input_layernorm",
                                             "model.layers.1.self_attn.q_proj.weight",
                                             "model.layers.1.self_attn.q_proj.bias",
                                             "lm_head.weight"};
  // A module lists its own parameters before its children's (as PyTorch does): "model.norm" and
  // "input_layernorm" were declared after the children were registered but come first. (HF
  // models make the final norm a child module, which is why it comes last in their state dicts.)
  CHECK(names_of(m) == expected);
  for (const auto& np : m.named_parameters()) {
    CHECK(np.tensor.name() == np.name); // materialize() names the tensors
    CHECK(np.tensor.requires_grad());
    CHECK(np.tensor.is_leaf());
  }
  CHECK(m.parameters().size() == expected.size());
  CHECK(m.num_parameters() == 10 * 4 + 2 * (4 + 16 + 4) + 4 + 40);
  // Names are relative to the module they are listed from.
  auto& layer1 = m.find_module("model.layers.1");
  CHECK(names_of(layer1) == std::vector<std::string>{"input_layernorm", "self_attn.q_proj.weight",
                                                     "self_attn.q_proj.bias"});
  CHECK(m.find_parameter("model.layers.1.self_attn.q_proj.bias")
            .same(layer1.find_parameter("self_attn.q_proj.bias")));
  auto modules = m.named_modules();
  CHECK(modules.front().first.empty());
  CHECK(modules.size() ==
        1 + 1 + 1 + 2 * 3 + 1); // root, model, layers, 2 x (layer, attn, q), lm_head
}

TEST_CASE("module: parameters are described before they are allocated", "[nn]") {
  Model m;
  auto specs = m.parameter_specs();
  REQUIRE(specs.size() == 9);
  CHECK(specs[0].name == "model.embed_tokens");
  CHECK(specs[0].shape == Shape{10, 4});
  CHECK(specs[0].init.kind == Init::Kind::normal);
  CHECK_FALSE(specs[0].materialized);
  CHECK(m.num_parameters() == 10 * 4 + 2 * (4 + 16 + 4) + 4 + 40);
  CHECK_THROWS_WITH(m.named_parameters(),
                    Contains("model.embed_tokens") && Contains("materialize"));
  // The parallel plan may change a local shape before allocation (e.g. a dim-0 shard).
  m.set_local_shape("model.embed_tokens", {5, 4});
  m.materialize();
  CHECK(m.find_parameter("model.embed_tokens").shape() == Shape{5, 4});
  CHECK_THROWS_WITH(m.set_local_shape("model.embed_tokens", {10, 4}),
                    Contains("already materialized") && Contains("(5, 4)"));
}

TEST_CASE("module: freezing a subtree", "[nn]") {
  Model m;
  m.find_module("model.layers.0").set_requires_grad(false); // before materialize: carried over
  m.materialize();
  CHECK_FALSE(m.find_parameter("model.layers.0.self_attn.q_proj.weight").requires_grad());
  CHECK_FALSE(m.find_parameter("model.layers.0.input_layernorm").requires_grad());
  CHECK(m.find_parameter("model.layers.1.self_attn.q_proj.weight").requires_grad());
  CHECK(m.num_parameters(/*trainable_only=*/true) == m.num_parameters() - (4 + 16 + 4));
  m.find_module("lm_head").set_requires_grad(false); // after materialize
  CHECK_FALSE(m.find_parameter("lm_head.weight").requires_grad());
  m.set_requires_grad(true);
  for (const auto& p : m.parameters()) CHECK(p.requires_grad());
}

TEST_CASE("module: initialize is deterministic and follows each rule", "[nn]") {
  auto make = [](uint64_t seed, int64_t layers) {
    auto m = std::make_shared<Model>(layers);
    m->materialize();
    Rng rng(seed);
    m->initialize(rng);
    return m;
  };
  auto a = make(42, 2), b = make(42, 2), c = make(43, 2), deeper = make(42, 3);
  const auto& name = "model.layers.1.self_attn.q_proj.weight";
  auto values = [&](const std::shared_ptr<Model>& m, const std::string& n) {
    return m->find_parameter(n).to_doubles();
  };
  for (const auto& np : a->named_parameters()) CHECK(values(a, np.name) == values(b, np.name));
  CHECK(values(a, name) != values(c, name));
  // Each parameter draws from its own stream keyed by its name: adding a layer changes nothing
  // in the others.
  for (const auto& np : a->named_parameters()) CHECK(values(a, np.name) == values(deeper, np.name));
  // Parameters are filled in parallel: one thread gives the same values.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  auto serial = make(42, 2);
  omp_set_num_threads(threads);
  for (const auto& np : a->named_parameters()) CHECK(values(a, np.name) == values(serial, np.name));
  // Rules: normal(0.02) for linear weights, zeros for biases and "norm", ones for layer norms.
  CHECK(values(a, "model.layers.0.self_attn.q_proj.bias") == std::vector<double>(4, 0.0));
  CHECK(values(a, "model.layers.0.input_layernorm") == std::vector<double>(4, 1.0));
  CHECK(values(a, "model.norm") == std::vector<double>(4, 0.0));
  CHECK(values(a, "model.layers.0.self_attn.q_proj.weight") != values(a, name));
}

TEST_CASE("module: normal init has the declared statistics, in any dtype", "[nn]") {
  Module m;
  m.declare_parameter("w", {256, 256}, Init::normal(0.02, 0.5));
  m.declare_parameter("h", {64, 64}, Init::normal(0.02), DType::bf16);
  m.declare_parameter("u", {1000}, Init::uniform(-1.0, 3.0), DType::f64);
  m.materialize();
  Rng rng(1);
  m.initialize(rng);
  auto v = m.find_parameter("w").to_doubles();
  double mean = 0, sq = 0;
  for (double x : v) mean += x;
  mean /= double(v.size());
  for (double x : v) sq += (x - mean) * (x - mean);
  const double std = std::sqrt(sq / double(v.size()));
  CHECK(std::abs(mean - 0.5) < 1e-3); // 65536 samples: 0.02 / 256 = 8e-5 standard error
  CHECK(std::abs(std - 0.02) < 5e-4);
  CHECK(m.find_parameter("h").dtype() == DType::bf16);
  for (double x : m.find_parameter("u").to_doubles()) CHECK((x >= -1.0 && x < 3.0));
}

TEST_CASE("module: custom and keep init rules", "[nn]") {
  Module m;
  m.declare_parameter("a_log", {3}, Init::custom([](Tensor& p, Rng& rng) {
                        std::vector<double> v;
                        for (int i = 0; i < 3; i++) v.push_back(std::log(rng.uniform(1.0, 16.0)));
                        copy_(p, Tensor::from_doubles(v, {3}));
                      }));
  m.register_parameter("given", Tensor::from_doubles({1, 2, 3}, {3}));
  m.materialize();
  Rng rng(5);
  m.initialize(rng);
  for (double x : m.find_parameter("a_log").to_doubles()) CHECK((x >= 0 && x < std::log(16.0)));
  CHECK(m.find_parameter("given").to_doubles() == std::vector<double>{1, 2, 3});
  CHECK(m.find_parameter("given").requires_grad());
}

TEST_CASE("module: a tensor registered twice is listed once (tied weights)", "[nn]") {
  Module m;
  auto emb = m.register_module("embed", std::make_shared<Module>());
  auto head = m.register_module("head", std::make_shared<Module>());
  Tensor w = Tensor::zeros({3, 2});
  emb->register_parameter("weight", w);
  head->register_parameter("weight", w);
  m.materialize();
  CHECK(names_of(m) == std::vector<std::string>{"embed.weight"});
  CHECK(m.num_parameters() == 6);
  CHECK(w.name() == "embed.weight");
  CHECK(names_of(*head) == std::vector<std::string>{"weight"});
}

TEST_CASE("module: to() the device the parameters are on keeps the same tensors", "[nn]") {
  Module m;
  auto emb = m.register_module("embed", std::make_shared<Module>());
  Tensor w = Tensor::zeros({3, 2});
  emb->register_parameter("weight", w);
  m.materialize();
  m.to(Device::cpu());
  CHECK(m.find_parameter("embed.weight").same(w));
  // Moving to a device that does not exist fails before any parameter is replaced.
  if (cuda_device_count() == 0) {
    CHECK_THROWS_WITH(m.to(Device::cuda(0)), Catch::Contains("no CUDA device"));
    CHECK(m.find_parameter("embed.weight").same(w));
  }
}

TEST_CASE("module: zero_grad drops every gradient", "[nn]") {
  Model m;
  m.materialize();
  Rng rng(3);
  m.initialize(rng);
  auto& head = dynamic_cast<Linear&>(m.find_module("lm_head"));
  Tensor x = Tensor::randn({2, 4}, rng);
  sum(head.forward(x)).backward();
  CHECK(head.weight().grad().defined());
  m.zero_grad();
  for (const auto& p : m.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("module: Linear forward is the linear op on its parameters", "[nn]") {
  Linear lin(3, 2, {.bias = true, .dtype = DType::f64});
  lin.materialize();
  Rng rng(9);
  lin.initialize(rng);
  Tensor bias = lin.bias(); // a handle on the parameter's storage
  copy_(bias, Tensor::from_doubles({0.5, -1}, {2}, DType::f64));
  Tensor x = Tensor::randn({4, 3}, rng, DType::f64);
  CHECK(lin.forward(x).to_doubles() == linear(x, lin.weight(), lin.bias()).to_doubles());
  CHECK(lin.weight().shape() == Shape{2, 3});
  CHECK_THROWS_WITH(lin.forward(Tensor::zeros({4, 5}, DType::f64)), Contains("(4, 5)"));
  Linear no_bias(3, 2);
  CHECK_FALSE(no_bias.has_param("bias"));
  CHECK_THROWS_WITH(no_bias.weight(), Contains("not materialized") && Contains("(2, 3)"));
}

TEST_CASE("module: bad names and lookups are clear errors", "[nn]") {
  Model m;
  m.materialize();
  CHECK_THROWS_WITH(m.find_parameter("model.layers.0.self_attn.q_proj.weigth"),
                    Contains("no parameter named 'model.layers.0.self_attn.q_proj.weigth'") &&
                        Contains("model.layers.0.self_attn.q_proj.weight"));
  CHECK_THROWS_WITH(m.find_module("model.layer.0"), Contains("model.layers.0"));
  CHECK_THROWS_WITH(m.find_module("lm_head").param("bias"),
                    Contains("no parameter 'bias'") && Contains("weight"));
  Module b;
  b.declare_parameter("w", {2}, Init::zeros());
  CHECK_THROWS_WITH(b.declare_parameter("w", {3}, Init::zeros()), Contains("'w' is already used"));
  CHECK_THROWS_WITH(b.register_module("w", std::make_shared<Module>()),
                    Contains("'w' is already used"));
  CHECK_THROWS_WITH(b.declare_parameter("a.b", {2}, Init::zeros()), Contains("no '.'"));
  CHECK_THROWS_WITH(b.declare_parameter("", {2}, Init::zeros()), Contains("non-empty"));
  CHECK_THROWS_WITH(b.declare_parameter("neg", {2, -1}, Init::zeros()), Contains("(2, -1)"));
  CHECK_THROWS_WITH(b.declare_parameter("i", {2}, Init::zeros(), DType::i64), Contains("i64"));
  Tensor leaf = Tensor::zeros({2}).set_requires_grad(true);
  CHECK_THROWS_WITH(b.register_parameter("nonleaf", add(leaf, leaf)), Contains("leaf"));
  ModuleList list;
  CHECK_THROWS_WITH(list[0], Contains("out of range"));
}

TEST_CASE("module: Embedding and RMSNorm hold their weights and call the ops", "[nn]") {
  Module m;
  auto emb = m.register_module("embed_tokens", std::make_shared<Embedding>(7, 3));
  auto norm = m.register_module("norm", std::make_shared<RMSNorm>(3, RMSNormOptions{.eps = 1e-5}));
  auto norm35 = m.register_module(
      "norm35", std::make_shared<RMSNorm>(3, RMSNormOptions{.zero_centered = true}));
  m.materialize();
  Rng rng(8);
  m.initialize(rng);
  CHECK(names_of(m) ==
        std::vector<std::string>{"embed_tokens.weight", "norm.weight", "norm35.weight"});
  CHECK(norm->weight().to_doubles() == std::vector<double>(3, 1.0));
  CHECK(norm35->weight().to_doubles() == std::vector<double>(3, 0.0)); // (1 + w) scale
  Tensor ids = Tensor::from_vector<int64_t>({6, 0, 6}, {3});
  Tensor x = emb->forward(ids);
  CHECK(x.shape() == Shape{3, 3});
  CHECK(x.to_doubles() == embedding(emb->weight(), ids).to_doubles());
  CHECK(norm->forward(x).to_doubles() == rms_norm(x, norm->weight(), 1e-5).to_doubles());
  // With w = 0 the zero-centred norm equals the plain norm with w = 1.
  CHECK(norm35->forward(x).to_doubles() == rms_norm(x, norm->weight(), 1e-6).to_doubles());
  CHECK_THROWS_WITH(norm->forward(Tensor::zeros({2, 4})), Contains("(2, 4)"));
}

TEST_CASE("module: call runs pre-hooks, wrappers (first added innermost), post-hooks", "[nn]") {
  Linear lin(2, 2, {.bias = false, .dtype = DType::f64});
  lin.materialize();
  {
    NoGradGuard no_grad;
    Tensor w = lin.weight();
    copy_(w, Tensor::from_doubles({1, 0, 0, 1}, {2, 2}, DType::f64)); // identity
  }
  std::vector<std::string> order;
  const size_t pre = lin.add_forward_pre_hook(
      [&](const std::vector<Tensor>& in) { order.push_back("pre " + std::to_string(in.size())); });
  const size_t w1 = lin.add_forward_wrapper([&](const Module::Forward& f, const auto& in) {
    order.push_back("inner");
    return f(in);
  });
  lin.add_forward_wrapper([&](const Module::Forward& f, const auto& in) {
    order.push_back("outer");
    auto out = f(in);
    out[0] = affine(out[0], 2.0); // wrappers may change what the block returns
    return out;
  });
  lin.add_forward_post_hook([&](const auto& in, const std::vector<Tensor>& out) {
    order.push_back("post " + std::to_string(out[0].to_doubles()[0]));
  });
  // Linear::forward runs through call() once something is attached (tensor parallelism's way in).
  const Tensor x = Tensor::from_doubles({3, 4}, {1, 2}, DType::f64);
  const Tensor y = lin.forward(x);
  CHECK(y.to_doubles() == std::vector<double>{6, 8});
  CHECK(order == std::vector<std::string>{"pre 1", "outer", "inner", "post 6.000000"});
  CHECK(lin.num_forward_wrappers() == 2);
  lin.remove_forward_hook(pre);
  lin.remove_forward_hook(w1);
  CHECK(lin.num_forward_wrappers() == 1);
  CHECK_THROWS_WITH(lin.remove_forward_hook(pre), Contains("no such hook"));
  order.clear();
  lin.forward(x);
  CHECK(order == std::vector<std::string>{"outer", "post 6.000000"});
}

TEST_CASE("module: replace_parameter swaps a parameter's tensor everywhere it is registered",
          "[nn]") {
  // What FSDP does around a block: swap in a gathered copy before its forward, and the shard
  // back after it (here: a parameter of another shape); ties stay one tensor.
  Module m;
  auto emb = m.register_module("embed", std::make_shared<Module>());
  auto head = m.register_module("head", std::make_shared<Module>());
  Tensor w = Tensor::zeros({3, 2});
  emb->register_parameter("weight", w);
  head->register_parameter("weight", w);
  m.materialize();
  Tensor shard = Tensor::ones({1, 2});
  shard.set_requires_grad(true);
  m.replace_parameter("embed.weight", shard);
  CHECK(m.find_parameter("embed.weight").same(shard));
  CHECK(head->param("weight").same(shard));
  CHECK(emb->param("weight").same(shard));
  CHECK(shard.name() == "embed.weight");
  CHECK(names_of(m) == std::vector<std::string>{"embed.weight"});
  CHECK_THROWS_WITH(m.replace_parameter("embed.wieght", shard), Contains("embed.weight"));
  // A parameter only declared is materialized as the given tensor (FSDP allocates its shards).
  Module lazy;
  lazy.declare_parameter("w", {2}, Init::zeros());
  lazy.replace_parameter("w", shard);
  CHECK(lazy.param("w").same(shard));
  CHECK(lazy.parameter_specs()[0].materialized);
}

TEST_CASE("module: a local shape changes what is allocated, not what is declared", "[nn]") {
  Module m;
  m.declare_parameter("w", {8, 3}, Init::normal(1.0));
  m.declare_parameter("b", {8}, Init::zeros());
  m.set_local_shape("w", {4, 3});
  m.set_trainable("b", false);
  const auto specs = m.parameter_specs();
  CHECK(specs[0].shape == Shape{8, 3});
  CHECK(specs[0].local_shape == Shape{4, 3});
  CHECK(!specs[1].trainable);
  CHECK(m.num_parameters() == 32); // the model's count, not this rank's
  m.materialize();
  CHECK(m.param("w").shape() == Shape{4, 3});
  CHECK(!m.param("b").requires_grad());
  CHECK_THROWS_WITH(m.set_local_shape("w", {2, 3}), Contains("already materialized"));
  CHECK_THROWS_WITH(m.set_trainable("x", false), Contains("no parameter named 'x'"));
}

TEST_CASE("module: initializing by parts draws the whole tensor's values", "[nn]") {
  // A [3000, 700] normal weight spans several of the initializer's chunks (about 1M values);
  // this "rank" keeps rows [1234, 2500) and the whole bias. Custom rules see the whole tensor.
  auto build = [](Module& m) {
    m.declare_parameter("w", {3000, 700}, Init::normal(0.02));
    m.declare_parameter("c", {6}, Init::custom([](Tensor& t, Rng& rng) {
                          const double scale = double(t.size(0)); // the whole tensor's
                          copy_(t, Tensor::uniform(t.shape(), rng, 0.0, scale, DType::f64));
                        }));
  };
  Module whole, part;
  build(whole);
  build(part);
  whole.materialize();
  part.set_local_shape("w", {1266, 700});
  part.set_local_shape("c", {2});
  part.materialize();
  Rng a(5), b(5);
  whole.initialize(a);
  part.initialize(b, [](const std::string& name) -> std::optional<Module::InitPart> {
    const int64_t lo = name == "w" ? 1234 : 4, n = name == "w" ? 1266 : 2;
    return Module::InitPart{name == "w" ? Shape{3000, 700} : Shape{6},
                            [lo, n](Tensor& local, int64_t row_begin, const Tensor& rows) {
                              const int64_t a0 = std::max(lo, row_begin);
                              const int64_t e = std::min(lo + n, row_begin + rows.size(0));
                              if (a0 >= e) return;
                              Tensor dst = slice(local, 0, a0 - lo, e - lo);
                              copy_(dst, slice(rows, 0, a0 - row_begin, e - row_begin));
                            }};
  });
  CHECK(a.next_u64() == b.next_u64());
  CHECK(part.param("w").to_doubles() == slice(whole.param("w"), 0, 1234, 2500).to_doubles());
  CHECK(part.param("c").to_doubles() == slice(whole.param("c"), 0, 4, 6).to_doubles());
}

TEST_CASE("module: to() keeps each parameter's gradient dtype", "[nn]") {
  Linear lin(2, 2, {.bias = false, .dtype = DType::bf16});
  lin.materialize();
  Tensor w = lin.weight();
  w.set_grad_dtype(DType::f32);
  CHECK(lin.weight().grad_dtype() == DType::f32);
  sum(lin.forward(Tensor::ones({1, 2}, DType::bf16))).backward();
  CHECK(lin.weight().grad().dtype() == DType::f32); // bf16 parameter, fp32 gradient
  lin.to(Device::cpu());
  CHECK(lin.weight().grad_dtype() == DType::f32);
}
