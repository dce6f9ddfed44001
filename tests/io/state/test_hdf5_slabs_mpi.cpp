// N-dimensional boxes (hyperslabs) in the HDF5 checkpoint under `mpirun -np 1 | 2 | 4`: f32 and
// bf16 tensors of shape (6, 10) and (4, 6, 8) written by every rank as 2-D blocks (a 2 x 2 grid
// on 4 ranks, column halves on 2, a rank writing two row segments of its block, a strided block,
// ranks writing nothing), then read back whole and as boxes of another layout on 1, 2 and all
// ranks, bit for bit against the values computed here; the bounds errors of both sides.
#include <catch2/catch.hpp>

#include <vector>

#include "io/state/hdf5_state.h"
#include "parallel/comm/mpi.h"
#include "src/core/ops/shape_ops.h"
#include "src/core/tensor.h"
#include "tests/error_of.h"
#include "tests/io/state/box_values.h"
#include "tests/parallel/shared_temp_dir.h"

#if VLM_WITH_HDF5

using namespace vlm;
using Catch::Matchers::Contains;
using vlm::testing::box_values;
using vlm::testing::error_of;
using vlm::testing::pattern;
using vlm::testing::SharedTempDir;

namespace {

int rank_in(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}
int size_of(MPI_Comm comm) {
  int n = 1;
  MPI_Comm_size(comm, &n);
  return n;
}

// The box as a tensor of `dtype`; `strided`: a transposed view (2-D boxes), not contiguous unless
// a dim is 1.
Tensor block(const std::vector<double>& all, const Shape& shape, DType dtype,
             const std::vector<int64_t>& offset, const Shape& box, bool strided = false) {
  const std::vector<double> v = box_values(all, shape, offset, box);
  if (!strided) return Tensor::from_doubles(v, box, dtype);
  std::vector<double> t(v.size());
  for (int64_t i = 0; i < box[0]; i++)
    for (int64_t j = 0; j < box[1]; j++) t[size_t(j * box[0] + i)] = v[size_t(i * box[1] + j)];
  Tensor view = transpose(Tensor::from_doubles(t, {box[1], box[0]}, dtype), 0, 1);
  CHECK(view.is_contiguous() == (box[0] == 1 || box[1] == 1));
  return view;
}

struct Box {
  std::vector<int64_t> offset;
  Shape shape;
};

const Shape kMatrix = {6, 10};
const Shape kCube = {4, 6, 8};

// Each writing rank's boxes of the (6, 10) tensor, tiling it.
std::vector<Box> matrix_boxes(int rank, int ranks) {
  if (ranks == 2) // column halves, each as two row segments
    return {{{0, 5 * rank}, {2, 5}}, {{2, 5 * rank}, {4, 5}}};
  if (ranks == 4) { // a 2 x 2 grid; rank 3 writes its block as two row segments
    const int64_t r0 = 3 * (rank / 2), c0 = 5 * (rank % 2);
    if (rank == 3) return {{{r0, c0}, {1, 5}}, {{r0 + 1, c0}, {2, 5}}};
    return {{{r0, c0}, {3, 5}}};
  }
  if (rank > 0) return {};
  return {{{0, 0}, {2, 10}}, {{2, 0}, {4, 4}}, {{2, 4}, {4, 6}}}; // one rank: three boxes
}

// Each writing rank's boxes of the (4, 6, 8) tensor: 2-D blocks over dims 1 and 2.
std::vector<Box> cube_boxes(int rank, int ranks) {
  if (ranks == 2) return {{{0, 3 * rank, 0}, {4, 3, 8}}};
  if (ranks == 4) return {{{0, 3 * (rank / 2), 4 * (rank % 2)}, {4, 3, 4}}};
  if (rank > 0) return {};
  return {{{0, 0, 0}, {4, 6, 3}}, {{0, 0, 3}, {4, 6, 5}}};
}

const std::vector<DType> kDtypes = {DType::f32, DType::bf16};

std::string key_of(const char* name, DType dtype) {
  return std::string("model/") + name + "." + dtype_name(dtype);
}
double seed_of(size_t tensor, DType dtype) { return double(tensor) + (dtype == DType::bf16); }

// Every rank of the world writes its boxes of both tensors in both dtypes, and a (6, 10) tensor
// only the last rank writes (as two column halves; the others pass no slab, or an undefined one).
void write_sample(const std::string& path) {
  const int rank = rank_in(MPI_COMM_WORLD), ranks = size_of(MPI_COMM_WORLD);
  io::Hdf5StateWriter w(path, MPI_COMM_WORLD);
  for (DType dtype : kDtypes) {
    std::vector<io::Slab> slabs;
    const std::vector<double> matrix = pattern(kMatrix, seed_of(0, dtype));
    for (const Box& b : matrix_boxes(rank, ranks))
      slabs.push_back({b.offset, block(matrix, kMatrix, dtype, b.offset, b.shape, slabs.empty())});
    w.write_slab(key_of("matrix", dtype), kMatrix, dtype, slabs);
    slabs.clear();
    const std::vector<double> cube = pattern(kCube, seed_of(1, dtype));
    for (const Box& b : cube_boxes(rank, ranks))
      slabs.push_back({b.offset, block(cube, kCube, dtype, b.offset, b.shape)});
    w.write_slab(key_of("cube", dtype), kCube, dtype, slabs);
  }
  const std::vector<double> last = pattern(kMatrix, 7);
  std::vector<io::Slab> mine;
  if (rank == ranks - 1)
    mine = {{{0, 0}, block(last, kMatrix, DType::f32, {0, 0}, {6, 4})},
            {{0, 4}, block(last, kMatrix, DType::f32, {0, 4}, {6, 6})}};
  else if (rank % 2 == 1)
    mine = {{{0, 0}, Tensor()}};
  w.write_slab("model/last_rank_only", kMatrix, DType::f32, mine);
  w.close();
}

// Reads every tensor of the sample whole and as boxes across the writers' boundaries on `comm`
// (this rank is reader `q` of `m`), checking every value.
void check_sample(const std::string& path, MPI_Comm comm) {
  const int q = rank_in(comm), m = size_of(comm);
  io::Hdf5StateReader r(path, comm);
  struct Case {
    const char* name;
    size_t tensor;
    Shape shape;
    std::vector<Box> boxes;
  };
  const int64_t rows0 = 6 * q / m, rows1 = 6 * (q + 1) / m;
  const int64_t planes0 = 4 * q / m, planes1 = 4 * (q + 1) / m;
  const std::vector<Case> cases = {
      {"matrix",
       0,
       kMatrix,
       {{{0, 0}, kMatrix}, {{rows0, 1}, {rows1 - rows0, 8}}, {{5, 9}, {1, 1}}, {{1, 3}, {4, 5}}}},
      {"cube",
       1,
       kCube,
       {{{0, 0, 0}, kCube},
        {{planes0, 1, 2}, {planes1 - planes0, 4, 5}},
        {{3, 5, 7}, {1, 1, 1}},
        {{1, 2, 3}, {2, 3, 4}}}}};
  for (DType dtype : kDtypes)
    for (const Case& c : cases) {
      const std::string key = key_of(c.name, dtype);
      CHECK(r.shape(key) == c.shape);
      CHECK(r.dtype(key) == dtype);
      const std::vector<double> all = pattern(c.shape, seed_of(c.tensor, dtype));
      for (const Box& b : c.boxes) {
        INFO(key << " at " << shape_str(b.offset) << " as " << shape_str(b.shape) << " on " << m
                 << " ranks");
        Tensor got = Tensor::zeros(b.shape, dtype);
        r.read_slab_into(key, b.offset, got);
        CHECK(got.to_doubles() == box_values(all, c.shape, b.offset, b.shape));
      }
      Tensor whole = Tensor::zeros(c.shape, dtype);
      r.read_tensor_into(key, whole);
      CHECK(whole.to_doubles() == all);
      Shape rows = c.shape; // a dim-0 shard of the tensor-parallel file, as FSDP reads it
      rows[0] = 2;
      Tensor part = Tensor::zeros(rows, dtype);
      r.read_rows_into(key, 1, part);
      std::vector<int64_t> at(c.shape.size(), 0);
      at[0] = 1;
      CHECK(part.to_doubles() == box_values(all, c.shape, at, rows));
    }
  Tensor last = Tensor::zeros(kMatrix);
  r.read_tensor_into("model/last_rank_only", last);
  CHECK(last.to_doubles() == pattern(kMatrix, 7));
}

} // namespace

