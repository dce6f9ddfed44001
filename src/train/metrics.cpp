#include "src/train/metrics.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "src/base/check.h"

namespace vlm::train {

MetricsLog::MetricsLog(const std::string& path, int64_t keep_through_step) : path_(path) {
  if (path.empty()) return;
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  std::string kept;
  if (keep_through_step >= 0) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
          j["step"].get<int64_t>() <= keep_through_step)
        kept += line + "\n";
    }
  }
  out_.open(path, std::ios::trunc);
  out_ << kept;
  VLM_CHECK(out_.good(), "metrics: cannot write '", path, "'");
}

void MetricsLog::write_step(const StepRecord& r) {
  if (!out_.is_open()) return;
  const double tflops = r.seconds > 0 ? r.flops / r.seconds / 1e12 : 0.0;
  nlohmann::json j = {{"step", r.stats.step + 1},
                      {"loss", r.stats.loss},
                      {"lr", {{"llm", r.stats.lr}}},
                      {"grad_norm", r.stats.grad_norm},
                      {"tokens", r.real_tokens},
                      {"padded_tokens", r.padded_tokens},
                      {"targets", r.stats.targets},
                      {"micro_batches", r.stats.micro_batches},
                      {"tokens_per_s", r.seconds > 0 ? double(r.real_tokens) / r.seconds : 0.0},
                      {"tflops", tflops},
                      {"mfu", nullptr},
                      {"peak_memory_bytes", r.peak_memory_bytes},
                      {"elapsed_s", r.elapsed},
                      {"skipped", r.stats.skipped},
                      {"samples_read", r.samples_read},
                      {"samples_skipped", r.skips.total()},
                      {"skip_reasons", r.skips.counts}};
  if (r.peak_tflops > 0) j["mfu"] = tflops / r.peak_tflops;
  // nlohmann prints doubles round-trip exact (17 significant digits where needed).
  out_ << j.dump() << '\n';
  out_.flush();
  VLM_CHECK(out_.good(), "metrics: writing '", path_, "' failed");
}

void MetricsLog::write_eval(int64_t step, double loss, int64_t targets) {
  if (!out_.is_open()) return;
  out_ << nlohmann::json{{"step", step},
                         {"eval_loss", loss},
                         {"eval_ppl", std::exp(loss)},
                         {"eval_targets", targets}}
              .dump()
       << '\n';
  out_.flush();
}

void ProgressWindow::add(const StepRecord& r) {
  steps_++;
  seconds_ += r.seconds;
  flops_ += r.flops;
  tokens_ += r.real_tokens;
  last_lr_ = r.stats.lr;
  if (r.stats.skipped) {
    skipped_++;
    return;
  }
  loss_ += r.stats.loss;
  last_grad_norm_ = r.stats.grad_norm;
  counted_++;
}

double ProgressWindow::mean_loss() const { return counted_ ? loss_ / double(counted_) : NAN; }

std::string ProgressWindow::line(int64_t step, int64_t total, double eta_seconds) const {
  char buf[256];
  const int width = int(std::to_string(total).size());
  int n = std::snprintf(buf, sizeof buf,
                        "step %*lld/%lld | loss %.4f | lr %.2e | grad_norm %.3f | %.0f tok/s | "
                        "%.3f TFLOP/s | ETA %s",
                        width, (long long)step, (long long)total, mean_loss(), last_lr_,
                        last_grad_norm_, seconds_ > 0 ? double(tokens_) / seconds_ : 0.0,
                        seconds_ > 0 ? flops_ / seconds_ / 1e12 : 0.0,
                        format_duration(eta_seconds).c_str());
  std::string s(buf, size_t(std::max(0, n)));
  if (skipped_) s += " | skipped " + std::to_string(skipped_);
  return s;
}

std::string format_duration(double seconds) {
  char buf[32];
  const long long s = std::llround(std::max(0.0, seconds));
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%llds", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, s % 3600 / 60);
  return buf;
}

} // namespace vlm::train
