// From the loader's packed rows to the model's micro-batches, and the loader configuration a
// training config implies.
#pragma once

#include <string>
#include <vector>

#include "io/loader/loader.h"
#include "io/text/tokenizer.h"
#include "model/batch.h"
#include "src/train/config.h"

namespace vlm::train {

// Rows back to back: input ids, next-token targets (io::next_token_targets per row, so no target
// crosses a row or a document), position ids ([T], or [3, T] for MRoPE rows: each plane row by
// row), cu_seqlens offset row by row (each row's padding stays its own segment), and the rows'
// images in row order (pixel_values [patches, patch_dim] f32, image_grid_thw [images, 3]; absent
// when no row has one). All rows are of one kind (MRoPE or not).
model::Batch batch_from_rows(const std::vector<io::PackedRow>& rows);

// A micro-batch of the run's shape with nothing to predict: micro_batch_rows rows of data.seq_len
// tokens, one document each (token id 0, targets -100), positions per row ([3, T] MRoPE planes
// when `mrope`), no images. The trainer's forward before the first step runs it, so that what a
// shape's first forward builds (the cuDNN attention plans) is built before any step.
model::Batch shape_batch(const TrainConfig& config, bool mrope);

// The loader of `split`: data.* keys, the tokenizer's special-token ids, one data-parallel rank.
// vision = true (a VLM): images kept and MRoPE position ids; else images dropped
// (ChatFormatOptions::drop_images) and 1-D positions. training = false: the sequential
// single-epoch order of validation.
io::LoaderConfig loader_config(const TrainConfig& config, const io::Tokenizer& tokenizer,
                               const std::string& tokenizer_path, const std::string& split,
                               bool training, bool vision);

} // namespace vlm::train
