#include "src/train/train_state.h"

#include <algorithm>
#include <limits>
#include <set>

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
// or this rank's boxes of the whole tensor when the rank holds a part.
void save_tensor(const TrainState& s, io::StateWriter& out, const std::string& key,
                 const std::string& name, const Tensor& value) {
  auto it = s.layouts.find(name);
  if (it == s.layouts.end()) return out.write_tensor(key, value);
  const parallel::ParamLayout& layout = it->second;
  VLM_CHECK(!layout.full_shape.empty(), "TrainState: the 0-dim parameter '", name,
            "' is held in part");
  NoGradGuard no_grad;
  std::vector<io::Slab> slabs;
  if (layout.writes)
    for (const parallel::ParamBox& box : layout.boxes)
      slabs.push_back({box.global_offset, parallel::local_box(value.detach(), box)});
  out.write_slab(key, layout.full_shape, value.dtype(), slabs);
}

// Reads `key` into `value`: whole, or this rank's boxes of the stored whole tensor.
void load_tensor(const TrainState& s, const io::StateReader& in, const std::string& key,
                 const std::string& name, Tensor value) {
  auto it = s.layouts.find(name);
  if (it == s.layouts.end()) return in.read_tensor_into(key, value);
  const parallel::ParamLayout& layout = it->second;
  const Shape stored = in.shape(key);
  VLM_CHECK(stored == layout.full_shape, "TrainState: '", key, "' holds shape ", shape_str(stored),
            " but this model's '", name, "' is ", shape_str(layout.full_shape));
  NoGradGuard no_grad;
  for (const parallel::ParamBox& box : layout.boxes) {
    Tensor part = Tensor::empty(box.shape, value.dtype(), value.device());
    in.read_slab_into(key, box.global_offset, part);
    Tensor dst = parallel::local_box(value.detach(), box); // a view: written in place
    copy_(dst, part);
  }
}

// Checked readers of the /state document: each error names the key and what was expected.
const nlohmann::json& member(const nlohmann::json& obj, const std::string& key) {
  VLM_CHECK(obj.is_object() && obj.contains(key), "/state has no '", key, "'");
  return obj[key];
}

// obj[key] as an integer in [lo, hi]; `label` names it in the error ("" = the key).
int64_t int_member(const nlohmann::json& obj, const std::string& key, int64_t lo, int64_t hi,
                   const std::string& what, const std::string& label = "") {
  const nlohmann::json& v = member(obj, key);
  VLM_CHECK(v.is_number_integer() &&
                !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) &&
                v.get<int64_t>() >= lo && v.get<int64_t>() <= hi,
            "/state ", label.empty() ? "'" + key + "'" : label, " = ", v.dump(), ": expected ",
            what, " (an integer in [", lo, ", ", hi, "])");
  return v.get<int64_t>();
}

} // namespace

void TrainState::restore_loader(const nlohmann::json& saved) const {
  const int64_t ranks = dp ? dp->size() : 1, rank = dp ? dp->rank() : 0;
  VLM_CHECK(saved.is_array() && !saved.empty(),
            "/state 'loaders': no data position (saved without a loader)");
  if (int64_t(saved.size()) != ranks) {
    if (rank == 0)
      log_warn("resume: the checkpoint was saved by ", saved.size(),
               " data-parallel rank(s), this run has ", ranks,
               "; each rank reads its own share of the data, so the data position does not "
               "carry over: the data starts over from its beginning");
    return;
  }
  // The error names the checkpoint's document and this run's data: the saved position is what
  // does not fit (load_checkpoint adds the checkpoint's folder).
  try {
    loader->restore(io::LoaderState::from_json(saved.at(size_t(rank))));
  } catch (const Error& e) {
    VLM_FAIL("/state 'loaders'[", rank, "] (the data position saved for data-parallel rank ", rank,
             ") does not fit data.data_path = '", loader->config().dataset, "' split '",
             loader->config().split,
             "' (the checkpoint was saved for other data, or is damaged): ", e.what());
  }
}

void TrainState::check(const io::StateReader& in, const nlohmann::json& s) const {
  const nlohmann::json& sched = member(s, "schedule");
  VLM_CHECK(sched == schedule_json(*schedule), "the state was saved with the LR schedule ",
            sched.dump(), " but this run has ", schedule_json(*schedule).dump());
  const int64_t total = schedule->config().total_steps;
  const int64_t done = int_member(s, "step", 0, total,
                                  "the optimizer steps done, at most the schedule's total_steps");
  int_member(s, "tokens", 0, std::numeric_limits<int64_t>::max(), "a token count");
  int_member(s, "padded_tokens", 0, std::numeric_limits<int64_t>::max(), "a token count");
  int_member(s, "skipped_steps", 0, done, "the updates skipped, at most 'step'");
  const nlohmann::json& r = member(s, "rng");
  VLM_CHECK(r.is_array() && r.size() == 5 &&
                std::all_of(r.begin(), r.end(),
                            [](const nlohmann::json& w) { return w.is_number_unsigned(); }),
            "/state 'rng' = ", r.dump().substr(0, 200), ": expected 5 unsigned 64-bit words");
  const nlohmann::json& steps = member(s, "optimizer_steps");
  VLM_CHECK(steps.is_object(), "/state 'optimizer_steps' is not an object");
  for (const auto& [name, v] : steps.items())
    int_member(steps, name, 0, done, "the AdamW steps of a parameter, at most 'step'",
               "'optimizer_steps'['" + name + "']");
  const nlohmann::json& loaders = member(s, "loaders");
  VLM_CHECK(loaders.is_array(), "/state 'loaders' is not a list");

  // Every tensor against this run's model and optimizer, before any is read: its own shape
  // (whole, also where this rank holds a shard) and dtype; and no tensor of another model.
  std::map<std::string, Shape> shapes;
  std::set<std::string> names;
  for (const auto& p : model->named_parameters()) {
    auto it = layouts.find(p.name);
    shapes[p.name] = it == layouts.end() ? p.tensor.shape() : it->second.full_shape;
    names.insert(p.name);
    io::check_state_tensor(in, "model/" + p.name, shapes[p.name], p.tensor.dtype());
  }
  io::check_state_group(in, "model", names);
  io::check_state_group(in, "optim", names);
  for (const std::string& name : optimizer->param_names()) {
    if (!steps.contains(name)) continue; // not trained when saved: fresh AdamW state (load)
    const optim::AdamWState& st = optimizer->state(name);
    io::check_state_tensor(in, optim_key(name, "exp_avg"), shapes.at(name), st.exp_avg.dtype());
    io::check_state_tensor(in, optim_key(name, "exp_avg_sq"), shapes.at(name),
                           st.exp_avg_sq.dtype());
    if (st.master.defined())
      io::check_state_tensor(in, optim_key(name, "master"), shapes.at(name), st.master.dtype());
  }
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
  model::write_stored_tensors(out, model->stored());
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
  check(in, s);
  model::StoredTensors stored = model::read_stored_tensors(in);
  // The loader first: it refuses a state of another data configuration before changing anything.
  if (loader) restore_loader(s.at("loaders"));
  NoGradGuard no_grad;
  std::map<std::string, Tensor> params;
  for (const auto& p : model->named_parameters()) {
    load_tensor(*this, in, "model/" + p.name, p.name, p.tensor);
    params[p.name] = p.tensor;
  }
  if (!stored.empty()) model->stored() = std::move(stored);
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
  const auto r = s.at("rng").get<std::vector<uint64_t>>(); // 5 words: check()
  rng.set_state({r[0], r[1], r[2], r[3], r[4]});
}

} // namespace vlm::train
