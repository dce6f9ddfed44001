#include "model/batch.h"

#include <limits>
#include <vector>

#include "io/loader/packing.h"
#include "src/core/autograd.h"
#include "src/core/ops/shape_ops.h"

namespace vlm::model {

namespace {

std::string desc_or_nothing(const Tensor& t) {
  return t.defined() ? t.desc() : std::string("nothing");
}

void check_index_dtype(const Tensor& t, const char* what) {
  VLM_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64, "batch: ", what,
            " must be i32 or i64, got ", t.desc());
}

// [T] or [1, T] -> [T] i64.
Tensor as_tokens(const Tensor& t, const char* what) {
  VLM_CHECK(t.defined(), "batch: ", what, " is missing");
  VLM_CHECK(t.dim() == 1 || (t.dim() == 2 && t.size(0) == 1), "batch: ", what,
            " must be [T] or [1, T], got ", t.desc());
  check_index_dtype(t, what);
  return reshape(t, {t.numel()}).to(DType::i64).contiguous();
}

// [T], [1, T] -> [T]; [3, T], [3, 1, T] (MRoPE, HF's [3, batch, T]) -> [3, T]; i64.
Tensor as_positions(const Tensor& t) {
  VLM_CHECK(t.defined(), "batch: position_ids is missing");
  check_index_dtype(t, "position_ids");
  const bool mrope = t.dim() >= 2 && t.size(0) == 3 && (t.dim() == 2 || t.size(1) == 1);
  if (mrope && t.dim() <= 3) return reshape(t, {3, t.size(-1)}).to(DType::i64).contiguous();
  return as_tokens(t, "position_ids");
}

std::vector<int64_t> host_values(const Tensor& t) {
  std::vector<int64_t> v;
  for (double x : t.to_doubles()) v.push_back(int64_t(x));
  return v;
}

} // namespace

Batch batch_from_labels(const Tensor& input_ids, const Tensor& labels, const Tensor& position_ids,
                        const Tensor& cu_seqlens) {
  NoGradGuard no_grad;
  Batch b;
  b.input_ids = as_tokens(input_ids, "input_ids");
  const Tensor lab = as_tokens(labels, "labels");
  b.position_ids = as_positions(position_ids);
  const int64_t T = b.input_ids.numel();
  VLM_CHECK(T > 0, "batch: input_ids is empty");
  VLM_CHECK(lab.numel() == T && b.position_ids.size(-1) == T, "batch: input_ids has ", T,
            " tokens but labels ", labels.desc(), " and position_ids ", position_ids.desc());
  std::vector<int32_t> lab32(static_cast<size_t>(T));
  const int64_t* l = lab.data<int64_t>();
  for (int64_t t = 0; t < T; t++) {
    VLM_CHECK(l[t] >= std::numeric_limits<int32_t>::min() &&
                  l[t] <= std::numeric_limits<int32_t>::max(),
              "batch: label ", l[t], " at position ", t, " is not a token id");
    lab32[size_t(t)] = int32_t(l[t]);
  }
  b.targets = Tensor::from_vector(io::next_token_targets(lab32), {T}).to(DType::i64);
  VLM_CHECK(cu_seqlens.defined() && cu_seqlens.dim() == 1, "batch: cu_seqlens must be [docs + 1] ",
            "i32 or i64, got ", desc_or_nothing(cu_seqlens));
  check_index_dtype(cu_seqlens, "cu_seqlens");
  b.cu_seqlens = cu_seqlens.to(DType::i32).contiguous();
  return b;
}

int64_t count_targets(const Batch& batch) {
  if (batch.num_targets >= 0) return batch.num_targets;
  int64_t n = 0;
  for (double v : batch.targets.to_doubles()) n += v != -100;
  return n;
}

