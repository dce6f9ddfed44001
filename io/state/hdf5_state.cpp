#include "io/state/hdf5_state.h"

#if VLM_WITH_HDF5

#include <hdf5.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <utility>
#include <vector>

#include "io/state/atomic_file.h"
#include "src/base/check.h"
#include "src/core/autograd.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::io {

bool hdf5_state_available() { return true; }

namespace {

constexpr const char* kVersionAttr = "vlmtrain_checkpoint_version";
constexpr int kMaxStoredDims = 8;
constexpr hsize_t kMaxStoredElements = hsize_t(1) << 48;
// A JSON document (/state, /config, /hf_config) is small: the loader states of every
// data-parallel rank are the largest part (a few KiB per rank).
constexpr size_t kMaxJsonBytes = size_t(1) << 30;
constexpr hsize_t kAlignment = hsize_t(1) << 20; // see the header: parallel file systems

// An HDF5 handle closed by its own close function when it goes out of scope.
class H5Handle {
public:
  H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Handle() {
    if (id_ >= 0) close_(id_);
  }
  H5Handle(H5Handle&& other) noexcept : id_(std::exchange(other.id_, -1)), close_(other.close_) {}
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle& operator=(H5Handle&&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its error stack to stderr by default; we report errors ourselves, with the
// innermost message of the stack. And no atexit() cleanup: after a failed write (disk full) HDF5
// 1.10 cannot close the file, and its exit-time cleanup of that file crashes in the MPI-IO driver
// (a segfault after our error message); every file we open is closed by its owner anyway.
void silence_hdf5() {
  static const bool once = [] {
    H5dont_atexit(); // before any other HDF5 call, or it has no effect
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)once;
}

// What HDF5's error stack says about the last failed call: its outermost message, and the OS
// error behind it where one is recorded. The POSIX driver writes errno into its message
// ("..., errno = 28, error message = 'No space left on device', ..."); the MPI-IO driver names the
// MPI error string ("MPI_ERR_NO_SPACE: ...") where the MPI library gives a class.
struct Hdf5Failure {
  std::string text;
  int os_error = 0;
};

herr_t collect_error(unsigned n, const H5E_error2_t* e, void* out) {
  auto* f = static_cast<Hdf5Failure*>(out);
  if (!e->desc || !*e->desc) return 0;
  const std::string desc = e->desc;
  if (f->text.empty()) f->text = desc;
  if (f->os_error != 0) return 0;
  if (const size_t at = desc.find("errno = "); at != std::string::npos)
    f->os_error = std::atoi(desc.c_str() + at + 8);
  constexpr std::pair<const char*, int> kMpiClasses[] = {{"MPI_ERR_NO_SPACE", ENOSPC},
                                                         {"MPI_ERR_QUOTA", EDQUOT},
                                                         {"MPI_ERR_READ_ONLY", EROFS},
                                                         {"MPI_ERR_ACCESS", EACCES}};
  for (const auto& [name, err] : kMpiClasses)
    if (f->os_error == 0 && desc.find(name) != std::string::npos) f->os_error = err;
  return 0;
}

Hdf5Failure hdf5_failure() {
  Hdf5Failure f;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &f);
  if (f.text.empty()) f.text = "no HDF5 message";
  return f;
}

std::string hdf5_error() { return hdf5_failure().text; }

#define VLM_H5_CHECK(ok, ...) VLM_CHECK(ok, __VA_ARGS__, " (HDF5: ", hdf5_error(), ")")

// Bytes of the file system holding `path` that this process may still write (-1: unknown).
int64_t free_bytes_at(const std::string& path) {
  struct statvfs st;
  const std::string dir = std::filesystem::path(path).parent_path().string();
  if (::statvfs(dir.empty() ? "." : dir.c_str(), &st) != 0) return -1;
  return int64_t(::geteuid() == 0 ? st.f_bfree : st.f_bavail) * int64_t(st.f_frsize);
}

// The error of a failed write to `path`. With an OS error (from the stack, else `errno_after`,
// errno right after the call, when it is one a failed write sets: the MPI-IO driver does not
// record it, OpenMPI's write leaves it) the message leads with the file and the OS reason:
// "checkpoint: cannot write 'F': No space left on device (the disk of D is full; ...) [doing;
// HDF5: ...]"; else "checkpoint: doing (HDF5: ...)". A write that ran into a full disk with a
// short count sets no errno (one of several MPI ranks, typically): where no OS error is known
// and less than 1 MiB is left on the file system, the disk is full, and the message says so.
std::string write_failure(const std::string& path, const std::string& dest, int errno_after,
                          const std::string& doing) {
  Hdf5Failure f = hdf5_failure();
  for (int err : {ENOSPC, EDQUOT, EFBIG, EIO, EROFS, EACCES, EPERM})
    if (f.os_error == 0 && errno_after == err) f.os_error = err;
  std::string seen;
  if (f.os_error == 0) {
    const int64_t left = free_bytes_at(path);
    if (left < 0 || left >= (int64_t(1) << 20))
      return "checkpoint: " + doing + " (HDF5: " + f.text + ")";
    f.os_error = ENOSPC;
    seen = "; no OS error was reported, and the file system has " + std::to_string(left) +
           " bytes left";
  }
  return "checkpoint: cannot write '" + path + "': " + write_error_text(f.os_error, dest) + " [" +
         doing + "; HDF5: " + f.text + seen + "]";
}

// VLM_CHECK for the HDF5 calls that write: `errno_after` is errno right after the call (set to 0
// before it).
#define VLM_H5_WRITE_CHECK(ok, errno_after, ...)                                                   \
  do {                                                                                             \
    if (!(ok)) [[unlikely]]                                                                        \
      ::vlm::detail::throw_error(                                                                  \
          __FILE__, __LINE__, #ok,                                                                 \
          write_failure(path_, dest_, errno_after, ::vlm::detail::str_cat(__VA_ARGS__)));          \
  } while (0)

// bf16 and f16 have no predefined HDF5 type: both are IEEE-style floats described field by field
// (sign bit, exponent, mantissa), so any HDF5 reader converts them to f32 exactly.
hid_t make_half_type(size_t exponent_bits, size_t mantissa_bits, size_t bias) {
  const hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, mantissa_bits, exponent_bits, 0, mantissa_bits);
  H5Tset_precision(t, 16);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, bias);
  return t;
}

