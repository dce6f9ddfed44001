// Offline packing in the data loader (io/loader/loader.h): the packing plan of `vlmtrain data
// pack` (io/loader/packing_plan.h) is opened and checked against the loader's configuration, its
// rows take the place of samples in the samplers, and each row a worker draws is read and packed
// as planned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "io/loader/loader.h"

namespace vlm::io {

// The plan cfg.packing_plan, checked before use: the loader reads one dataset (num_datasets) as
// a whole (not a subset), and the plan was made for exactly loader_plan_identity(cfg). Errors
// name the dataset or the plan.
PackingPlan open_planned_rows(const LoaderConfig& cfg, size_t num_datasets, bool subset);

// Row r of the plan, read and packed now: its samples through the pipeline (with pixels), each
// counted in st->samples, skipped ones in st->skips. nullopt when every sample was skipped.
std::optional<PackedRow> read_planned_row(const PackingPlan& plan, int64_t r,
                                          const SamplePipeline& pipeline,
                                          const PackingConfig& packing, LoaderWorkerState* st);

} // namespace vlm::io
