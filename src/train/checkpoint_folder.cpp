#include "src/train/checkpoint_folder.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <utility>

#include "src/base/check.h"
#include "src/base/logging.h"

namespace vlm::train {

namespace fs = std::filesystem;

namespace {

const std::regex kStepName(R"(step_(\d{1,18}))");
const std::regex kSnapshotName(R"(checkpoint-step-(\d{1,18}))");

fs::path without_trailing_slash(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path(); // "step_000004/"
  return p;
}

// A path as given, or where it leads when it is a link (output_dir/latest -> its step_N).
fs::path followed(const std::string& path) {
  fs::path p = without_trailing_slash(path);
  std::error_code ec;
  if (fs::is_symlink(p, ec)) {
    const fs::path target = fs::canonical(p, ec);
    if (!ec) return target;
  }
  return p;
}

int64_t step_in(const std::string& name, const std::regex& re) {
  std::smatch m;
  return std::regex_match(name, m, re) ? std::stoll(m[1].str()) : -1;
}

// "a, b, c and 4 more"
std::string name_list(const std::vector<std::string>& paths, size_t shown = 4) {
  std::string out;
  for (size_t i = 0; i < paths.size() && i < shown; i++)
    out += (i ? ", " : "") + fs::path(paths[i]).filename().string();
  if (paths.size() > shown) out += " and " + std::to_string(paths.size() - shown) + " more";
  return out;
}

void sort_by_step(std::vector<std::string>& paths) {
  std::sort(paths.begin(), paths.end(), [](const std::string& a, const std::string& b) {
    return std::make_pair(checkpoint_step_of(a), a) < std::make_pair(checkpoint_step_of(b), b);
  });
}

bool same_folder(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  return fs::equivalent(a, b, ec);
}

// The newest complete checkpoint of a folder by its `latest` link, else (no link) its newest
// complete step_N; "" when it holds none. Damage is an error naming `what`.
std::string latest_of(const CheckpointFolder& f, const std::string& what) {
  VLM_CHECK(!f.latest_not_link, what, ": ", f.dir,
            "/latest is not a link (a file or folder of that name): vlmtrain keeps a link there "
            "to the newest checkpoint; move it away");
  const std::string others = f.complete.empty()
                                 ? std::string()
                                 : "; the complete checkpoints are " + name_list(f.complete, 8) +
                                       ": resume from one with checkpoint.resume = PATH";
  if (!f.latest.empty() || f.latest_dangles) {
    VLM_CHECK(!f.latest_dangles && fs::exists(f.latest), what, ": ", f.dir, "/latest names ",
              f.latest, ", which is not there", others);
    VLM_CHECK(is_checkpoint_dir(f.latest), what, ": ", f.dir, "/latest names ", f.latest,
              ", which is damaged (no state.h5)", others);
    return f.latest;
  }
  VLM_CHECK(f.damaged.empty(), what, ": ", f.dir,
            " has no `latest` link and damaged checkpoint "
            "folders (step_N without state.h5): ",
            name_list(f.damaged, 8),
            f.complete.empty() ? std::string("; no complete one")
                               : "; the complete ones are " + name_list(f.complete, 8) +
                                     ": resume from one with checkpoint.resume = PATH");
  if (f.complete.empty()) return "";
  log_info("resume: ", f.dir,
           " has no `latest` link (a crash before its first one); taking its "
           "newest complete checkpoint ",
           f.complete.back());
  return f.complete.back();
}

// A name in `parent` that is not taken: base, base.2, base.3, ...
fs::path free_name(const fs::path& parent, const std::string& base) {
  std::error_code ec;
  fs::path p = parent / base;
  for (int k = 2; fs::exists(fs::symlink_status(p, ec)); k++)
    p = parent / (base + "." + std::to_string(k));
  return p;
}

} // namespace

void point_latest_at(const std::string& output_dir, const std::string& dir) {
  std::error_code ec;
  const fs::path link = fs::path(output_dir) / "latest",
                 tmp_link = fs::path(output_dir) / "latest.tmp";
  fs::remove(tmp_link, ec);
  fs::create_directory_symlink(without_trailing_slash(dir).filename(), tmp_link, ec);
  VLM_CHECK(!ec, "checkpoint: cannot create the link ", tmp_link.string(), ": ", ec.message());
  fs::rename(tmp_link, link, ec);
  VLM_CHECK(!ec, "checkpoint: cannot update ", link.string(), ": ", ec.message());
}

void rotate_checkpoints(const std::string& output_dir, int64_t keep_last) {
  if (keep_last <= 0) return;
  const CheckpointFolder f = scan_checkpoint_folder(output_dir);
  std::error_code ec;
  for (size_t i = 0; i + size_t(keep_last) < f.complete.size(); i++) {
    if (!f.latest.empty() && same_folder(f.complete[i], f.latest)) continue;
    fs::remove_all(f.complete[i], ec);
    if (ec) log_warn("checkpoint: cannot remove the old ", f.complete[i], ": ", ec.message());
  }
}

std::string checkpoint_step_dir(const std::string& output_dir, int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step_%06lld", (long long)step);
  return (fs::path(output_dir) / name).string();
}

std::string hf_snapshot_dir(const std::string& output_dir, int64_t step) {
  return (fs::path(output_dir) / ("checkpoint-step-" + std::to_string(step))).string();
}

std::string checkpoint_state_file(const std::string& dir) {
  return (fs::path(dir) / "state.h5").string();
}

int64_t checkpoint_step_of(const std::string& dir) {
  const std::string name = without_trailing_slash(dir).filename().string();
  const int64_t step = step_in(name, kStepName);
  return step >= 0 ? step : step_in(name, kSnapshotName);
}

bool is_checkpoint_dir(const std::string& dir) {
  fs::path p = without_trailing_slash(dir);
  std::error_code ec;
  if (fs::is_symlink(p, ec)) p = fs::canonical(p, ec);
  return !ec && step_in(p.filename().string(), kStepName) >= 0 &&
         fs::is_regular_file(checkpoint_state_file(p.string()), ec);
}

bool CheckpointFolder::has_run() const {
  return !complete.empty() || !damaged.empty() || !snapshots.empty() || !latest.empty() ||
         latest_dangles || latest_not_link || abandoned;
}

std::string CheckpointFolder::describe() const {
  std::vector<std::string> all = complete;
  all.insert(all.end(), damaged.begin(), damaged.end());
  sort_by_step(all);
  std::string out = name_list(all);
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : ", ") + s; };
  if (!snapshots.empty()) add(name_list(snapshots));
  if (!latest.empty() || latest_dangles) add("latest -> " + fs::path(latest).filename().string());
  if (latest_not_link) add("a 'latest' that is not a link");
  if (abandoned) add("abandoned/");
  return out;
}