TEST_CASE("hdf5 state: 2-D blocks from every rank read back whole and as other boxes") {
  SharedTempDir tmp;
  const std::string path = tmp.file("slabs.h5");
  write_sample(path);
  MPI_Barrier(MPI_COMM_WORLD);
  SECTION("on every rank") { check_sample(path, MPI_COMM_WORLD); }
  SECTION("on each rank alone") { check_sample(path, MPI_COMM_SELF); }
  SECTION("on pairs of ranks") {
    MPI_Comm pairs;
    MPI_Comm_split(MPI_COMM_WORLD, rank_in(MPI_COMM_WORLD) / 2, rank_in(MPI_COMM_WORLD), &pairs);
    check_sample(path, pairs);
    MPI_Comm_free(&pairs);
  }
}

TEST_CASE("hdf5 state: dim-0 shards read back as 2-D boxes") {
  SharedTempDir tmp;
  const std::string path = tmp.file("rows.h5");
  const int rank = rank_in(MPI_COMM_WORLD), ranks = size_of(MPI_COMM_WORLD);
  const std::vector<double> all = pattern(kMatrix, 3);
  {
    io::Hdf5StateWriter w(path, MPI_COMM_WORLD);
    const int64_t begin = 6 * rank / ranks, end = 6 * (rank + 1) / ranks;
    w.write_rows("model/w", kMatrix, DType::bf16, begin,
                 block(all, kMatrix, DType::bf16, {begin, 0}, {end - begin, 10}));
    w.close();
  }
  io::Hdf5StateReader r(path, MPI_COMM_WORLD);
  const Box b = {{1, 5 * (rank % 2)}, {4, 5}}; // a column half across every writer's rows
  Tensor got = Tensor::zeros(b.shape, DType::bf16);
  r.read_slab_into("model/w", b.offset, got);
  CHECK(got.to_doubles() == box_values(all, kMatrix, b.offset, b.shape));
  // Into a strided destination too (a column block of a larger tensor).
  Tensor wide = Tensor::zeros({6, 4}, DType::bf16);
  Tensor columns = slice(wide, 1, 1, 3);
  r.read_slab_into("model/w", {0, 7}, columns);
  CHECK(columns.to_doubles() == box_values(all, kMatrix, {0, 7}, {6, 2}));
}

