#include "src/train/demo.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <memory>
#include <vector>

#include "src/base/logging.h"
#include "src/core/ops.h"
#include "src/core/ops/activation.h"
#include "src/core/ops/attention.h"
#include "src/core/ops/index.h"
#include "src/core/ops/loss.h"
#include "src/core/ops/rope.h"
#include "src/nn/embedding.h"
#include "src/nn/linear.h"
#include "src/nn/module.h"
#include "src/nn/rms_norm.h"
#include "src/optim/adamw.h"
#include "src/optim/grad_clip.h"
#include "src/optim/lr_schedule.h"

namespace vlm::train {

namespace {

// --- the synthetic task -------------------------------------------------------------------------
// Documents of random length start with two random tokens; every later token is the sum of the two
// before it modulo the vocabulary (a Fibonacci rule). The first two tokens of a document cannot be
// predicted; everything after can, by attending to the two previous positions.
constexpr int64_t kVocab = 32;

struct Batch {
  Tensor input_ids, labels, position_ids, cu_seqlens; // [T], [T], [T], [docs + 1]
  int64_t valid_tokens = 0;
};

Batch make_batch(Rng& rng, int64_t rows, int64_t seq_len) {
  std::vector<int64_t> ids, labels, pos;
  std::vector<int32_t> cu{0};
  for (int64_t r = 0; r < rows; r++) {
    int64_t filled = 0;
    while (filled < seq_len) { // pack documents until the row is full (the last one is cut)
      int64_t len = std::min(rng.randint(8, 49), seq_len - filled);
      int64_t a = rng.randint(0, kVocab), b = rng.randint(0, kVocab);
      for (int64_t t = 0; t < len; t++) {
        int64_t tok = t == 0   ? a
                      : t == 1 ? b
                               : (ids[ids.size() - 1] + ids[ids.size() - 2]) % kVocab;
        ids.push_back(tok);
        pos.push_back(t);
      }
      // Position t predicts token t+1 of the same document; the first token's successor (t=0 ->
      // the random second token) is unpredictable and the last has none: both are ignored.
      for (int64_t t = 0; t < len; t++) {
        size_t at = ids.size() - size_t(len) + size_t(t);
        labels.push_back(t >= 1 && t + 1 < len ? ids[at + 1] : -100);
      }
      filled += len;
      cu.push_back(int32_t(cu.back() + len));
    }
  }
  Batch b;
  int64_t T = int64_t(ids.size());
  b.input_ids = Tensor::from_vector(ids, {T});
  b.labels = Tensor::from_vector(labels, {T});
  b.position_ids = Tensor::from_vector(pos, {T});
  b.cu_seqlens = Tensor::from_vector(cu, {int64_t(cu.size())});
  for (auto l : labels) b.valid_tokens += l != -100;
  return b;
}

// --- the model (Qwen3 layer shapes and names, tiny)
// ------------------------------------------------
struct TinyConfig {
  int64_t hidden = 64, heads = 4, kv_heads = 2, head_dim = 16, ffn = 192, layers = 2;
  double rope_theta = 10000.0, eps = 1e-6;
};

class DecoderLayer : public nn::Module {
public:
  explicit DecoderLayer(const TinyConfig& c) : c_(c) {
    auto& attn = *register_module("self_attn", std::make_shared<nn::Module>());
    q_ = attn.register_module("q_proj",
                              std::make_shared<nn::Linear>(c.hidden, c.heads * c.head_dim));
    k_ = attn.register_module("k_proj",
                              std::make_shared<nn::Linear>(c.hidden, c.kv_heads * c.head_dim));
    v_ = attn.register_module("v_proj",
                              std::make_shared<nn::Linear>(c.hidden, c.kv_heads * c.head_dim));
    o_ = attn.register_module("o_proj",
                              std::make_shared<nn::Linear>(c.heads * c.head_dim, c.hidden));
    q_norm_ = attn.register_module("q_norm", std::make_shared<nn::RMSNorm>(c.head_dim));
    k_norm_ = attn.register_module("k_norm", std::make_shared<nn::RMSNorm>(c.head_dim));
    auto& mlp = *register_module("mlp", std::make_shared<nn::Module>());
    gate_ = mlp.register_module("gate_proj", std::make_shared<nn::Linear>(c.hidden, c.ffn));
    up_ = mlp.register_module("up_proj", std::make_shared<nn::Linear>(c.hidden, c.ffn));
    down_ = mlp.register_module("down_proj", std::make_shared<nn::Linear>(c.ffn, c.hidden));
    in_norm_ = register_module("input_layernorm", std::make_shared<nn::RMSNorm>(c.hidden));
    post_norm_ =
        register_module("post_attention_layernorm", std::make_shared<nn::RMSNorm>(c.hidden));
  }
  std::string type_name() const override { return "DecoderLayer"; }

