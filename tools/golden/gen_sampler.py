"""Golden partitions of a split over (rank, worker) from megatron-energon's own Sharder.

Our io/energon/sampler.cpp reimplements energon's partitioning (docs/energon-format.md §4.2) so that a
C++ job and an energon job give every data-parallel rank and reader worker the same samples. This
script runs the real `Sharder.shard_workers` (and `_generalized_bit_reversal`) on the §4.2 test
vectors plus a few hundred random configurations (shard counts including tiny and empty-ish
splits, subsets, world sizes 1..8, workers 0..4, max_samples_per_sequence None/1/2/3/7/100,
rotation offsets) and writes tests/data/sampler/sharder_vectors.json: per case the inputs and,
for every rank, the slice offsets of each of its workers (the start of every slice, then the
end). tests/io/energon/test_sampler.cpp recomputes all of them.

Usage: python tools/golden/gen_sampler.py   (needs megatron-energon; no GPU, no torch RNG)
"""
import json
import os
import random
import sys

import megatron.energon
from megatron.energon.flavors.webdataset.sharder import Sharder
from megatron.energon.flavors.webdataset.structs import ShardInfo
from megatron.energon.worker import WorkerConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "data", "sampler", "sharder_vectors.json")


def shard_all_ranks(counts, start, end, world, workers, msps, rotation):
    shards = [ShardInfo(name=f"s{i}.tar", path=None, count=c) for i, c in enumerate(counts)]
    subset_total = sum(counts)
    ranks = []
    for rank in range(world):
        wc = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
        if (start, end) == (0, subset_total):
            res = Sharder.shard_workers(shards, wc, max_samples_per_sequence=msps,
                                        rotation_offset=rotation)
        else:
            # shard_workers only takes a DatasetSubset; an absolute range is the same thing.
            from megatron.energon.flavors.webdataset.structs import DatasetSubset
            res = Sharder.shard_workers(shards, wc, max_samples_per_sequence=msps,
                                        subset=DatasetSubset(absolute_range=(start, end)),
                                        rotation_offset=rotation)
        ranks.append([[int(x) for x in offsets] for offsets in res])
    return ranks


def main():
    rng = random.Random(1234)
    cases = []

    def add(name, counts, world, workers, msps, start=None, end=None, rotation=0):
        total = sum(counts)
        start = 0 if start is None else start
        end = total if end is None else end
        cases.append({
            "name": name, "shard_counts": counts, "start": start, "end": end,
            "world_size": world, "num_workers": workers,
            "max_samples_per_sequence": msps, "rotation_offset": rotation,
            "ranks": shard_all_ranks(counts, start, end, world, workers, msps, rotation),
        })

    # The §4.2 vectors of docs/energon-format.md.
    add("doc_5_5_3_w2x2", [5, 5, 3], 2, 2, None)
    add("doc_5_5_3_w2x2_msps2", [5, 5, 3], 2, 2, 2)
    add("doc_1000_msps100", [1000], 1, 1, 100)
    add("doc_10_w1x3", [10], 1, 3, None)
    add("doc_10_w1x3_rot1", [10], 1, 3, None, rotation=1)
    add("doc_7_w1x4", [7], 1, 4, None)
    add("fewer_samples_than_workers", [2, 1], 2, 2, None)
    add("zero_workers_means_one", [4, 4], 2, 0, None)
    add("half_round_even", [25], 1, 1, 10)  # 25/10 = 2.5 -> round() = 2
    add("rounding_edge", [301], 1, 3, 7)

    msps_choices = [None, 1, 2, 3, 7, 100]
    for i in range(300):
        n_shards = rng.randint(1, 6)
        counts = [rng.choice([1, 2, 3, rng.randint(1, 40), rng.randint(1, 400)])
                  for _ in range(n_shards)]
        total = sum(counts)
        world = rng.randint(1, 8)
        workers = rng.randint(0, 4)
        msps = rng.choice(msps_choices)
        rotation = rng.choice([0, 0, rng.randint(0, 7)])
        start, end = 0, total
        if rng.random() < 0.25:
            start = rng.randint(0, total)
            end = rng.randint(start, total)
        add(f"random_{i}", counts, world, workers, msps, start, end, rotation)

    bitrev = {str(n): [int(x) for x in Sharder._generalized_bit_reversal(n)]
              for n in list(range(1, 21)) + [24, 32, 48, 64]}

    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({
            "generator": os.path.relpath(os.path.abspath(sys.argv[0]), REPO),
            "energon_version": megatron.energon.__version__,
            "bit_reversal": bitrev,
            "cases": cases,
        }, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT}: {len(cases)} cases, {os.path.getsize(OUT) / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
