// A process group of `size` ranks with no peers: every collective acts as if each rank held
// exactly this rank's data — all_gather repeats the input, reduce_scatter (sum) gives size x this
// rank's block, all_reduce (sum) size x the tensor, avg and max leave values as they are. The same
// buffers, shapes and copies as a real group, no communication. Uses: timing compute alone
// (bench/bench_fsdp_step) and running FSDP's multi-rank code paths on one device, to compare CUDA
// with CPU (tests/parallel/test_parallel_gpu.cpp). The numbers of such a run are not a real job's.
#pragma once

#include "parallel/comm/process_group.h"

namespace vlm::parallel {

class LocalProcessGroup final : public ProcessGroup {
public:
  LocalProcessGroup(int rank, int size);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override;
  std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override;
  std::unique_ptr<Work> all_gather_async(const Tensor& out, const Tensor& in) override;
  std::unique_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in,
                                             ReduceOp op) override;
  void all_reduce(const Tensor& t, ReduceOp op) override { all_reduce_async(t, op)->wait(); }
  void all_gather(const Tensor& out, const Tensor& in) override {
    all_gather_async(out, in)->wait();
  }
  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    reduce_scatter_async(out, in, op)->wait();
  }
  void broadcast(const Tensor&, int) override {}
  void barrier() override {}
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) const override;

private:
  int rank_, size_;
};

} // namespace vlm::parallel