// The file and memory type of a dtype (the same: values are stored as they are in memory).
H5Handle h5_type(DType dtype) {
  switch (dtype) {
  case DType::f32: return {H5Tcopy(H5T_IEEE_F32LE), H5Tclose};
  case DType::f64: return {H5Tcopy(H5T_IEEE_F64LE), H5Tclose};
  case DType::bf16: return {make_half_type(8, 7, 127), H5Tclose};
  case DType::f16: return {make_half_type(5, 10, 15), H5Tclose};
  case DType::i32: return {H5Tcopy(H5T_STD_I32LE), H5Tclose};
  case DType::i64: return {H5Tcopy(H5T_STD_I64LE), H5Tclose};
  case DType::u8: return {H5Tcopy(H5T_STD_U8LE), H5Tclose};
  case DType::boolean: break;
  }
  VLM_FAIL("checkpoint: no HDF5 type for dtype ", dtype_name(dtype));
}

// The dtype of a dataset's file type; a type vlmtrain never writes is an error naming `what`.
DType dtype_of_h5(hid_t type, const std::string& what) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    if (size == 4) return DType::f32;
    if (size == 8) return DType::f64;
    if (size == 2) return H5Tget_ebias(type) == 127 ? DType::bf16 : DType::f16;
  }
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    if (is_signed && size == 4) return DType::i32;
    if (is_signed && size == 8) return DType::i64;
    if (!is_signed && size == 1) return DType::u8;
  }
  VLM_FAIL(what, " has an HDF5 type vlmtrain does not use (class ", int(cls), ", ", size,
           " bytes)");
}

std::string dataset_path(const std::string& key) {
  VLM_CHECK(!key.empty() && key.front() != '/' && key.back() != '/', "checkpoint: bad key '", key,
            "' (expected a/b/c)");
  return "/" + key;
}

std::vector<hsize_t> dims_of(const Shape& shape) { return {shape.begin(), shape.end()}; }

// A CPU, contiguous, gradient-free copy (or view) of `t` whose bytes can be handed to HDF5.
Tensor host_bytes(const Tensor& t) {
  NoGradGuard no_grad;
  return t.detach().to(Device::cpu()).contiguous();
}

