// From the loader's packed rows to the model's micro-batches, and the loader configuration a
// training config implies.
#pragma once

#include <string>
#include <vector>

#include "io/loader.h"
#include "io/tokenizer.h"
#include "model/batch.h"
#include "src/train/config.h"

namespace vlm::train {

// Rows back to back: input ids, next-token targets (io::next_token_targets per row, so no target
// crosses a row or a document), 1-D position ids, cu_seqlens offset row by row (each row's
// padding stays its own segment). Images are not used by a text model.
model::Batch batch_from_rows(const std::vector<io::PackedRow>& rows);

// The loader of `split` for a text model: data.* keys, the tokenizer's special-token ids, images
// dropped (ChatFormatOptions::drop_images), one data-parallel rank. training = false: the
// sequential single-epoch order of validation.
io::LoaderConfig text_loader_config(const TrainConfig& config, const io::Tokenizer& tokenizer,
                                    const std::string& tokenizer_path, const std::string& split,
                                    bool training);

} // namespace vlm::train