CheckpointFolder scan_checkpoint_folder(const std::string& output_dir) {
  CheckpointFolder f;
  f.dir = without_trailing_slash(output_dir).string();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(f.dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == "latest") {
      if (!e.is_symlink(ec)) {
        f.latest_not_link = true;
        continue;
      }
      fs::path target = fs::read_symlink(e.path(), ec);
      if (target.is_relative()) target = fs::path(f.dir) / target;
      f.latest = target.lexically_normal().string();
      f.latest_dangles = !fs::exists(target, ec);
      continue;
    }
    if (name == "abandoned") {
      f.abandoned = true;
      continue;
    }
    if (e.is_symlink(ec) || !e.is_directory(ec)) continue;
    if (step_in(name, kStepName) >= 0)
      (is_checkpoint_dir(e.path().string()) ? f.complete : f.damaged).push_back(e.path().string());
    else if (step_in(name, kSnapshotName) >= 0)
      f.snapshots.push_back(e.path().string());
  }
  sort_by_step(f.complete);
  sort_by_step(f.damaged);
  sort_by_step(f.snapshots);
  return f;
}

void check_run_folder(const std::string& output_dir, const std::string& resume,
                      const std::string& metrics_file) {
  const CheckpointFolder f = scan_checkpoint_folder(output_dir);
  VLM_CHECK(!f.latest_not_link, "checkpoint.output_dir = \"", output_dir,
            "\": its 'latest' is a file or folder, not the link vlmtrain keeps there to the "
            "newest checkpoint; move it away");
  if (!resume.empty()) return;
  VLM_CHECK(!f.has_run(), "checkpoint.output_dir = \"", output_dir, "\" holds an earlier run (",
            f.describe(),
            "), which a new run never replaces: continue it with checkpoint.resume = \"latest\", "
            "or choose another checkpoint.output_dir");
  std::error_code ec;
  VLM_CHECK(!fs::is_regular_file(metrics_file, ec) || fs::file_size(metrics_file, ec) == 0,
            "logging.metrics_file = \"", metrics_file,
            "\" holds the metrics of an earlier run, which a new run never replaces: continue "
            "that run with checkpoint.resume = \"latest\", or choose another "
            "checkpoint.output_dir (or logging.metrics_file)");
}