// Independent transfers of the raw data: each rank's rows are one contiguous byte range of the
// file, which it writes itself, as pwrite() would. Collective buffering (two-phase I/O) would
// first move every byte between ranks to aggregators, which only pays for many small pieces:
// measured with bench/bench_checkpoint on 4 ranks, collective wrote at 0.49x pwrite()'s speed,
// independent at 0.92x. Metadata (dataset creation) stays collective (the file access list).
H5Handle data_transfer(bool mpi) {
  H5Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  if (mpi) H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_INDEPENDENT);
  return dxpl;
}

// MPI-IO over `comm` when MPI runs; in a process without MPI (parallel/comm/mpi_env.h: no launcher)
// HDF5's POSIX driver, the file being this process's alone.
bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

H5Handle file_access(MPI_Comm comm, bool mpi) {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (mpi)
    H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
  else
    H5Pset_fapl_sec2(fapl.get());
  return fapl;
}

} // namespace

// --- writer ------------------------------------------------------------------------------------

Hdf5StateWriter::Hdf5StateWriter(const std::string& path, MPI_Comm comm, const std::string& dest)
    : path_(path), dest_(dest), mpi_(mpi_running()) {
  silence_hdf5();
  if (mpi_) MPI_Comm_rank(comm, &rank_);
  H5Handle fapl = file_access(comm, mpi_);
  H5Pset_alignment(fapl.get(), kAlignment, kAlignment);
  if (mpi_) { // metadata (groups, dataset headers) written collectively, not by every rank alone
    H5Pset_all_coll_metadata_ops(fapl.get(), true);
    H5Pset_coll_metadata_write(fapl.get(), true);
  }
  errno = 0;
  file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  const int created_errno = errno;
  VLM_H5_WRITE_CHECK(file_ >= 0, created_errno, "cannot create '", path, "'");
  const int version = kHdf5StateVersion;
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(
      H5Acreate2(file_, kVersionAttr, H5T_STD_I32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
      H5Aclose);
  errno = 0;
  const bool written = attr.valid() && H5Awrite(attr.get(), H5T_NATIVE_INT, &version) >= 0;
  const int written_errno = errno;
  VLM_H5_WRITE_CHECK(written, written_errno, "cannot write the format version to '", path, "'");
}

Hdf5StateWriter::~Hdf5StateWriter() {
  if (file_ >= 0) H5Fclose(file_);
}

void Hdf5StateWriter::close() {
  VLM_CHECK(file_ >= 0, "checkpoint: '", path_, "' is already closed");
  errno = 0;
  const herr_t flushed = H5Fflush(file_, H5F_SCOPE_GLOBAL);
  const int flushed_errno = errno;
  errno = 0;
  const herr_t closed = H5Fclose(file_);
  const int closed_errno = errno;
  file_ = -1;
  VLM_H5_WRITE_CHECK(flushed >= 0 && closed >= 0, flushed < 0 ? flushed_errno : closed_errno,
                     "writing '", path_, "' failed at flush/close");
}

int64_t Hdf5StateWriter::create_dataset(const std::string& key, const Shape& shape, DType dtype) {
  VLM_CHECK(file_ >= 0, "checkpoint: '", path_, "' is closed; cannot write '", key, "'");
  const std::string path = dataset_path(key);
  VLM_CHECK(H5Lexists(file_, path.c_str(), H5P_DEFAULT) <= 0, "checkpoint: key '", key,
            "' is written twice");
  H5Handle type = h5_type(dtype);
  const std::vector<hsize_t> dims = dims_of(shape);
  H5Handle space(shape.empty() ? H5Screate(H5S_SCALAR)
                               : H5Screate_simple(int(dims.size()), dims.data(), nullptr),
                 H5Sclose);
  H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  // Contiguous and never filled: every byte is written by exactly one rank.
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  errno = 0;
  const hid_t ds =
      H5Dcreate2(file_, path.c_str(), type.get(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT);
  const int created_errno = errno;
  VLM_H5_WRITE_CHECK(ds >= 0, created_errno, "cannot create '", key, "' ", dtype_name(dtype),
                     shape_str(shape), " in '", path_, "'");
  return ds;
}

void Hdf5StateWriter::write_slabs(int64_t dataset, const std::string& key,
                                  const Shape& global_shape, const std::vector<Slab>& slabs) {
  H5Handle ds(dataset, H5Dclose);
  if (numel(global_shape) == 0) return; // nothing to write, on any rank
  const std::vector<hsize_t> dims = dims_of(global_shape);
  H5Handle dxpl = data_transfer(mpi_);
  H5Handle file_type(H5Dget_type(ds.get()), H5Tclose); // stored as in memory: no conversion
  // One independent H5Dwrite per box (a rank with none makes no call): each box is a selection
  // of the file only this rank writes. A box of whole rows is one byte range of the file; a
  // column block is one range per row.
  for (const Slab& slab : slabs) {
    if (!slab.block.defined() || slab.block.numel() == 0) continue;
    H5Handle file_space(global_shape.empty()
                            ? H5Screate(H5S_SCALAR)
                            : H5Screate_simple(int(dims.size()), dims.data(), nullptr),
                        H5Sclose);
    if (!global_shape.empty()) {
      const std::vector<hsize_t> start(slab.offset.begin(), slab.offset.end());
      const std::vector<hsize_t> count = dims_of(slab.block.shape());
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                          nullptr);
    }
    const Tensor bytes = host_bytes(slab.block);
    const hsize_t n = hsize_t(bytes.numel());
    H5Handle mem_space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    errno = 0;
    const herr_t ok = H5Dwrite(ds.get(), file_type.get(), mem_space.get(), file_space.get(),
                               dxpl.get(), bytes.data_ptr());
    const int write_errno = errno;
    VLM_H5_WRITE_CHECK(ok >= 0, write_errno, "writing '", key, "' to '", path_,
                       "' failed (the box at ", shape_str(slab.offset), ")");
  }
}

void Hdf5StateWriter::write_tensor(const std::string& key, const Tensor& value) {
  VLM_CHECK(value.defined(), "checkpoint: writing an undefined tensor under '", key, "'");
  const int64_t ds = create_dataset(key, value.shape(), value.dtype());
  std::vector<Slab> mine;
  if (rank_ == 0) mine.push_back({std::vector<int64_t>(size_t(value.dim()), 0), value});
  write_slabs(ds, key, value.shape(), mine);
}

void Hdf5StateWriter::write_rows(const std::string& key, const Shape& global_shape, DType dtype,
                                 int64_t row_begin, const Tensor& rows) {
  VLM_CHECK(!global_shape.empty(), "checkpoint: write_rows of '", key, "' needs a dim 0");
  std::vector<Slab> mine;
  if (rows.defined() && rows.numel() > 0) {
    Shape expect = global_shape;
    expect[0] = rows.size(0);
    VLM_CHECK(rows.dtype() == dtype && rows.shape() == expect && row_begin >= 0 &&
                  row_begin + rows.size(0) <= global_shape[0],
              "checkpoint: rows ", row_begin, "..", row_begin + rows.size(0), " of '", key, "' as ",
              rows.desc(), " do not fit the global ", dtype_name(dtype), shape_str(global_shape));
    std::vector<int64_t> offset(global_shape.size(), 0);
    offset[0] = row_begin;
    mine.push_back({offset, rows});
  }
  write_slab(key, global_shape, dtype, mine);
}

void Hdf5StateWriter::write_slab(const std::string& key, const Shape& global_shape, DType dtype,
                                 const std::vector<Slab>& slabs) {
  // Checked before the (collective) creation: every rank passing the same bad box fails alike.
  for (const Slab& slab : slabs) {
    if (!slab.block.defined() || slab.block.numel() == 0) continue;
    VLM_CHECK(slab.block.dtype() == dtype &&
                  box_fits(global_shape, slab.offset, slab.block.shape()),
              "checkpoint: the box at offset ", shape_str(slab.offset), " as ", slab.block.desc(),
              " does not fit '", key, "', a ", dtype_name(dtype), shape_str(global_shape));
  }
  const int64_t ds = create_dataset(key, global_shape, dtype);
  write_slabs(ds, key, global_shape, slabs);
}

void Hdf5StateWriter::write_json(const std::string& key, const nlohmann::json& value) {
  VLM_CHECK(file_ >= 0, "checkpoint: '", path_, "' is closed; cannot write '", key, "'");
  const std::string path = dataset_path(key);
  VLM_CHECK(H5Lexists(file_, path.c_str(), H5P_DEFAULT) <= 0, "checkpoint: key '", key,
            "' is written twice");
  // Invalid UTF-8 in a string (a path given in bytes) becomes U+FFFD rather than failing a save.
  const std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(text.size(), 1));
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  errno = 0;
  H5Handle ds(H5Dcreate2(file_, path.c_str(), type.get(), space.get(), lcpl.get(), H5P_DEFAULT,
                         H5P_DEFAULT),
              H5Dclose);
  const int created_errno = errno;
  VLM_H5_WRITE_CHECK(ds.valid(), created_errno, "cannot create '", key, "' in '", path_, "'");
  H5Handle file_space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle mem_space(H5Screate(H5S_SCALAR), H5Sclose);
  if (rank_ != 0) {
    H5Sselect_none(file_space.get());
    H5Sselect_none(mem_space.get());
  }
  H5Handle dxpl = data_transfer(mpi_);
  errno = 0;
  const herr_t ok =
      H5Dwrite(ds.get(), type.get(), mem_space.get(), file_space.get(), dxpl.get(), text.data());
  const int write_errno = errno;
  VLM_H5_WRITE_CHECK(ok >= 0, write_errno, "writing '", key, "' to '", path_, "' failed");
}

