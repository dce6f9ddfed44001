// Skipping a Catch2 v2 test: print why and exit with 77, which ctest reports as "Skipped"
// (SKIP_RETURN_CODE in tests/CMakeLists.txt). Each TEST_CASE runs in its own ctest process.
#pragma once

#include <cstdio>
#include <cstdlib>

#define VLM_SKIP(reason)                                                                           \
  do {                                                                                             \
    std::printf("SKIPPED: %s\n", reason);                                                          \
    std::fflush(stdout);                                                                           \
    std::exit(77);                                                                                 \
  } while (0)