std::string resolve_resume(const std::string& resume, const std::string& output_dir) {
  if (resume.empty()) return "";
  if (resume == "latest")
    return latest_of(scan_checkpoint_folder(output_dir), "checkpoint.resume = \"latest\"");
  const std::string what = "checkpoint.resume = \"" + resume + "\"";
  std::string dir;
  if (const fs::path p = followed(resume); step_in(p.filename().string(), kStepName) >= 0) {
    std::error_code ec;
    VLM_CHECK(fs::is_directory(p, ec), what, ": no such folder");
    VLM_CHECK(is_checkpoint_dir(p.string()), what, ": a damaged checkpoint (no state.h5)");
    dir = p.string();
  } else {
    std::error_code ec;
    VLM_CHECK(fs::is_directory(resume, ec), what, ": no such folder");
    dir = latest_of(scan_checkpoint_folder(resume), what);
    VLM_CHECK(!dir.empty(), what,
              " is not a checkpoint (a step_N folder holding state.h5) and holds none");
  }
  // A checkpoint of another folder continues there only into an output_dir without a run.
  std::error_code ec;
  const bool inside = same_folder(fs::path(dir).parent_path(), output_dir);
  if (!inside) {
    const CheckpointFolder f = scan_checkpoint_folder(output_dir);
    VLM_CHECK(!f.has_run(), what,
              " is a checkpoint of another folder than checkpoint.output_dir = \"", output_dir,
              "\", which holds a run of its own (", f.describe(),
              "): two runs never mix; choose an empty checkpoint.output_dir");
  }
  return dir;
}

std::string resolve_checkpoint_path(const std::string& path, const std::string& what) {
  std::error_code ec;
  VLM_CHECK(fs::is_directory(path, ec), what, " ", path, ": no such folder");
  const fs::path p = followed(path);
  if (is_checkpoint_dir(p.string())) return p.string();
  if (step_in(p.filename().string(), kStepName) >= 0)
    VLM_FAIL(what, " ", path, ": a damaged checkpoint (no state.h5)");
  if (fs::is_regular_file(fs::path(path) / "config.json", ec)) return path; // an HF snapshot
  const std::string dir = latest_of(scan_checkpoint_folder(path), what + " " + path);
  VLM_CHECK(!dir.empty(), what, " ", path,
            " is neither a checkpoint (step_N with state.h5), an HF snapshot (config.json) nor a "
            "folder of checkpoints");
  return dir;
}

std::string abandon_newer(const std::string& output_dir, const std::string& resumed,
                          const std::string& metrics_file) {
  const CheckpointFolder f = scan_checkpoint_folder(output_dir);
  const int64_t from = checkpoint_step_of(resumed);
  VLM_CHECK(from >= 0, "resume: ", resumed, " is not a step_N folder");
  std::vector<std::string> newer;
  for (const auto* list : {&f.complete, &f.damaged, &f.snapshots})
    for (const std::string& d : *list)
      if (checkpoint_step_of(d) > from) newer.push_back(d);
  const bool inside = same_folder(fs::path(resumed).parent_path(), f.dir);
  std::string moved_to;
  if (!newer.empty()) {
    sort_by_step(newer);
    std::error_code ec;
    const fs::path parent = fs::path(f.dir) / "abandoned";
    fs::create_directories(parent, ec);
    VLM_CHECK(!ec, "resume: cannot create ", parent.string(), ": ", ec.message());
    char base[48];
    std::snprintf(base, sizeof base, "after_step_%06lld", (long long)from);
    const fs::path to = free_name(parent, base);
    fs::create_directory(to, ec);
    VLM_CHECK(!ec, "resume: cannot create ", to.string(), ": ", ec.message());
    if (fs::is_regular_file(metrics_file, ec)) {
      fs::copy_file(metrics_file, to / fs::path(metrics_file).filename(), ec);
      VLM_CHECK(!ec, "resume: cannot copy ", metrics_file, " to ", to.string(), ": ", ec.message());
    }
    for (const std::string& d : newer) {
      fs::rename(d, to / fs::path(d).filename(), ec);
      VLM_CHECK(!ec, "resume: cannot move ", d, " to ", to.string(), ": ", ec.message());
    }
    moved_to = to.string();
    log_info("resume: from ", resumed, "; the newer checkpoints of the run that went on from it (",
             name_list(newer, 8), ") are a branch this run abandons: moved to ", moved_to,
             " with its metrics (nothing is deleted)");
  }
  if (inside && (f.latest.empty() || !same_folder(f.latest, resumed)))
    point_latest_at(f.dir, resumed);
  return moved_to;
}

} // namespace vlm::train