// --- reader ------------------------------------------------------------------------------------

Hdf5StateReader::Hdf5StateReader(const std::string& path, MPI_Comm comm) : path_(path) {
  silence_hdf5();
  VLM_CHECK(std::filesystem::is_regular_file(path), "checkpoint: cannot open '", path,
            "': no such file");
  H5Handle fapl = file_access(comm, mpi_running());
  std::error_code ec;
  file_bytes_ = std::filesystem::file_size(path, ec);
  VLM_CHECK(!ec, "checkpoint: cannot read the size of '", path, "': ", ec.message());
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  VLM_H5_CHECK(file_ >= 0, "checkpoint: cannot open '", path,
               "' as an HDF5 file (truncated, or not a checkpoint)");
  int version = -1;
  const bool has_version = H5Aexists(file_, kVersionAttr) > 0;
  if (has_version) {
    H5Handle attr(H5Aopen(file_, kVersionAttr, H5P_DEFAULT), H5Aclose);
    H5Handle space(attr.valid() ? H5Aget_space(attr.get()) : -1, H5Sclose);
    H5Handle type(attr.valid() ? H5Aget_type(attr.get()) : -1, H5Tclose);
    // One integer (a forged attribute of another shape must not be read into one int).
    if (space.valid() && type.valid() && H5Sget_simple_extent_npoints(space.get()) == 1 &&
        H5Tget_class(type.get()) == H5T_INTEGER)
      H5Aread(attr.get(), H5T_NATIVE_INT, &version);
  }
  VLM_CHECK(version == kHdf5StateVersion, "checkpoint: '", path, "' ",
            version >= 0 ? "has format version " + std::to_string(version) +
                               "; this vlmtrain reads version " + std::to_string(kHdf5StateVersion)
            : has_version ? std::string("is not a vlmtrain checkpoint (its ") + kVersionAttr +
                                " is not one integer)"
                          : std::string("is not a vlmtrain checkpoint (no ") + kVersionAttr + ")");
}

