// The checkpoint file (DESIGN.md §7): one HDF5 file written collectively by every rank of an MPI
// communicator through parallel HDF5 (MPI-IO), read back by any number of ranks. Each global
// tensor is one dataset with its full shape and dtype ("model/<hf name>" -> /model/<hf name>);
// a rank writes only its own boxes of it (hyperslabs: an FSDP shard is a dim-0 slice, a tensor-
// parallel shard a column block or a few row segments), so a file saved on 4 ranks loads on 1, 2
// or 8, in any other layout. JSON documents ("state", "config") are string datasets. bf16 is stored
// as an HDF5 float type of bf16's bit layout, so h5py reads it with `ds.astype("f4")[...]`.
//
// Layout for parallel file systems: datasets are contiguous (no chunking: a rank's rows are one
// byte range, which it writes with one independent MPI-IO call, a column block one range per
// row: no collective buffering, which would move every byte between ranks first), and every dataset
// of at least 1 MiB starts on a 1 MiB boundary (Lustre's default stripe size, and a multiple of
// GPFS's sub-block), so no two ranks' large writes share a file-system block they both have to
// lock.
//
// Collective rules: every rank of the communicator constructs the writer, calls write_tensor /
// write_rows / write_slab / write_json with the same keys in the same order (datasets are created
// collectively; each rank then writes its own part independently, any number of boxes), and
// close(). Reads are independent: a rank reads what it needs, in any order.
// A process without MPI (parallel/comm/mpi_env.h: started without a launcher) reads and writes
// through HDF5's POSIX driver instead, as the only rank (the communicator is not used): the same
// file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/state/state_store.h"

#if VLM_WITH_HDF5
#include <mpi.h>
#endif

namespace vlm::io {

// The format version written to the file's root attribute "vlmtrain_checkpoint_version".
inline constexpr int kHdf5StateVersion = 1;

// True when the build has parallel HDF5 (VLM_WITH_HDF5: MPI and libhdf5-openmpi found).
bool hdf5_state_available();

#if VLM_WITH_HDF5

class Hdf5StateWriter final : public StateWriter {
public:
  // Creates (or truncates) `path` on every rank of `comm` collectively. A write the OS refuses
  // (a full disk, a quota, EIO, ...) is an error naming the file and the OS reason, with what to
  // do (io::write_error_text); `dest` names where the file goes there (a config key, e.g.
  // "checkpoint.output_dir"; "" = the disk).
  Hdf5StateWriter(const std::string& path, MPI_Comm comm, const std::string& dest = "");
  ~Hdf5StateWriter() override; // closes without throwing (call close() to see errors)
  Hdf5StateWriter(const Hdf5StateWriter&) = delete;
  Hdf5StateWriter& operator=(const Hdf5StateWriter&) = delete;

  // A replicated tensor: every rank passes the same value; rank 0 writes it.
  void write_tensor(const std::string& key, const Tensor& value) override;
  // One slice of a global tensor of `global_shape` and `dtype`: this rank's `rows` are rows
  // [row_begin, row_begin + rows.size(0)) of dim 0 (zero rows: a rank with nothing to write, or a
  // replica whose copy another rank writes). Every row must be written by exactly one rank.
  void write_rows(const std::string& key, const Shape& global_shape, DType dtype, int64_t row_begin,
                  const Tensor& rows) override;
  // This rank's boxes of a global tensor (StateWriter::write_slab): any number, each written with
  // its own independent transfer. Every element must be written by exactly one box of one rank
  // (an element none writes reads as whatever the file held); a box out of bounds, checked before
  // the dataset is created, is an error naming the key, the global shape, the offset and block.
  void write_slab(const std::string& key, const Shape& global_shape, DType dtype,
                  const std::vector<Slab>& slabs) override;
  void write_json(const std::string& key, const nlohmann::json& value) override;
  // Flushes and closes the file; an error (disk full, ...) is thrown on the rank that saw it.
  void close();

private:
  int64_t create_dataset(const std::string& key, const Shape& shape, DType dtype);
  // Writes this rank's `slabs` into `dataset` (from create_dataset) and closes it.
  void write_slabs(int64_t dataset, const std::string& key, const Shape& global_shape,
                   const std::vector<Slab>& slabs);

  std::string path_;
  std::string dest_; // where the file goes, for the errors of a full disk
  bool mpi_ = false; // MPI-IO; false: a process without MPI writes the file alone
  int rank_ = 0;
  int64_t file_ = -1; // hid_t
};

class Hdf5StateReader final : public StateReader {
public:
  // Opens `path` read-only on every rank of `comm` (collectively). A missing, truncated or
  // foreign file, or one of another format version, is an error naming the path. Every read
  // checks first that the dataset's bytes are in the file (written, contiguous, within its size)
  // and that a JSON document is a fixed-length string of at most 1 GiB: sizes from the file are
  // checked before anything is allocated for them.
  Hdf5StateReader(const std::string& path, MPI_Comm comm);
  ~Hdf5StateReader() override;
  Hdf5StateReader(const Hdf5StateReader&) = delete;
  Hdf5StateReader& operator=(const Hdf5StateReader&) = delete;

  bool has(const std::string& key) const override;
  void read_tensor_into(const std::string& key, Tensor& dst) const override;
  nlohmann::json read_json(const std::string& key) const override;

  // The global shape and dtype of the tensor under `key` (from the dataset's header; a shape of
  // more than 8 dims or 2^48 elements, or a type vlmtrain never writes, is an error naming it).
  Shape shape(const std::string& key) const override;
  DType dtype(const std::string& key) const override;
  std::vector<std::string> children(const std::string& group) const override;
  // Rows [row_begin, row_begin + dst.size(0)) of the tensor under `key` (the other dims and the
  // dtype must match): the resharding read.
  void read_rows_into(const std::string& key, int64_t row_begin, Tensor& dst) const override;
  // The box [offset, offset + dst.shape()) of the tensor under `key` (a hyperslab; the dtype must
  // match): a tensor-parallel shard of any layout.
  void read_slab_into(const std::string& key, const std::vector<int64_t>& offset,
                      Tensor& dst) const override;

private:
  int64_t open_dataset(const std::string& key) const;

  std::string path_;
  uint64_t file_bytes_ = 0; // the file's size on disk: no dataset may reach past it
  int64_t file_ = -1;       // hid_t
};

#endif // VLM_WITH_HDF5

} // namespace vlm::io
