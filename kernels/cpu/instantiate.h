// The (element type, index type) pairs that the CPU kernels taking an index or label array are
// built for (index.cpp, loss.cpp), written once: VLM_FOR_EACH_VALUE_INDEX(M) expands M(T, I) for
// T = float, double, bf16 and I = int32_t, int64_t. For kernels/cpu/*.cpp only.
#pragma once

#define VLM_FOR_EACH_VALUE_INDEX(M)                                                                \
  M(float, int32_t)                                                                                \
  M(float, int64_t)                                                                                \
  M(double, int32_t)                                                                               \
  M(double, int64_t)                                                                               \
  M(bf16, int32_t)                                                                                 \
  M(bf16, int64_t)