TEST_CASE("hdf5 state: boxes out of bounds are refused, naming key, shape, offset and block") {
  SharedTempDir tmp;
  const std::string path = tmp.file("bounds.h5");
  const std::vector<double> all = pattern(kMatrix, 0);
  {
    io::Hdf5StateWriter w(path, MPI_COMM_WORLD);
    // Every rank passes the same bad box (the check precedes the collective creation).
    CHECK_THAT(error_of([&] {
                 w.write_slab("model/bad", kMatrix, DType::f32,
                              {{{4, 0}, block(all, kMatrix, DType::f32, {0, 0}, {3, 10})}});
               }),
               Contains("'model/bad'") && Contains("f32(6, 10)") && Contains("offset (4, 0)") &&
                   Contains("f32(3, 10)"));
    CHECK_THAT(error_of([&] {
                 w.write_slab("model/bad", kMatrix, DType::f32,
                              {{{0, -1}, block(all, kMatrix, DType::f32, {0, 0}, {1, 1})}});
               }),
               Contains("offset (0, -1)"));
    CHECK_THAT(error_of([&] {
                 w.write_slab("model/bad", kMatrix, DType::f32,
                              {{{0}, block(all, kMatrix, DType::f32, {0, 0}, {6, 10})}});
               }),
               Contains("offset (0)"));
    CHECK_THAT(error_of([&] {
                 w.write_slab("model/bad", kMatrix, DType::f32,
                              {{{0, 0}, block(all, kMatrix, DType::bf16, {0, 0}, {6, 10})}});
               }),
               Contains("bf16(6, 10)") && Contains("a f32(6, 10)"));
    // The refused writes created nothing: the key is still free.
    std::vector<io::Slab> mine;
    if (rank_in(MPI_COMM_WORLD) == 0)
      mine = {{{0, 0}, block(all, kMatrix, DType::f32, {0, 0}, kMatrix)}};
    w.write_slab("model/bad", kMatrix, DType::f32, mine);
    w.close();
  }
  io::Hdf5StateReader r(path, MPI_COMM_WORLD);
  Tensor past = Tensor::zeros({2, 5});
  CHECK_THAT(error_of([&] {
               r.read_slab_into("model/bad", {5, 0}, past);
             }),
             Contains("'model/bad'") && Contains("f32(6, 10)") && Contains("offset (5, 0)") &&
                 Contains("f32(2, 5)"));
  CHECK_THAT(error_of([&] {
               r.read_slab_into("model/bad", {0, 6}, past);
             }),
             Contains("offset (0, 6)"));
  CHECK_THAT(error_of([&] {
               r.read_slab_into("model/bad", {0, 0, 0}, past);
             }),
             Contains("offset (0, 0, 0)"));
  Tensor bf16 = Tensor::zeros({2, 5}, DType::bf16);
  CHECK_THAT(error_of([&] {
               r.read_slab_into("model/bad", {0, 0}, bf16);
             }),
             Contains("'model/bad'") && Contains("bf16(2, 5)"));
  CHECK_THAT(error_of([&] {
               r.read_slab_into("model/absent", {0, 0}, past);
             }),
             Contains("model/absent"));
  Tensor whole = Tensor::zeros(kMatrix);
  r.read_tensor_into("model/bad", whole);
  CHECK(whole.to_doubles() == all);
}

#endif // VLM_WITH_HDF5
