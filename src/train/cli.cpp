#include "src/train/cli.h"

#include <cstdio>
#include <string>

#include "src/core/device.h"

namespace vlm::train {

int run_cli(int argc, char** argv) {
  std::string cmd = argc > 1 ? argv[1] : "train";
  if (cmd == "device-query") {
    std::printf("%s\n", cuda_device_query().c_str());
    return 0;
  }
  std::fprintf(stderr, "usage: vlmtrain [train|device-query]\n");
  return 2;
}

} // namespace vlm::train
