#include "src/cli/cmd_report.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "src/base/check.h"
#include "src/cli/args.h"

namespace vlm::cli {

namespace {

namespace fs = std::filesystem;

// tools/report/report.py of the checkout: $VLM_ROOT's, else the one beside the executable's
// folder (build/vlmtrain -> tools/), else none.
std::string find_script() {
  std::vector<fs::path> roots;
  if (const char* r = std::getenv("VLM_ROOT"); r && *r) roots.emplace_back(r);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) roots.push_back(exe.parent_path().parent_path());
  for (const fs::path& root : roots) {
    const fs::path script = root / "tools" / "report" / "report.py";
    if (fs::is_regular_file(script, ec)) return script.string();
  }
  std::string tried;
  for (const fs::path& root : roots) tried += "\n  " + (root / "tools/report/report.py").string();
  VLM_FAIL("vlmtrain report: tools/report/report.py not found; tried:", tried,
           "\nset VLM_ROOT to the vlmtrain checkout");
}

// $VLM_PYTHON, else Debian's /usr/bin/python3 (tools/deps/install_deps.sh gives it matplotlib;
// a virtual environment first on PATH may lack it), else python3 from PATH.
std::string python() {
  if (const char* p = std::getenv("VLM_PYTHON"); p && *p) return p;
  std::error_code ec;
  return fs::exists("/usr/bin/python3", ec) ? "/usr/bin/python3" : "python3";
}

} // namespace

int cmd_report(const std::vector<std::string>& args) {
  std::vector<std::string> runs, records;
  std::string out = "report";
  CLI::App app{"PNG plots of training runs (loss and eval loss, learning rate, gradient norm, "
               "tokens/s, MFU, memory: training.png, loss.png) and of benchmark records "
               "(measured and modelled scaling: scaling.png), drawn by tools/report/report.py "
               "with matplotlib.",
               "vlmtrain report"};
  show_defaults(app);
  app.add_option("runs", runs, "runs' output_dir folders or metrics.jsonl files");
  app.add_option("--records", records,
                 "benchmark records (JSON lines, VLM_BENCH_RECORDS), or the lines of "
                 "tools/scaling/scaling_model.py predict --json");
  app.add_option("--out", out, "the folder the PNG files go to");
  if (!parse_args(app, args)) return 0;
  VLM_CHECK(!runs.empty() || !records.empty(),
            "vlmtrain report: give at least one run or --records file");

  std::vector<std::string> argv = {python(), find_script()};
  argv.insert(argv.end(), runs.begin(), runs.end());
  for (const std::string& r : records) argv.insert(argv.end(), {"--records", r});
  argv.insert(argv.end(), {"--out", out});
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  ::execvp(cargv[0], cargv.data());
  VLM_FAIL("vlmtrain report: cannot run ", argv[0], ": ", std::strerror(errno),
           " (set VLM_PYTHON to a Python 3 with matplotlib)");
}

} // namespace vlm::cli
