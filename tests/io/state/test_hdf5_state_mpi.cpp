// The HDF5 checkpoint file under `mpirun -np 1 | 2 | 4`: tensors written as dim-0 slices by every
// rank (one rank with no rows) read back whole and in another split on every rank, bit for bit;
// JSON documents; the errors that name the file and key; and Debian's h5py reading what we wrote.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/state/hdf5_state.h"
#include "parallel/comm/mpi.h"
#include "src/core/tensor.h"
#include "tests/error_of.h"
#include "tests/parallel/shared_temp_dir.h"

#if VLM_WITH_HDF5

using namespace vlm;
using Catch::Matchers::Contains;
using vlm::testing::error_of;
using vlm::testing::SharedTempDir;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Exactly representable in bf16, distinct per element and per tensor.
Tensor pattern(const Shape& shape, DType dtype, double seed) {
  std::vector<double> v(size_t(vlm::numel(shape)));
  for (size_t i = 0; i < v.size(); i++) v[i] = seed + 0.25 * double(i) - 3.0;
  return Tensor::from_doubles(v, shape, dtype);
}

// Rows [begin, end) of dim 0 for this rank: uneven, and with 3+ ranks the last ones get none.
std::pair<int64_t, int64_t> my_rows(int64_t rows) {
  const int n = world_size(), r = world_rank();
  const int64_t chunk = n == 1 ? rows : n == 2 ? (rows + 1) / 2 : 3;
  return {std::min(rows, r * chunk), std::min(rows, (r + 1) * chunk)};
}

Tensor rows_of(const Tensor& t, int64_t begin, int64_t end) {
  const std::vector<double> all = t.to_doubles();
  const int64_t row = t.numel() / t.size(0);
  Shape s = t.shape();
  s[0] = end - begin;
  return Tensor::from_doubles({all.begin() + begin * row, all.begin() + end * row}, s, t.dtype());
}

const std::vector<DType> kDtypes = {DType::f32, DType::bf16, DType::f64, DType::i64, DType::i32};

// Writes one file: each dtype's (7, 3) tensor as row slices, a replicated vector and scalar, and
// a JSON document.
void write_sample(const std::string& path) {
  io::Hdf5StateWriter w(path, MPI_COMM_WORLD);
  for (size_t k = 0; k < kDtypes.size(); k++) {
    const Tensor whole = pattern({7, 3}, kDtypes[k], double(k));
    const auto [b, e] = my_rows(7);
    w.write_rows(std::string("model/layers.0.w_") + dtype_name(kDtypes[k]), {7, 3}, kDtypes[k], b,
                 rows_of(whole, b, e));
  }
  w.write_tensor("model/norm.weight", pattern({5}, DType::f32, 10));
  w.write_tensor("optim/norm.weight/step", Tensor::from_doubles({42}, {}, DType::i64));
  w.write_json("state", {{"step", 12}, {"loader", {{"rows", 3}}}});
  w.close();
}

} // namespace

TEST_CASE("hdf5 state: dim-0 slices from every rank read back whole and in another split") {
  SharedTempDir tmp;
  const std::string path = tmp.file("ckpt.h5");
  write_sample(path);
  io::Hdf5StateReader r(path, MPI_COMM_WORLD);
  for (size_t k = 0; k < kDtypes.size(); k++) {
    const std::string key = std::string("model/layers.0.w_") + dtype_name(kDtypes[k]);
    INFO(key);
    const Tensor want = pattern({7, 3}, kDtypes[k], double(k));
    CHECK(r.shape(key) == Shape{7, 3});
    CHECK(r.dtype(key) == kDtypes[k]);
    Tensor whole = Tensor::zeros({7, 3}, kDtypes[k]);
    r.read_tensor_into(key, whole);
    CHECK(whole.to_doubles() == want.to_doubles());
    // Another layout: this rank reads the 2 rows starting at (2 * rank) % 6.
    const int64_t begin = (2 * world_rank()) % 6;
    Tensor part = Tensor::zeros({2, 3}, kDtypes[k]);
    r.read_rows_into(key, begin, part);
    CHECK(part.to_doubles() == rows_of(want, begin, begin + 2).to_doubles());
  }
  Tensor norm = Tensor::zeros({5});
  r.read_tensor_into("model/norm.weight", norm);
  CHECK(norm.to_doubles() == pattern({5}, DType::f32, 10).to_doubles());
  Tensor step = Tensor::zeros({}, DType::i64);
  r.read_tensor_into("optim/norm.weight/step", step);
  CHECK(step.item() == 42);
  CHECK(r.read_json("state") == nlohmann::json{{"step", 12}, {"loader", {{"rows", 3}}}});
  CHECK(r.has("model/norm.weight"));
  CHECK(r.has("model"));
  CHECK_FALSE(r.has("model/absent"));
  CHECK_FALSE(r.has("optim/absent/exp_avg")); // a missing parent is "absent", not an error
}

