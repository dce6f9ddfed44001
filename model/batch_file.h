// A batch in a safetensors file, as `vlmtrain dump` and the benchmarks read it (tools/golden/
// writes them): input_ids [T] or [1, T] (i64 or i32), labels (HF-aligned, unshifted, -100 =
// ignored, same shape), position_ids (same shape, or [3, T] / [3, 1, T] for MRoPE) and cu_seqlens
// [docs + 1] (i32 or i64), plus pixel_values and image_grid_thw for a model with a vision tower.
#pragma once

#include <string>

#include "model/batch.h"

namespace vlm::model {

// Reads a batch file; errors name the file and the key. Vision keys are read when `vision` is set,
// else ignored with a log line.
Batch read_batch_file(const std::string& path, bool vision);

} // namespace vlm::model
