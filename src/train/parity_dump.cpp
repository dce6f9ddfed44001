#include "src/train/parity_dump.h"

#include <cstdio>
#include <vector>

#include "io/state/safetensors.h"
#include "model/batch_file.h"
#include "model/hf_weights.h"
#include "model/lm_loss.h"
#include "model/model_spec.h"
#include "parallel/parallelize.h"
#include "src/base/logging.h"
#include "src/core/autograd.h"

namespace vlm::train {

DumpResult run_dump(const DumpOptions& o) {
  VLM_CHECK(!o.model_dir.empty() && !o.batch_path.empty() && !o.out_path.empty(),
            "dump: --model, --batch and --out are required");
  check_device_available(o.device, "dump: --device");
  auto net = model::load_pretrained(o.model_dir, o.dtype);
  const parallel::Parallelized parallelized =
      parallel::parallelize(*net, net->blocks(), parallel::ParallelGroups{}, {o.ac, {}}, o.device);
  model::Batch host = model::read_batch_file(o.batch_path, net->has_vision());
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
    model::save_hf_snapshot(*net, net->hf_config(), o.export_dir, o.dtype, o.model_dir,
                            model::kDefaultMaxShardBytes, {}, &net->stored());

  DumpResult r;
  r.loss = out.loss.item();
  r.tokens = batch.input_ids.numel();
  r.targets = out.num_targets;
  std::printf("dump: loss %.7f over %lld targets (%lld tokens) -> %s\n", r.loss,
              (long long)r.targets, (long long)r.tokens, o.out_path.c_str());
  return r;
}

} // namespace vlm::train
