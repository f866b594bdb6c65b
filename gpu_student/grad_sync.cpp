// Bucketed gradient all-reduce from the autograd hooks (grad_sync.hpp).
#include "grad_sync.hpp"

#include <fmt/format.h>

namespace kdflow::student {

GradSync::GradSync(ProcessGroup& group, std::vector<torch::Tensor> params,
                   std::vector<torch::Tensor> buffers)
    : group_(group.impl()), buffers_(std::move(buffers)) {
  for (auto& p : params)
    if (p.requires_grad()) params_.push_back(p);
  // Buckets in reverse registration order, about as the backward pass produces the gradients;
  // one dtype per bucket.
  const auto cap = static_cast<std::int64_t>(group_.options.bucket_mb * 1024 * 1024);
  slices_.resize(params_.size());
  arrived_.assign(params_.size(), false);
  std::vector<std::int64_t> sizes;
  for (std::size_t k = params_.size(); k-- > 0;) {
    const torch::Tensor& p = params_[k];
    const std::int64_t bytes = p.numel() * static_cast<std::int64_t>(p.element_size());
    if (buckets_.empty() || sizes.back() + bytes > cap ||
        buckets_.back().flat.scalar_type() != p.scalar_type()) {
      buckets_.push_back({torch::empty({0}, p.options()), {}, 0, {}});
      sizes.push_back(0);
    }
    Bucket& b = buckets_.back();
    slices_[k] = {buckets_.size() - 1, sizes.back() / static_cast<std::int64_t>(p.element_size()),
                  p.numel()};
    b.params.push_back(k);
    sizes.back() += bytes;
  }
  for (std::size_t i = 0; i < buckets_.size(); ++i)
    buckets_[i].flat = torch::zeros(
        {sizes[i] / static_cast<std::int64_t>(params_[buckets_[i].params[0]].element_size())},
        params_[buckets_[i].params[0]].options());
  for (std::size_t k = 0; k < params_.size(); ++k)
    params_[k].register_hook([this, k](const torch::Tensor& grad) { on_gradient(k, grad); });

  // Every rank starts from rank 0's parameters and buffers.
  torch::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    std::vector<torch::Tensor> members;
    for (const std::size_t k : b.params) members.push_back(params_[k]);
    copy_to(members, b.flat);
    std::vector<at::Tensor> t{b.flat};
    group_.wait(group_.backend->broadcast(t), "broadcasting rank 0's parameters");
    copy_from(b.flat, members);
  }
  if (!buffers_.empty()) {
    std::int64_t n = 0;
    for (const auto& t : buffers_) n += t.numel();
    buffers_flat_ = torch::empty({n}, buffers_.front().options().dtype(torch::kDouble));
    copy_to(buffers_, buffers_flat_);
    std::vector<at::Tensor> t{buffers_flat_};
    group_.wait(group_.backend->broadcast(t), "broadcasting rank 0's buffers");
    copy_from(buffers_flat_, buffers_);
  }
}

void GradSync::copy_to(const std::vector<torch::Tensor>& tensors, const torch::Tensor& flat) {
  std::int64_t offset = 0;
  for (const auto& t : tensors) {
    flat.narrow(0, offset, t.numel()).copy_(t.detach().reshape(-1));
    offset += t.numel();
  }
}

void GradSync::copy_from(const torch::Tensor& flat, const std::vector<torch::Tensor>& tensors) {
  std::int64_t offset = 0;
  for (const auto& t : tensors) {
    t.detach().copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

void GradSync::begin(torch::Tensor control, std::int64_t step) {
  step_ = step;
  group_.step.store(step);
  arrived_.assign(params_.size(), false);
  for (auto& b : buckets_) {
    b.ready = 0;
    b.work.reset();
  }
  next_ = 0;
  control_ = {std::move(control)};
  control_work_ = group_.backend->allreduce(control_);
  if (buffers_flat_.defined()) {
    // The buffers this forward pass updated: rank 0's go to every rank while backward runs.
    torch::NoGradGuard no_grad;
    if (group_.env.rank == 0) copy_to(buffers_, buffers_flat_);
    std::vector<at::Tensor> t{buffers_flat_};
    buffers_work_ = group_.backend->broadcast(t);
  }
}

void GradSync::on_gradient(std::size_t param, const torch::Tensor& grad) {
  const Slice& s = slices_[param];
  Bucket& b = buckets_[s.bucket];
  b.flat.narrow(0, s.offset, s.numel).copy_(grad.reshape(-1));
  if (!arrived_[param]) {
    arrived_[param] = true;
    ++b.ready;
  }
  launch_ready(in_backward_);
}

void GradSync::launch_ready(std::uint64_t& counter) {
  // In bucket order on every rank: c10d pairs the ranks' collectives by their order.
  while (next_ < buckets_.size() && buckets_[next_].ready == buckets_[next_].params.size()) {
    std::vector<at::Tensor> t{buckets_[next_].flat};
    buckets_[next_].work = group_.backend->allreduce(t);
    ++next_;
    ++counter;
  }
}

torch::Tensor GradSync::finish() {
  torch::NoGradGuard no_grad;
  // Parameters the backward pass did not reach contribute zeros.
  for (std::size_t k = 0; k < params_.size(); ++k)
    if (!arrived_[k]) {
      const Slice& s = slices_[k];
      buckets_[s.bucket].flat.narrow(0, s.offset, s.numel).zero_();
      arrived_[k] = true;
      ++buckets_[s.bucket].ready;
    }
  launch_ready(after_backward_);
  const std::string what = fmt::format("the gradients' all-reduce at step {}", step_);
  group_.wait(control_work_, what);
  const double world = group_.env.world;
  for (auto& b : buckets_) {
    group_.wait(b.work, what);
    b.flat.div_(world);
    for (const std::size_t k : b.params) {
      // Into the gradient autograd made (not a view of the bucket: the optimizer detaches
      // gradients in place when it clears them).
      const Slice& s = slices_[k];
      const torch::Tensor mean = b.flat.narrow(0, s.offset, s.numel).view(params_[k].sizes());
      torch::Tensor& grad = params_[k].mutable_grad();
      if (grad.defined())
        grad.copy_(mean);
      else
        grad = mean.clone();
    }
  }
  if (buffers_work_) {
    group_.wait(buffers_work_, fmt::format("the buffers' broadcast at step {}", step_));
    buffers_work_.reset();
    if (group_.env.rank != 0) copy_from(buffers_flat_, buffers_);
  }
  return control_[0].to(torch::kCPU);
}

} // namespace kdflow::student