TEST_CASE("hdf5 state: errors name the file and the key") {
  SharedTempDir tmp;
  const std::string path = tmp.file("ckpt.h5");
  write_sample(path);
  io::Hdf5StateReader r(path, MPI_COMM_WORLD);
  Tensor t = Tensor::zeros({7, 3});
  CHECK_THAT(error_of([&] { r.read_tensor_into("model/missing.weight", t); }),
             Contains("ckpt.h5") && Contains("model/missing.weight"));
  Tensor wrong_shape = Tensor::zeros({7, 4});
  CHECK_THAT(error_of([&] { r.read_tensor_into("model/layers.0.w_f32", wrong_shape); }),
             Contains("model/layers.0.w_f32") && Contains("f32(7, 3)") && Contains("f32(7, 4)"));
  Tensor wrong_dtype = Tensor::zeros({7, 3}, DType::bf16);
  CHECK_THAT(error_of([&] { r.read_tensor_into("model/layers.0.w_f32", wrong_dtype); }),
             Contains("model/layers.0.w_f32") && Contains("bf16"));
  Tensor past_end = Tensor::zeros({2, 3});
  CHECK_THAT(error_of([&] { r.read_rows_into("model/layers.0.w_f32", 6, past_end); }),
             Contains("at row 6"));
  CHECK_THAT(error_of([&] { r.read_json("config"); }), Contains("config"));

  // Files that are not (complete) checkpoints: each rank checks what every rank sees.
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    std::filesystem::copy_file(path, tmp.file("truncated.h5"));
    std::filesystem::resize_file(tmp.file("truncated.h5"), std::filesystem::file_size(path) / 2);
    std::ofstream(tmp.file("text.h5")) << "not an HDF5 file\n";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (const char* name : {"truncated.h5", "text.h5"}) {
    INFO(name);
    CHECK_THAT(error_of([&] { io::Hdf5StateReader(tmp.file(name), MPI_COMM_WORLD); }),
               Contains(name) && Contains("truncated, or not a checkpoint"));
  }
  CHECK_THAT(error_of([&] { io::Hdf5StateReader(tmp.file("absent.h5"), MPI_COMM_WORLD); }),
             Contains("absent.h5': no such file"));
}

TEST_CASE("hdf5 state: a key written twice and rows that do not fit are refused") {
  SharedTempDir tmp;
  io::Hdf5StateWriter w(tmp.file("ckpt.h5"), MPI_COMM_WORLD);
  w.write_tensor("model/a", pattern({2}, DType::f32, 0));
  CHECK_THAT(error_of([&] { w.write_tensor("model/a", pattern({2}, DType::f32, 0)); }),
             Contains("'model/a' is written twice"));
  CHECK_THAT(error_of([&] {
               w.write_rows("model/b", {4, 2}, DType::f32, 3, pattern({2, 2}, DType::f32, 0));
             }),
             Contains("rows 3..5 of 'model/b'") && Contains("f32(4, 2)"));
  w.close();
}

TEST_CASE("hdf5 state: Debian's h5py reads every tensor whole, bf16 included", "[h5py]") {
  SharedTempDir tmp;
  const std::string path = tmp.file("ckpt.h5");
  write_sample(path);
  if (world_rank() != 0) return; // one reader is enough
  const std::string out = tmp.file("h5py.json");
  // Debian's interpreter (python3-h5py, installed by tools/deps/install_deps.sh), not a venv's.
  const std::string script =
      "import h5py, json, sys\n"
      "f = h5py.File(sys.argv[1], 'r')\n"
      "res = {'version': int(f.attrs['vlmtrain_checkpoint_version']),\n"
      "       'state': json.loads(f['state'][()].decode())}\n"
      "def visit(name, obj):\n"
      "    if isinstance(obj, h5py.Dataset) and name != 'state':\n"
      "        res[name] = [list(obj.shape), obj.astype('f8')[()].ravel().tolist()]\n"
      "f.visititems(visit)\n"
      "json.dump(res, open(sys.argv[2], 'w'))\n";
  std::ofstream(tmp.file("read.py")) << script;
  const std::string cmd =
      "/usr/bin/python3 " + tmp.file("read.py") + " " + path + " " + out + " 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0); // fails here without python3-h5py
  nlohmann::json got;
  std::ifstream(out) >> got;
  CHECK(got["version"] == io::kHdf5StateVersion);
  CHECK(got["state"]["step"] == 12);
  for (size_t k = 0; k < kDtypes.size(); k++) {
    const std::string key = std::string("model/layers.0.w_") + dtype_name(kDtypes[k]);
    INFO(key);
    REQUIRE(got.contains(key));
    CHECK(got[key][0] == nlohmann::json{7, 3});
    CHECK(got[key][1].get<std::vector<double>>() ==
          pattern({7, 3}, kDtypes[k], double(k)).to_doubles());
  }
  CHECK(got["optim/norm.weight/step"][1] == nlohmann::json{42.0});
}

#endif // VLM_WITH_HDF5
