// vlmtrain: the command-line entry point. Library code throws vlm::Error; it is caught once here.
#include <cstdio>
#include <exception>

#include "src/base/logging.h"
#include "src/train/cli.h"

int main(int argc, char** argv) {
  try {
    return vlm::train::run_cli(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%serror: %s\n", vlm::rank_prefix().c_str(), e.what());
    std::fflush(stderr);
    return 1;
  }
}