Hdf5StateReader::~Hdf5StateReader() {
  if (file_ >= 0) H5Fclose(file_);
}

bool Hdf5StateReader::has(const std::string& key) const {
  // H5Lexists needs every parent to exist: check the path one link at a time.
  const std::string path = dataset_path(key);
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    if (H5Lexists(file_, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) return true;
  }
}

int64_t Hdf5StateReader::open_dataset(const std::string& key) const {
  VLM_CHECK(has(key), "checkpoint: '", path_, "' has no '", key, "'");
  const hid_t ds = H5Dopen2(file_, dataset_path(key).c_str(), H5P_DEFAULT);
  VLM_H5_CHECK(ds >= 0, "checkpoint: '", key, "' in '", path_, "' is not a dataset");
  return ds;
}

namespace {

// The dataset's shape; more dims than any tensor has, or more elements than fit in memory
// addresses, is an error naming `what` (the numbers come from the file: nothing is trusted).
Shape shape_of(hid_t dataset, const std::string& what) {
  H5Handle space(H5Dget_space(dataset), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  VLM_H5_CHECK(rank >= 0, "cannot read the shape of ", what);
  VLM_CHECK(rank <= kMaxStoredDims, what, " has ", rank,
            " dimensions; checkpoint tensors have at most ", kMaxStoredDims);
  std::vector<hsize_t> dims(size_t(rank), 0);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  hsize_t n = 1;
  for (hsize_t d : dims) {
    VLM_CHECK(d <= kMaxStoredElements && (d == 0 || n <= kMaxStoredElements / d), what,
              " declares shape ", shape_str(Shape(dims.begin(), dims.end())),
              ": more elements than any tensor can hold");
    n *= d;
  }
  return Shape(dims.begin(), dims.end());
}

// The dataset's bytes must be in the file: contiguous (as vlmtrain writes them; compact is read
// too), allocated (a dataset declared but never written would read as zeros) and ending within
// the file's size (a truncated file would too). Checked before anything is allocated for it.
void check_stored(hid_t dataset, const std::string& what, uint64_t bytes, uint64_t file_bytes) {
  H5Handle dcpl(H5Dget_create_plist(dataset), H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_COMPACT || bytes == 0) return;
  VLM_CHECK(layout == H5D_CONTIGUOUS, what,
            " is not stored contiguously (chunked, or another layout): vlmtrain checkpoints hold "
            "contiguous datasets (was the file repacked?)");
  const haddr_t offset = H5Dget_offset(dataset);
  VLM_CHECK(offset != HADDR_UNDEF, what, " holds no data: its ", bytes,
            " bytes were never written (an interrupted or forged save)");
  VLM_CHECK(offset <= file_bytes && bytes <= file_bytes - offset, what, " holds ", bytes,
            " bytes at offset ", offset, ", past the end of the file (", file_bytes,
            " bytes): the file is truncated");
}

} // namespace

Shape Hdf5StateReader::shape(const std::string& key) const {
  H5Handle ds(open_dataset(key), H5Dclose);
  return shape_of(ds.get(), "checkpoint: '" + key + "' in '" + path_ + "'");
}

DType Hdf5StateReader::dtype(const std::string& key) const {
  H5Handle ds(open_dataset(key), H5Dclose);
  H5Handle type(H5Dget_type(ds.get()), H5Tclose);
  return dtype_of_h5(type.get(), "checkpoint: '" + key + "' in '" + path_ + "'");
}

void Hdf5StateReader::read_rows_into(const std::string& key, int64_t row_begin, Tensor& dst) const {
  VLM_CHECK(dst.defined(), "checkpoint: reading '", key, "' into an undefined tensor");
  const Shape global = shape(key);
  Shape expect = global;
  if (!global.empty()) expect[0] = dst.dim() > 0 ? dst.size(0) : -1;
  VLM_CHECK(dst.shape() == expect && row_begin >= 0 &&
                (global.empty() || row_begin + dst.size(0) <= global[0]),
            "checkpoint: '", key, "' in '", path_, "' holds ", dtype_name(dtype(key)),
            shape_str(global), " but the destination is ", dst.desc(),
            global.empty() ? std::string() : " at row " + std::to_string(row_begin));
  std::vector<int64_t> offset(global.size(), 0);
  if (!global.empty()) offset[0] = row_begin;
  read_slab_into(key, offset, dst);
}

void Hdf5StateReader::read_slab_into(const std::string& key, const std::vector<int64_t>& offset,
                                     Tensor& dst) const {
  VLM_CHECK(dst.defined(), "checkpoint: reading '", key, "' into an undefined tensor");
  const std::string what = "checkpoint: '" + key + "' in '" + path_ + "'";
  H5Handle ds(open_dataset(key), H5Dclose);
  const Shape global = shape_of(ds.get(), what);
  H5Handle stored_type(H5Dget_type(ds.get()), H5Tclose);
  const DType stored = dtype_of_h5(stored_type.get(), what);
  check_stored(ds.get(), what, uint64_t(numel(global)) * dtype_size(stored), file_bytes_);
  VLM_CHECK(stored == dst.dtype() && box_fits(global, offset, dst.shape()), what, " holds ",
            dtype_name(stored), shape_str(global), "; the box at offset ", shape_str(offset),
            " does not fit the destination ", dst.desc());
  if (dst.numel() == 0) return;
  NoGradGuard no_grad;
  // Straight into dst when HDF5 can write its memory (a CPU tensor, contiguous), else via a copy.
  const bool direct = !dst.device().is_cuda() && dst.is_contiguous();
  Tensor host = direct ? dst : Tensor::empty(dst.shape(), dst.dtype());
  H5Handle file_space(H5Dget_space(ds.get()), H5Sclose);
  if (!global.empty()) {
    const std::vector<hsize_t> start(offset.begin(), offset.end());
    const std::vector<hsize_t> count = dims_of(dst.shape());
    H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                        nullptr);
  }
  const hsize_t n = hsize_t(dst.numel());
  H5Handle mem_space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5Handle type = h5_type(dst.dtype());
  VLM_H5_CHECK(H5Dread(ds.get(), type.get(), mem_space.get(), file_space.get(), H5P_DEFAULT,
                       host.data_ptr()) >= 0,
               "checkpoint: reading '", key, "' from '", path_, "' failed");
  if (!direct) copy_(dst, host.to(dst.device()));
}