void validate_batch(const Batch& b, int64_t vocab_size) {
  VLM_CHECK(b.input_ids.defined() && b.input_ids.dim() == 1 && b.input_ids.numel() > 0,
            "batch: input_ids must be a non-empty [T] tensor, got ", desc_or_nothing(b.input_ids));
  check_index_dtype(b.input_ids, "input_ids");
  const int64_t T = b.input_ids.numel();
  const std::vector<int64_t> ids = host_values(b.input_ids);
  for (int64_t t = 0; t < T; t++)
    VLM_CHECK(ids[size_t(t)] >= 0 && ids[size_t(t)] < vocab_size, "batch: input id ",
              ids[size_t(t)], " at position ", t, " is out of range [0, ", vocab_size, ")");
  if (b.targets.defined()) {
    VLM_CHECK(b.targets.shape() == b.input_ids.shape(), "batch: targets must be [T] like ",
              describe("input_ids", b.input_ids), ", got ", b.targets.desc());
    check_index_dtype(b.targets, "targets");
    const std::vector<int64_t> tg = host_values(b.targets);
    for (int64_t t = 0; t < T; t++)
      VLM_CHECK(tg[size_t(t)] == -100 || (tg[size_t(t)] >= 0 && tg[size_t(t)] < vocab_size),
                "batch: target ", tg[size_t(t)], " at position ", t, " is out of range [0, ",
                vocab_size, ") (and not -100, the ignore index)");
  }
  const Tensor& p = b.position_ids;
  VLM_CHECK(p.defined() && (p.shape() == Shape{T} || p.shape() == Shape{3, T}),
            "batch: position_ids must be [T] or [3, T] for ", describe("input_ids", b.input_ids),
            ", got ", desc_or_nothing(p));
  check_index_dtype(p, "position_ids");
  const std::vector<int64_t> pos = host_values(p);
  for (size_t i = 0; i < pos.size(); i++)
    VLM_CHECK(pos[i] >= 0, "batch: position id ", pos[i], " at index ", i, " is negative");
  const Tensor& cu = b.cu_seqlens;
  VLM_CHECK(cu.defined() && cu.dim() == 1 && cu.numel() >= 2,
            "batch: cu_seqlens must be [docs + 1] with at least one document, got ",
            desc_or_nothing(cu));
  check_index_dtype(cu, "cu_seqlens");
  const std::vector<int64_t> c = host_values(cu);
  VLM_CHECK(c.front() == 0 && c.back() == T, "batch: cu_seqlens must run from 0 to T = ", T,
            ", got ", c.front(), " ... ", c.back());
  for (size_t d = 1; d < c.size(); d++)
    VLM_CHECK(c[d] >= c[d - 1], "batch: cu_seqlens must be non-decreasing, got ", c[d - 1],
              " then ", c[d], " at index ", d);
}

Batch to_device(const Batch& b, Device device) {
  NoGradGuard no_grad;
  Batch out;
  out.num_targets = b.targets.defined() ? count_targets(b) : 0;
  out.cu_seqlens = b.cu_seqlens.to(Device::cpu());
  auto move = [&](const Tensor& t) { return t.defined() ? t.to(device) : Tensor(); };
  out.pixel_values = move(b.pixel_values);
  if (b.image_grid_thw.defined()) out.image_grid_thw = b.image_grid_thw.to(Device::cpu());
  if (device.is_cpu()) {
    auto ids = [](const Tensor& t) { return t.to(Device::cpu()).to(DType::i64); };
    out.input_ids = ids(b.input_ids);
    out.targets = b.targets.defined() ? ids(b.targets) : Tensor();
    out.position_ids = ids(b.position_ids);
    return out;
  }
  // One i64 staging tensor holds ids, positions and targets (when present) back to back.
  const int64_t T = b.input_ids.numel(), P = b.position_ids.numel();
  const bool has_targets = b.targets.defined();
  VLM_CHECK(P % T == 0 && (!has_targets || b.targets.numel() == T),
            "to_device: the batch's tensors differ in length: ", describe("input_ids", b.input_ids),
            ", ", describe("position_ids", b.position_ids),
            has_targets ? ", " + describe("targets", b.targets) : std::string());
  const Tensor* parts[] = {&b.input_ids, &b.position_ids, &b.targets};
  const int64_t offsets[] = {0, T, T + P, T + P + (has_targets ? T : 0)};
  Tensor staging = Tensor::empty_pinned({offsets[3]}, DType::i64);
  for (int i = 0; i < (has_targets ? 3 : 2); i++) {
    Tensor dst = slice(staging, 0, offsets[i], offsets[i + 1]);
    copy_(dst, reshape(parts[i]->to(Device::cpu()), {dst.numel()}).to(DType::i64));
  }
  Tensor on_device = staging.to(device);
  auto part = [&](int i, const Shape& shape) {
    return reshape(slice(on_device, 0, offsets[i], offsets[i + 1]), shape);
  };
  out.input_ids = part(0, {T});
  out.host_input_ids = reshape(slice(staging, 0, 0, T), {T}); // the pinned copy, already i64
  out.position_ids = part(1, b.position_ids.shape());
  if (has_targets) out.targets = part(2, {T});
  return out;
}

} // namespace vlm::model
