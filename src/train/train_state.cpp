#include "src/train/train_state.h"

#include <nlohmann/json.hpp>

#include "src/base/check.h"
#include "src/base/logging.h"
#include "src/core/autograd.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::train {

namespace {

void check_complete(const TrainState& s) {
  VLM_CHECK(s.model && s.optimizer && s.schedule,
            "TrainState: model, optimizer and schedule must all be set");
}

nlohmann::json schedule_json(const optim::LrSchedule& schedule) {
  const optim::LrScheduleConfig& c = schedule.config();
  return {{"scheduler_type", optim::schedule_type_name(c.scheduler_type)},
          {"lr", c.lr},
          {"warmup_steps", c.warmup_steps},
          {"total_steps", c.total_steps},
          {"min_lr_ratio", c.min_lr_ratio},
          {"wsd_decay_ratio", c.wsd_decay_ratio},
          {"wsd_decay", c.wsd_decay == optim::WsdDecay::linear ? "linear" : "cosine"}};
}

std::string optim_key(const std::string& name, const char* what) {
  return "optim/" + name + "/" + what;
}

// Writes `value` (the tensor of parameter `name`, or one of its AdamW tensors) under `key`: whole,
// or this rank's rows of the whole tensor when the parameter is sharded.
void save_tensor(const TrainState& s, io::StateWriter& out, const std::string& key,
                 const std::string& name, const Tensor& value) {
  auto it = s.sharded.find(name);
  if (it == s.sharded.end()) return out.write_tensor(key, value);
  const parallel::ShardRows& rows = it->second;
  VLM_CHECK(!rows.full_shape.empty(), "TrainState: the 0-dim parameter '", name,
            "' is sharded; checkpoints shard dim 0");
  NoGradGuard no_grad;
  const bool any = rows.writes && rows.rows > 0;
  out.write_rows(key, rows.full_shape, value.dtype(), rows.row_begin,
                 any ? slice(value.detach(), 0, 0, rows.rows) : Tensor());
}

// Reads `key` into `value`: whole, or this rank's rows of the stored whole tensor.
void load_tensor(const TrainState& s, const io::StateReader& in, const std::string& key,
                 const std::string& name, Tensor value) {
  auto it = s.sharded.find(name);
  if (it == s.sharded.end()) return in.read_tensor_into(key, value);
  const parallel::ShardRows& rows = it->second;
  const Shape stored = in.shape(key);
  VLM_CHECK(stored == rows.full_shape, "TrainState: '", key, "' holds shape ", shape_str(stored),
            " but this model's '", name, "' is ", shape_str(rows.full_shape));
  if (rows.rows == 0) return;
  NoGradGuard no_grad;
  Tensor mine = slice(value.detach(), 0, 0, rows.rows); // a view: read in place
  in.read_rows_into(key, rows.row_begin, mine);
}

} // namespace

void TrainState::restore_loader(const nlohmann::json& saved) const {
  const int64_t ranks = dp ? dp->size() : 1, rank = dp ? dp->rank() : 0;
  VLM_CHECK(saved.is_array() && !saved.empty(),
            "TrainState: the state has no data position (saved without a loader)");
  if (int64_t(saved.size()) != ranks) {
    if (rank == 0)
      log_warn("resume: the checkpoint was saved by ", saved.size(),
               " data-parallel rank(s), this run has ", ranks,
               "; each rank reads its own share of the data, so the data position does not "
               "carry over: the data starts over from its beginning");
    return;
  }
  loader->restore(io::LoaderState::from_json(saved.at(size_t(rank))));
}

void TrainState::save(io::StateWriter& out) const {
  check_complete(*this);
  for (const auto& p : model->named_parameters())
    save_tensor(*this, out, "model/" + p.name, p.name, p.tensor);
  nlohmann::json optim_steps = nlohmann::json::object();
  for (const std::string& name : optimizer->param_names()) {
    const optim::AdamWState& st = optimizer->state(name);
    save_tensor(*this, out, optim_key(name, "exp_avg"), name, st.exp_avg);
    save_tensor(*this, out, optim_key(name, "exp_avg_sq"), name, st.exp_avg_sq);
    if (st.master.defined()) save_tensor(*this, out, optim_key(name, "master"), name, st.master);
    optim_steps[name] = st.step;
  }
  // Every data-parallel rank's loader position (collective: each rank gives its own).
  nlohmann::json loaders = nlohmann::json::array();
  if (loader) {
    const std::string mine = loader->state().serialize();
    for (const std::string& s : dp ? dp->all_gather_strings(mine) : std::vector{mine})
      loaders.push_back(nlohmann::json::parse(s));
  }
  const auto r = rng.state();
  out.write_json("state", {{"step", step},
                           {"tokens", tokens},
                           {"padded_tokens", padded_tokens},
                           {"skipped_steps", skipped_steps},
                           {"rng", std::vector<uint64_t>(r.begin(), r.end())},
                           {"optimizer_steps", optim_steps},
                           {"schedule", schedule_json(*schedule)},
                           {"loaders", loaders}});
}

void TrainState::load(const io::StateReader& in) {
  check_complete(*this);
  const nlohmann::json s = in.read_json("state");
  VLM_CHECK(s.at("schedule") == schedule_json(*schedule),
            "TrainState: the state was saved with the LR schedule ", s.at("schedule").dump(),
            " but this run has ", schedule_json(*schedule).dump());
  // The loader first: it refuses a state of another data configuration before changing anything.
  if (loader) restore_loader(s.at("loaders"));
  NoGradGuard no_grad;
  std::map<std::string, Tensor> params;
  for (const auto& p : model->named_parameters()) {
    load_tensor(*this, in, "model/" + p.name, p.name, p.tensor);
    params[p.name] = p.tensor;
  }
  const nlohmann::json& optim_steps = s.at("optimizer_steps");
  std::vector<std::string> fresh; // trained now, not when saved
  for (const std::string& name : optimizer->param_names()) {
    optim::AdamWState& st = optimizer->state(name);
    if (!optim_steps.contains(name)) {
      fresh.push_back(name);
      fill_(st.exp_avg, 0.0);
      fill_(st.exp_avg_sq, 0.0);
      if (st.master.defined()) copy_(st.master, params.at(name).detach().to(DType::f32));
      st.step = 0;
      continue;
    }
    load_tensor(*this, in, optim_key(name, "exp_avg"), name, st.exp_avg);
    load_tensor(*this, in, optim_key(name, "exp_avg_sq"), name, st.exp_avg_sq);
    if (st.master.defined()) load_tensor(*this, in, optim_key(name, "master"), name, st.master);
    st.step = optim_steps.at(name).get<int64_t>();
  }
  if (!fresh.empty())
    log_info("resume: ", fresh.size(),
             " trained parameter(s) have no optimizer state in the checkpoint (frozen when it "
             "was saved) and start with fresh AdamW state, e.g. '",
             fresh.front(), "'");
  step = s.at("step").get<int64_t>();
  tokens = s.at("tokens").get<int64_t>();
  padded_tokens = s.at("padded_tokens").get<int64_t>();
  skipped_steps = s.at("skipped_steps").get<int64_t>();
  const auto r = s.at("rng").get<std::vector<uint64_t>>();
  VLM_CHECK(r.size() == 5, "TrainState: the RNG state has ", r.size(), " words, expected 5");
  rng.set_state({r[0], r[1], r[2], r[3], r[4]});
}

} // namespace vlm::train