void Hdf5StateReader::read_tensor_into(const std::string& key, Tensor& dst) const {
  // The whole tensor: the stored shape must be dst's, not only a box of it.
  VLM_CHECK(dst.defined(), "checkpoint: reading '", key, "' into an undefined tensor");
  const Shape stored = shape(key);
  VLM_CHECK(stored == dst.shape(), "checkpoint: '", key, "' in '", path_, "' holds ",
            dtype_name(dtype(key)), shape_str(stored), " but the destination is ", dst.desc());
  read_slab_into(key, std::vector<int64_t>(stored.size(), 0), dst);
}

std::vector<std::string> Hdf5StateReader::children(const std::string& group) const {
  std::vector<std::string> names;
  if (!has(group)) return names;
  H5Handle g(H5Gopen2(file_, dataset_path(group).c_str(), H5P_DEFAULT), H5Gclose);
  VLM_H5_CHECK(g.valid(), "checkpoint: '", group, "' in '", path_, "' is not a group");
  // By index (the same calls in HDF5 1.10 and 1.12+, whose link-iteration callbacks differ).
  H5G_info_t info;
  VLM_H5_CHECK(H5Gget_info(g.get(), &info) >= 0, "checkpoint: cannot list '", group, "' in '",
               path_, "'");
  for (hsize_t i = 0; i < info.nlinks; i++) {
    const ssize_t n =
        H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    VLM_H5_CHECK(n >= 0 && n < 65536, "checkpoint: cannot read a name in '", group, "' of '", path_,
                 "'");
    std::string name(size_t(n) + 1, '\0');
    H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(),
                       H5P_DEFAULT);
    name.resize(size_t(n));
    names.push_back(std::move(name));
  }
  return names;
}

