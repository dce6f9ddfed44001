#include "src/train/cmd_dump.h"

#include <cstdio>
#include <cstring>
#include <map>

#include "io/safetensors.h"
#include "model/hf_weights.h"
#include "model/lm_loss.h"
#include "model/model_spec.h"
#include "src/base/logging.h"
#include "src/core/autograd.h"

namespace vlm::train {

namespace {

const char* kUsage = R"(usage: vlmtrain dump --model DIR --batch FILE --out FILE [options]
  One forward (and with --grads one backward) of the HF snapshot DIR (any registered model_type)
  on the batch in FILE (safetensors: input_ids, labels (HF-aligned), position_ids, cu_seqlens),
  writing logits [T, V] f32, loss (mean over valid targets) and with --grads every parameter
  gradient under its HF name.
  --grads                also run backward and write the gradients
  --dtype f32|bf16       parameter and compute dtype (default f32; logits and loss are f32)
  --ac off|full|selective  activation checkpointing (default off; results are identical)
  --device cpu|cuda[:N]  where to run (default cpu)
  --export DIR           also write the loaded model as an HF snapshot to DIR (same dtype)
)";

Tensor read_key(const io::SafetensorsFile& f, const std::string& key) {
  VLM_CHECK(f.contains(key), f.path(), ": batch has no tensor '", key,
            "' (a batch needs input_ids, labels, position_ids, cu_seqlens)");
  const io::TensorInfo& info = f.get(key);
  Tensor t = Tensor::empty(info.shape, info.dtype);
  if (info.nbytes) std::memcpy(t.data_ptr(), info.data, info.nbytes);
  return t;
}

} // namespace

model::Batch read_batch_file(const std::string& path, bool vision) {
  io::SafetensorsFile f(path);
  model::Batch b;
  try {
    b = model::batch_from_labels(read_key(f, "input_ids"), read_key(f, "labels"),
                                 read_key(f, "position_ids"), read_key(f, "cu_seqlens"));
  } catch (const Error& e) {
    if (std::strstr(e.what(), path.c_str())) throw;
    VLM_FAIL(path, ": ", e.what());
  }
  for (const char* key : {"pixel_values", "image_grid_thw"}) {
    if (!f.contains(key)) continue;
    if (!vision) {
      log_info(path, ": ignoring '", key, "' (a text-only model has no vision tower)");
      continue;
    }
    (std::string(key) == "pixel_values" ? b.pixel_values : b.image_grid_thw) = read_key(f, key);
  }
  return b;
}

DumpResult run_dump(const DumpOptions& o) {
  VLM_CHECK(!o.model_dir.empty() && !o.batch_path.empty() && !o.out_path.empty(),
            "dump: --model, --batch and --out are required\n", kUsage);
  check_device_available(o.device, "dump: --device");
  auto net = model::load_pretrained(o.model_dir, o.dtype);
  parallel::apply_activation_checkpointing(net->blocks(), o.ac);
  net->to(o.device);
  model::Batch host = read_batch_file(o.batch_path, net->has_vision());
  try { // on the host, before any kernel sees it, as the trainer does
    model::validate_batch(host, net->vocab_size());
  } catch (const Error& e) {
    VLM_FAIL(o.batch_path, ": ", e.what());
  }
  const model::Batch batch = model::to_device(host, o.device);
  log_info("dump: ", net->summary(), " in ", dtype_name(o.dtype), " on ", o.device.str(), ", ",
           batch.input_ids.numel(), " tokens, ", batch.cu_seqlens.numel() - 1, " documents, ac ",
           parallel::ac_mode_name(o.ac));

  model::LMOutput out;
  if (o.grads) {
    net->zero_grad();
    out = model::lm_forward(*net, batch);
    out.loss.backward();
  } else {
    NoGradGuard no_grad;
    out = model::lm_forward(*net, batch);
  }

  // Everything written in f32; kept alive until the file is written.
  std::vector<Tensor> keep;
  std::vector<io::TensorInfo> infos;
  auto add = [&](const std::string& name, const Tensor& t) {
    Tensor c = t.detach().to(Device::cpu()).to(DType::f32).contiguous();
    keep.push_back(c);
    infos.push_back({name, DType::f32, c.shape(), c.data_ptr(), c.nbytes()});
  };
  add("logits", out.logits);
  add("loss", out.loss);
  if (o.grads) {
    for (const auto& p : net->named_parameters()) {
      VLM_CHECK(p.tensor.grad().defined(), "dump: parameter ", p.name, " got no gradient");
      add(p.name, p.tensor.grad());
    }
  }
  io::write_safetensors(o.out_path, infos,
                        {{"model", o.model_dir},
                         {"batch", o.batch_path},
                         {"dtype", dtype_name(o.dtype)},
                         {"ac", parallel::ac_mode_name(o.ac)},
                         {"device", o.device.str()}});
  if (!o.export_dir.empty())
    model::save_hf_snapshot(*net, net->hf_config(), o.export_dir, o.dtype, o.model_dir);

  DumpResult r;
  r.loss = out.loss.item();
  r.tokens = batch.input_ids.numel();
  r.targets = out.num_targets;
  std::printf("dump: loss %.7f over %lld targets (%lld tokens) -> %s\n", r.loss,
              (long long)r.targets, (long long)r.tokens, o.out_path.c_str());
  return r;
}

int cmd_dump(const std::vector<std::string>& args) {
  DumpOptions o;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      VLM_CHECK(i + 1 < args.size(), "option ", a, " needs a value\n", kUsage);
      return args[++i];
    };
    if (a == "--model")
      o.model_dir = value();
    else if (a == "--batch")
      o.batch_path = value();
    else if (a == "--out")
      o.out_path = value();
    else if (a == "--grads")
      o.grads = true;
    else if (a == "--dtype")
      o.dtype = parse_model_dtype(value(), "--dtype");
    else if (a == "--ac")
      o.ac = parallel::parse_ac_mode(value());
    else if (a == "--device")
      o.device = parse_device(value());
    else if (a == "--export")
      o.export_dir = value();
    else if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else
      VLM_FAIL("unknown option '", a, "' for `vlmtrain dump`\n", kUsage);
  }
  run_dump(o);
  return 0;
}

} // namespace vlm::train