  // x: [T, hidden]
  Tensor forward(const Tensor& x, const Tensor& cu_seqlens, const RopeTables& rope_t) const {
    int64_t T = x.size(0);
    Tensor h = in_norm_->forward(x);
    Tensor q = q_norm_->forward(reshape(q_->forward(h), {T, c_.heads, c_.head_dim}));
    Tensor k = k_norm_->forward(reshape(k_->forward(h), {T, c_.kv_heads, c_.head_dim}));
    Tensor v = reshape(v_->forward(h), {T, c_.kv_heads, c_.head_dim});
    q = rope(q, rope_t);
    k = rope(k, rope_t);
    Tensor a = attention(q, k, v, cu_seqlens, true, 1.0 / std::sqrt(double(c_.head_dim)));
    Tensor x1 = add(x, o_->forward(reshape(a, {T, c_.heads * c_.head_dim})));
    Tensor h2 = post_norm_->forward(x1);
    return add(x1, down_->forward(swiglu(gate_->forward(h2), up_->forward(h2))));
  }

private:
  TinyConfig c_;
  std::shared_ptr<nn::Linear> q_, k_, v_, o_, gate_, up_, down_;
  std::shared_ptr<nn::RMSNorm> q_norm_, k_norm_, in_norm_, post_norm_;
};

class TinyCausalLM : public nn::Module {
public:
  explicit TinyCausalLM(const TinyConfig& c) : c_(c) {
    auto& model = *register_module("model", std::make_shared<nn::Module>());
    embed_ =
        model.register_module("embed_tokens", std::make_shared<nn::Embedding>(kVocab, c.hidden));
    layers_ = model.register_module("layers", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < c.layers; i++) layers_->append(std::make_shared<DecoderLayer>(c));
    norm_ = model.register_module("norm", std::make_shared<nn::RMSNorm>(c.hidden));
    head_ = register_module("lm_head", std::make_shared<nn::Linear>(c.hidden, kVocab));
  }
  std::string type_name() const override { return "TinyCausalLM"; }