nlohmann::json Hdf5StateReader::read_json(const std::string& key) const {
  VLM_CHECK(has(key), "checkpoint: '", path_, "' has no JSON document '", key, "'");
  H5Handle ds(open_dataset(key), H5Dclose);
  H5Handle type(H5Dget_type(ds.get()), H5Tclose);
  const std::string what = "checkpoint: '" + key + "' in '" + path_ + "'";
  VLM_CHECK(H5Tget_class(type.get()) == H5T_STRING && H5Tis_variable_str(type.get()) == 0, what,
            " is not a fixed-length string (the JSON text vlmtrain writes)");
  VLM_CHECK(shape_of(ds.get(), what).empty(), what, " is not a single (scalar) string");
  const size_t bytes = H5Tget_size(type.get());
  VLM_CHECK(bytes <= kMaxJsonBytes, what, " declares ", bytes, " bytes of JSON; at most ",
            kMaxJsonBytes, " are read");
  check_stored(ds.get(), what, bytes, file_bytes_);
  std::string text(bytes, '\0');
  VLM_H5_CHECK(H5Dread(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()) >= 0,
               "checkpoint: reading '", key, "' from '", path_, "' failed");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    VLM_FAIL("checkpoint: '", key, "' in '", path_, "' is not valid JSON: ", e.what());
  }
}

} // namespace vlm::io

#else // no parallel HDF5 in this build

namespace vlm::io {
bool hdf5_state_available() { return false; }
} // namespace vlm::io

#endif
