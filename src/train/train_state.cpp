#include "src/train/train_state.h"

#include <nlohmann/json.hpp>

#include "src/base/check.h"
#include "src/core/autograd.h"

namespace vlm::train {

namespace {

void check_complete(const TrainState& s) {
  VLM_CHECK(s.model && s.optimizer && s.schedule && s.loader,
            "TrainState: model, optimizer, schedule and loader must all be set");
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

} // namespace

void TrainState::save(io::StateWriter& out) const {
  check_complete(*this);
  for (const auto& p : model->named_parameters()) out.write_tensor("model/" + p.name, p.tensor);
  nlohmann::json optim_steps = nlohmann::json::object();
  for (const std::string& name : optimizer->param_names()) {
    const optim::AdamWState& st = optimizer->state(name);
    out.write_tensor(optim_key(name, "exp_avg"), st.exp_avg);
    out.write_tensor(optim_key(name, "exp_avg_sq"), st.exp_avg_sq);
    if (st.master.defined()) out.write_tensor(optim_key(name, "master"), st.master);
    optim_steps[name] = st.step;
  }
  const auto r = rng.state();
  out.write_json("state", {{"step", step},
                           {"tokens", tokens},
                           {"padded_tokens", padded_tokens},
                           {"skipped_steps", skipped_steps},
                           {"rng", std::vector<uint64_t>(r.begin(), r.end())},
                           {"optimizer_steps", optim_steps},
                           {"schedule", schedule_json(*schedule)},
                           {"loader", loader->state().to_json()}});
}

void TrainState::load(const io::StateReader& in) {
  check_complete(*this);
  const nlohmann::json s = in.read_json("state");
  VLM_CHECK(s.at("schedule") == schedule_json(*schedule),
            "TrainState: the state was saved with the LR schedule ", s.at("schedule").dump(),
            " but this run has ", schedule_json(*schedule).dump());
  // The loader first: it refuses a state of another data configuration before changing anything.
  loader->restore(io::LoaderState::from_json(s.at("loader")));
  NoGradGuard no_grad;
  for (const auto& p : model->named_parameters()) {
    Tensor t = p.tensor;
    in.read_tensor_into("model/" + p.name, t);
  }
  const nlohmann::json& optim_steps = s.at("optimizer_steps");
  for (const std::string& name : optimizer->param_names()) {
    optim::AdamWState& st = optimizer->state(name);
    in.read_tensor_into(optim_key(name, "exp_avg"), st.exp_avg);
    in.read_tensor_into(optim_key(name, "exp_avg_sq"), st.exp_avg_sq);
    if (st.master.defined()) in.read_tensor_into(optim_key(name, "master"), st.master);
    VLM_CHECK(optim_steps.contains(name), "TrainState: no optimizer step count for '", name, "'");
    st.step = optim_steps.at(name).get<int64_t>();
  }
  step = s.at("step").get<int64_t>();
  tokens = s.at("tokens").get<int64_t>();
  padded_tokens = s.at("padded_tokens").get<int64_t>();
  skipped_steps = s.at("skipped_steps").get<int64_t>();
  const auto r = s.at("rng").get<std::vector<uint64_t>>();
  VLM_CHECK(r.size() == 5, "TrainState: the RNG state has ", r.size(), " words, expected 5");
  rng.set_state({r[0], r[1], r[2], r[3], r[4]});
}

} // namespace vlm::train