  Tensor loss(const Batch& b, bool checkpoint_layers) const {
    RopeTables rt = rope_tables(b.position_ids, c_.head_dim, c_.rope_theta, DType::f32);
    Tensor x = embed_->forward(b.input_ids);
    for (size_t i = 0; i < layers_->size(); i++) {
      auto& layer = layers_->at<DecoderLayer>(i);
      if (checkpoint_layers) {
        // Runs again during backward, after this function returned: capture by value.
        auto fn = [&layer, cu_seqlens = b.cu_seqlens, rt](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{layer.forward(in[0], cu_seqlens, rt)};
        };
        x = checkpoint(fn, {x})[0];
      } else {
        x = layer.forward(x, b.cu_seqlens, rt);
      }
    }
    return cross_entropy(head_->forward(norm_->forward(x)), b.labels);
  }

private:
  TinyConfig c_;
  std::shared_ptr<nn::Embedding> embed_;
  std::shared_ptr<nn::ModuleList> layers_;
  std::shared_ptr<nn::RMSNorm> norm_;
  std::shared_ptr<nn::Linear> head_;
};

std::string format_seconds(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  return buf;
}

} // namespace

DemoResult run_demo(const DemoOptions& o) {
  VLM_CHECK(o.steps > 0 && o.rows > 0 && o.seq_len >= 8 && o.log_every > 0,
            "demo: steps, rows, log_every must be > 0 and seq_len >= 8 (got steps=", o.steps,
            " rows=", o.rows, " seq_len=", o.seq_len, " log_every=", o.log_every, ")");
  TinyConfig cfg;
  TinyCausalLM model(cfg);
  model.materialize();
  Rng init_rng(o.seed);
  model.initialize(init_rng);
  // Norm weights start at 1 and get no weight decay (nor do embeddings), as in the real trainer.
  optim::ParamGroup decay{"decay", {}, 1.0, 0.01}, no_decay{"no_decay", {}, 1.0, 0.0};
  for (auto& p : model.named_parameters()) {
    bool is_norm_or_embed = p.tensor.dim() == 1 || p.name.find("embed_tokens") != std::string::npos;
    (is_norm_or_embed ? no_decay : decay).params.push_back(p.tensor);
  }
  optim::AdamW opt({decay, no_decay});
  optim::LrScheduleConfig sc;
  sc.scheduler_type = optim::ScheduleType::cosine;
  sc.lr = 3e-3;
  sc.warmup_steps = std::max<int64_t>(1, o.steps / 20);
  sc.total_steps = o.steps;
  sc.min_lr_ratio = 0.1;
  optim::LrSchedule schedule(sc);
  const double max_grad_norm = 1.0;

  log_info("demo: tiny Qwen3-shaped LM, ", model.num_parameters(), " parameters, ", cfg.layers,
           " layers, hidden ", cfg.hidden, ", heads ", cfg.heads, "/", cfg.kv_heads, ", vocab ",
           kVocab, "; ", o.rows, " packed rows x ", o.seq_len, " tokens per step, ", o.steps,
           " steps", o.activation_checkpointing ? ", activation checkpointing" : "");
  std::ofstream metrics;
  if (!o.metrics_path.empty()) {
    metrics.open(o.metrics_path);
    metrics.precision(17); // losses must compare bit for bit across runs
    VLM_CHECK(metrics.good(), "demo: cannot write metrics file '", o.metrics_path, "'");
  }

  Rng data_rng(o.seed, 1);
  DemoResult result;
  double window_loss = 0;
  int64_t window_steps = 0, window_tokens = 0;
  auto start = std::chrono::steady_clock::now();
  auto window_start = start;
  for (int64_t step = 0; step < o.steps; step++) {
    Batch b = make_batch(data_rng, o.rows, o.seq_len);
    Tensor loss = model.loss(b, o.activation_checkpointing);
    loss.backward();
    double grad_norm = optim::clip_grad_norm(model.parameters(), max_grad_norm);
    double lr = schedule.lr_at(step);
    VLM_CHECK(std::isfinite(grad_norm), "demo: non-finite gradient norm at step ", step + 1);
    opt.step(lr);
    opt.zero_grad();

    double l = loss.item();
    window_loss += l;
    window_steps++;
    window_tokens += b.input_ids.numel();
    result.tokens += b.input_ids.numel();
    if ((step + 1) % o.log_every == 0 || step + 1 == o.steps) {
      auto now = std::chrono::steady_clock::now();
      double elapsed = std::chrono::duration<double>(now - start).count();
      double win = std::chrono::duration<double>(now - window_start).count();
      double mean = window_loss / double(window_steps);
      if (result.first_loss == 0) result.first_loss = mean;
      result.last_loss = mean;
      double eta = elapsed / double(step + 1) * double(o.steps - step - 1);
      std::printf("step %4lld/%lld | loss %.4f | lr %.2e | grad_norm %.3f | %.0f tok/s | ETA %s\n",
                  (long long)(step + 1), (long long)o.steps, mean, lr, grad_norm,
                  double(window_tokens) / win, format_seconds(eta).c_str());
      std::fflush(stdout);
      if (metrics.is_open())
        metrics << "{\"step\": " << step + 1 << ", \"loss\": " << mean << ", \"lr\": " << lr
                << ", \"grad_norm\": " << grad_norm
                << ", \"tokens_per_s\": " << double(window_tokens) / win << "}\n";
      window_loss = 0;
      window_steps = window_tokens = 0;
      window_start = now;
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto mem = allocator_for(Device::cpu()).stats();
  std::printf("demo done: loss %.4f -> %.4f in %s (%lld tokens, %.0f tok/s, peak tensor memory "
              "%.1f MiB)\n",
              result.first_loss, result.last_loss, format_seconds(result.seconds).c_str(),
              (long long)result.tokens, double(result.tokens) / result.seconds,
              double(mem.peak_bytes) / (1 << 20));
  return result;
}

} // namespace vlm::train
