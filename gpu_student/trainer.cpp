// The training step. One host synchronisation per step (the loss, gradient norm and hit count come
// back together), which is also where non-finite values are caught before the optimizer runs.
#include "kdflow/gpu_student/trainer.hpp"

#include "grad_sync.hpp"
#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/core/trace.hpp"
#include "kdflow/cpu_teacher/passes.hpp"
#include "kdflow/gpu_student/settings.hpp"
#include "losses.hpp"
#include "models.hpp"
#include "slot_feeder.hpp"
#include "step_targets.hpp"
#include "torch_teacher_impl.hpp"
#include "torch_util.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kdflow::student {
namespace {

constexpr int kCheckpointFormat = 1;

torch::Tensor bytes_tensor(const std::string& text) {
  return torch::from_blob(const_cast<char*>(text.data()), {static_cast<std::int64_t>(text.size())},
                          torch::kUInt8)
      .clone();
}

std::string tensor_bytes(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kCPU).contiguous();
  return {reinterpret_cast<const char*>(c.data_ptr<std::uint8_t>()),
          static_cast<std::size_t>(c.numel())};
}

// The student's identity in a checkpoint: what must match for its tensors to fit.
std::string describe(const TrainerOptions& o) {
  const std::string arch =
      o.model.arch == "torchscript"
          ? fmt::format("torchscript {} (digest {})", o.model.path, script_digest(o.model.path))
          : o.model.arch;
  std::string adapters;
  for (const auto& f : o.feature_losses)
    adapters += fmt::format(", feature loss {} {} -> {} [{}]", f.loss, f.student, f.teacher,
                            fmt::join(f.teacher_shape, ", "));
  return fmt::format("student {} width {} on {}x{}x{} inputs, {} classes, optimizer {}{}", arch,
                     o.model.width, o.model.channels, o.model.height, o.model.width_px,
                     o.model.classes, o.optimizer, adapters);
}

// Hopper, Ampere and Ada compute in bf16; Volta and Turing (7.x) do not.
constexpr int kBf16CapabilityMajor = 8;

} // namespace

std::string resolve_amp(const std::string& requested, int capability_major,
                        const std::string& gpu) {
  check_name("train.amp", requested, amp_names());
  if (capability_major == 0) return "off"; // the CPU student trains in fp32
  const bool bf16 = capability_major >= kBf16CapabilityMajor;
  if (requested == "auto") return bf16 ? "bf16" : "fp16";
  if (requested == "bf16" && !bf16)
    throw InputError(fmt::format("train.amp = bf16: {} (compute capability {}.x) has no bf16 "
                                 "arithmetic; use fp16 (with loss scaling), off, or auto",
                                 gpu, capability_major));
  return requested;
}

// One kd.features pair in the step: the student's tap made the teacher value's channels where the
// loss needs it (a hint's adapter), the teacher's map resized (bilinear) to the student's height
// and width where they differ, then the loss. The resize is on the teacher's side, which has no
// gradient: CUDA's bilinear backward accumulates with atomics, and resume must stay bit-exact.
struct FeatureTerm {
  FeatureLoss spec;
  std::vector<std::int64_t> student_shape; // per sample
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear linear{nullptr};
  const FeatureLossDef* def = nullptr; // spec.loss's row, found once

  torch::Tensor adapt(torch::Tensor s) {
    if (conv) s = conv->forward(s);
    if (linear) s = linear->forward(s);
    return s;
  }
  torch::Tensor teacher_side(const torch::Tensor& t) const {
    const auto& own = student_shape;
    if (!def->resize_teacher || t.dim() != 4 || own.size() != 3 ||
        (t.size(2) == own[1] && t.size(3) == own[2]))
      return t;
    return torch::nn::functional::interpolate(t,
                                              torch::nn::functional::InterpolateFuncOptions()
                                                  .size(std::vector<std::int64_t>{own[1], own[2]})
                                                  .mode(torch::kBilinear)
                                                  .align_corners(false));
  }
  torch::Tensor loss(const torch::Tensor& s, const torch::Tensor& t) const {
    return def->fn(s, teacher_side(t));
  }
};

struct StudentOutputs {
  torch::Tensor logits;
  std::vector<torch::Tensor> adapted; // each feature loss's student side
};
struct StepLosses {
  torch::Tensor loss, kd, ce, feature, hits;
};

struct Trainer::Impl {
  Impl(const TrainerOptions& o, SlotRing& ring, StepRegions r)
      : options(o), device(to_torch(o.device)), regions(r), feeder(ring, device) {
    if (device.is_cpu()) at::set_num_threads(std::max(1, o.threads));
    if (device.is_cuda()) {
      // The rank's GPU (LOCAL_RANK under torchrun) is the student thread's current device.
      c10::cuda::set_device(device.index());
      const cudaDeviceProp& prop = *at::cuda::getDeviceProperties(device.index());
      device_name = fmt::format("cuda:{} ({})", device.index(), prop.name);
      const std::string amp = resolve_amp(o.amp, prop.major, device_name);
      autocast = amp != "off";
      amp_dtype = amp == "fp16" ? torch::kHalf : torch::kBFloat16;
      loss_scaling = amp == "fp16";
    }
    if (!o.input_scale.empty()) {
      const auto c = static_cast<std::int64_t>(o.input_scale.size());
      input_scale = torch::tensor(o.input_scale).view({1, c, 1, 1}).to(device);
      input_shift = torch::tensor(o.input_shift).view({1, c, 1, 1}).to(device);
    }
    torch::manual_seed(o.seed);
    net = make_student(o.model);
    net->to(device);
    make_feature_terms();
    if (o.kd_alpha > 0 && regions.teacher_logits)
      targets = std::make_unique<RingTargets>(*regions.teacher_logits, regions.teacher_features,
                                              features.size());
    else
      targets = std::make_unique<NoTargets>();
    adapters->to(device);
    // The optimizer and the ranks' averaging see the adapters as part of the student.
    params = net->parameters();
    const std::vector<torch::Tensor> buffers = net->buffers();
    for (const auto& p : adapters->parameters()) params.push_back(p);
    if (o.group != nullptr) sync = std::make_unique<GradSync>(*o.group, params, buffers);
    if (o.optimizer == "adamw")
      optimizer = std::make_unique<torch::optim::AdamW>(
          params,
          torch::optim::AdamWOptions(o.lr).betas({o.momentum, 0.999}).weight_decay(o.weight_decay));
    else
      optimizer =
          std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(o.lr)
                                                          .momentum(o.momentum)
                                                          .nesterov(o.nesterov && o.momentum > 0)
                                                          .weight_decay(o.weight_decay));
  }

  // The shapes (the batch left out) of the student's taps `names`: one batch of two zero images
  // in eval mode, the buffers put back (a traced module may update them even so).
  std::vector<std::vector<std::int64_t>> tap_shapes(const std::vector<std::string>& names) {
    torch::NoGradGuard no_grad;
    std::vector<std::pair<torch::Tensor, torch::Tensor>> saved;
    for (auto& b : net->buffers()) saved.emplace_back(b, b.clone());
    const bool training = net->is_training();
    net->eval();
    Taps taps(names);
    const auto& spec = options.model;
    (void)net->forward(torch::zeros({2, spec.channels, spec.height, spec.width_px},
                                    torch::TensorOptions(device).dtype(torch::kFloat)),
                       taps);
    net->train(training);
    for (auto& [buffer, copy] : saved) buffer.copy_(copy);
    std::vector<std::vector<std::int64_t>> shapes;
    for (std::size_t k = 0; k < names.size(); ++k) {
      if (!taps.got()[k].defined())
        throw std::logic_error("student tap '" + names[k] + "' listed but never passed");
      const auto sizes = taps.got()[k].sizes().vec();
      shapes.emplace_back(sizes.begin() + 1, sizes.end());
    }
    return shapes;
  }

  // kd.features: each pair's tap checked against the student's, its shape against the teacher
  // value's, and a hint's adapter (a 1x1 convolution for maps, linear for vectors) made and
  // registered as adapters.hint<k>. InputError naming the pair where no loss can compare them.
  void make_feature_terms() {
    const auto& losses = options.feature_losses;
    if (losses.empty()) return;
    const auto offered = net->tap_names();
    for (const auto& f : losses) {
      if (std::find(offered.begin(), offered.end(), f.student) == offered.end())
        throw InputError(fmt::format("{}.student = '{}': student.arch = {} has no such tap (it has "
                                     "{})",
                                     f.key, f.student, options.model.arch,
                                     offered.empty()
                                         ? std::string("none: a TorchScript student "
                                                       "names its taps as entries of "
                                                       "the dict its forward returns")
                                         : fmt::format("{}", fmt::join(offered, ", "))));
      tap_order.push_back(f.student);
    }
    const auto shapes = tap_shapes(tap_order);
    for (std::size_t k = 0; k < losses.size(); ++k) {
      const FeatureLoss& f = losses[k];
      FeatureTerm term{f, shapes[k]};
      const auto& s = term.student_shape;
      const auto& t = f.teacher_shape;
      const auto refuse = [&](const std::string& why) {
        return InputError(fmt::format("{}: the student's '{}' [{}] and the teacher's '{}' [{}]: {}",
                                      f.key, f.student, fmt::join(s, ", "), f.teacher,
                                      fmt::join(t, ", "), why));
      };
      if (s.empty() || t.empty())
        throw refuse("a feature loss compares values with something per sample besides the batch");
      term.def = &feature_loss_def(f.loss);
      if (!term.def->maps_only_refusal.empty() && (s.size() != 3 || t.size() != 3))
        throw refuse(term.def->maps_only_refusal);
      if (term.def->adapter) {
        if (s.size() == 3 && t.size() == 3) {
          term.conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(s[0], t[0], 1));
          adapters->register_module(fmt::format("hint{}", k), term.conv);
        } else if (s.size() == 1 && t.size() == 1) {
          term.linear = torch::nn::Linear(s[0], t[0]);
          adapters->register_module(fmt::format("hint{}", k), term.linear);
        } else {
          throw refuse(fmt::format("no adapter bridges them (a {} maps [C, H, W] to [C', H', "
                                   "W'] and [D] to [D'])",
                                   f.loss));
        }
      }
      features.push_back(std::move(term));
    }
  }

  double lr_at(std::int64_t step) const {
    const auto warm = options.warmup_steps;
    if (step < warm) return options.lr * static_cast<double>(step + 1) / static_cast<double>(warm);
    const double span = static_cast<double>(std::max<std::int64_t>(1, options.total_steps - warm));
    const double t = std::min(1.0, static_cast<double>(step - warm) / span);
    return options.lr * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  }

  void set_lr(double lr) {
    for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
  }

  // The student's forward pass (under autocast on CUDA): its logits and each feature loss's
  // student side, adapted.
  StudentOutputs forward_student(const torch::Tensor& x) {
    StudentOutputs out;
    AutocastScope amp(autocast, amp_dtype);
    Taps taps(tap_order);
    out.logits = net->forward(x, taps);
    for (std::size_t k = 0; k < features.size(); ++k) {
      if (!taps.got()[k].defined())
        throw InputError(fmt::format("{}.student = '{}': the student did not give it in training "
                                     "(it did in eval mode)",
                                     features[k].spec.key, features[k].spec.student));
      out.adapted.push_back(features[k].adapt(taps.got()[k]).to(torch::kFloat));
    }
    return out;
  }

  // kd.alpha * KD + (1 - kd.alpha) * CE + the weighted feature losses, and the top-1 hits.
  StepLosses losses(const torch::Tensor& s, const torch::Tensor& y,
                    const std::vector<torch::Tensor>& adapted, const StepTargets& targets,
                    const torch::Tensor& mix_y = {}, const torch::Tensor& mix_lam = {}) {
    StepLosses l;
    l.ce = cross_entropy_mixed(s, y, mix_y, mix_lam);
    l.kd = torch::zeros({}, s.options());
    if (targets.logits.defined())
      l.kd = kd_loss->fn({s, targets.logits, y, options.kd_temperature, kd_params});
    l.feature = torch::zeros({}, s.options());
    for (std::size_t k = 0; k < targets.features.size(); ++k)
      l.feature =
          l.feature + features[k].spec.weight * features[k].loss(adapted[k], targets.features[k]);
    l.loss = options.kd_alpha * l.kd + (1.0 - options.kd_alpha) * l.ce + l.feature;
    l.hits = (s.argmax(1) == y).sum().to(torch::kFloat);
    return l;
  }

  // The step's figures in its single synchronisation: this rank's, or the job's (`job`, summed
  // over the ranks).
  StepStats stats_of(const StepLosses& l, const torch::Tensor& job, std::int64_t n, double lr,
                     bool stop) {
    std::vector<torch::Tensor> norms;
    for (const auto& p : params)
      if (p.grad().defined()) {
        if (loss_scaling) p.mutable_grad().mul_(1.0 / loss_scale);
        norms.push_back(p.grad().norm());
      }
    const torch::Tensor grad_norm = torch::stack(norms).norm();
    const torch::Tensor host = torch::stack({l.loss.detach(), l.kd.detach(), l.ce.detach(),
                                             grad_norm, l.hits, l.feature.detach()})
                                   .to(torch::kCPU);
    const auto* v = host.data_ptr<float>();
    StepStats stats;
    stats.loss = v[0];
    stats.kd_loss = v[1];
    stats.ce_loss = v[2];
    stats.lr = lr;
    stats.grad_norm = v[3];
    stats.feature_loss = v[5];
    stats.correct = static_cast<std::int64_t>(v[4]);
    stats.samples = static_cast<std::uint32_t>(n);
    stats.rank_samples = static_cast<std::uint32_t>(n);
    stats.stop = stop;
    if (job.defined()) {
      const auto* j = job.data_ptr<double>();
      stats.loss = j[0] / j[4];
      stats.kd_loss = j[1] / j[4];
      stats.ce_loss = j[2] / j[4];
      stats.feature_loss = j[6] / j[4];
      stats.correct = static_cast<std::int64_t>(j[3]);
      stats.samples = static_cast<std::uint32_t>(j[4]);
      stats.stop = j[5] > 0;
    }
    return stats;
  }

  // The optimizer's step (gradients clipped), or, for a non-finite loss or gradient, the fp16
  // scale's back-off, a skipped step (train.on_nonfinite = skip) or NonFiniteError naming what
  // was not finite.
  void apply(StepStats& stats, const StepTargets& targets, const torch::Tensor& x,
             std::uint64_t batch) {
    const bool loss_ok = std::isfinite(stats.loss);
    const bool grads_ok = std::isfinite(stats.grad_norm);
    if (loss_ok && !grads_ok && loss_scaling) {
      // An fp16 overflow of the scaled gradients: the usual dynamic loss-scaling back-off.
      loss_scale = std::max(1.0, loss_scale / 2);
      good_since_growth = 0;
      stats.skipped = true;
      return;
    }
    if (!loss_ok || !grads_ok) {
      std::string cause = !loss_ok ? "loss" : "gradient norm";
      const auto& tf = targets.features;
      const auto feature_at = std::find_if(tf.begin(), tf.end(), [](const torch::Tensor& t) {
        return !torch::isfinite(t).all().item<bool>();
      });
      if (targets.logits.defined() && !torch::isfinite(targets.logits).all().item<bool>())
        cause = "teacher output (logits)";
      else if (feature_at != tf.end())
        cause =
            fmt::format("teacher output ({})",
                        features[static_cast<std::size_t>(feature_at - tf.begin())].spec.teacher);
      else if (!torch::isfinite(x).all().item<bool>())
        cause = "input batch";
      if (!options.skip_nonfinite)
        throw NonFiniteError(
            fmt::format("non-finite {} at step {} (batch {}); the last checkpoint is kept. Set "
                        "train.on_nonfinite = \"skip\" to skip such steps",
                        cause, step, batch));
      ++skipped;
      stats.skipped = true;
      log_warn(fmt::format("non-finite {} at step {} (batch {}): step skipped ({} so far)", cause,
                           step, batch, skipped));
      return;
    }
    if (options.clip_grad_norm > 0 && stats.grad_norm > options.clip_grad_norm)
      for (const auto& p : params)
        if (p.grad().defined())
          p.mutable_grad().mul_(options.clip_grad_norm / (stats.grad_norm + 1e-6));
    optimizer->step();
    if (loss_scaling && ++good_since_growth == 2000) {
      loss_scale *= 2;
      good_since_growth = 0;
    }
  }

  TrainerOptions options;
  // The distillation loss's row and its parameters (the row's defaults where none are given).
  const KdLossDef* kd_loss = &kd_loss_def(options.kd_loss);
  std::vector<double> kd_params = [this] {
    std::vector<double> p = options.kd_params;
    if (p.empty())
      for (const LossParam& param : kd_loss->info.params) p.push_back(param.default_value);
    if (p.size() != kd_loss->info.params.size())
      throw std::invalid_argument(fmt::format("kd.loss = {}: {} parameter(s), {} given",
                                              options.kd_loss, kd_loss->info.params.size(),
                                              p.size()));
    return p;
  }();
  torch::Device device;
  std::string device_name = "cpu";
  StepRegions regions;
  SlotFeeder feeder;
  std::shared_ptr<Net> net;
  // kd.features: one term per pair, the taps they read in their order, and the hints' adapters.
  std::vector<FeatureTerm> features;
  std::vector<std::string> tap_order;
  std::shared_ptr<torch::nn::Module> adapters = std::make_shared<torch::nn::Module>();
  std::vector<torch::Tensor> params; // what the optimizer trains: the student's, the adapters'
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<GradSync> sync; // several ranks
  bool autocast = false;
  torch::ScalarType amp_dtype = torch::kBFloat16;
  bool loss_scaling = false;
  double loss_scale = 65536.0;
  std::int64_t good_since_growth = 0;
  std::int64_t step = 0;
  std::int64_t skipped = 0;
  // Where each step's targets come from (set_colocated_teachers replaces it).
  std::unique_ptr<TargetSource> targets;
  // The student's identity in checkpoints (describe(): a TorchScript module's file is read once).
  std::string identity = describe(options);
  torch::Tensor input_scale, input_shift; // uint8 slots: normalized here, [1, C, 1, 1]

  // The batch's inputs as the network takes them: float32 slots as they are, uint8 normalized.
  torch::Tensor network_input(const torch::Tensor& slot_inputs) const {
    if (slot_inputs.scalar_type() != torch::kByte) return slot_inputs;
    if (!input_scale.defined())
      throw std::logic_error("uint8 input slots need TrainerOptions::input_scale/input_shift");
    return slot_inputs.to(torch::kFloat) * input_scale + input_shift;
  }
};

Trainer::Trainer(const TrainerOptions& options, SlotRing& ring, StepRegions regions)
    : impl_(std::make_unique<Impl>(options, ring, regions)) {}

Trainer::~Trainer() {
  try {
    impl_->feeder.drain();
  } catch (...) {
    // Closing down after a failure: the ring's own error is what the caller reports.
  }
}

std::optional<StepStats> Trainer::step(std::uint64_t batch, bool stop) {
  Impl& m = *impl_;
  trace::Span wait("wait", batch);
  auto b = m.feeder.next(batch);
  if (!b) return std::nullopt;
  wait.end();
  trace::Span span("step", batch);
  const std::int64_t n = b->samples;
  const torch::Tensor inputs = m.network_input(b->regions[m.regions.inputs]);
  const torch::Tensor x = inputs.slice(0, 0, n);
  const torch::Tensor y = b->regions[m.regions.labels].slice(0, 0, n);
  const double lr = m.lr_at(m.step);
  m.set_lr(lr);
  m.net->train();

  const StudentOutputs student = m.forward_student(x);
  const torch::Tensor s = student.logits.to(torch::kFloat);
  const StepTargets targets = m.targets->get(*b, inputs, n, batch);
  torch::Tensor mix_y, mix_lam;
  if (m.regions.mix_labels && m.regions.mix_lam) {
    mix_y = b->regions[*m.regions.mix_labels].slice(0, 0, n);
    mix_lam = b->regions[*m.regions.mix_lam].slice(0, 0, n);
  }
  const StepLosses losses = m.losses(s, y, student.adapted, targets, mix_y, mix_lam);
  if (m.sync) {
    // The job's losses, hits, samples and stop requests, summed over the ranks beside the
    // gradients: [loss * n, kd * n, ce * n, hits, n, stop, feature * n].
    const auto count = static_cast<double>(n);
    const torch::Tensor control =
        torch::stack({losses.loss.detach() * count, losses.kd.detach() * count,
                      losses.ce.detach() * count, losses.hits, torch::full({}, count, s.options()),
                      torch::full({}, stop ? 1.0 : 0.0, s.options()),
                      losses.feature.detach() * count})
            .to(torch::kDouble);
    m.sync->begin(control, m.step);
  }
  m.optimizer->zero_grad(true);
  (m.loss_scaling ? losses.loss * m.loss_scale : losses.loss).backward();
  const torch::Tensor job = m.sync ? m.sync->finish() : torch::Tensor();
  StepStats stats = m.stats_of(losses, job, n, lr, stop);
  m.apply(stats, targets, x, batch);
  m.optimizer->zero_grad(true);
  ++m.step;
  m.feeder.finish_step();
  return stats;
}

void Trainer::drain() { impl_->feeder.drain(); }

void Trainer::set_colocated_teachers(std::vector<ColocatedTeacher> teachers) {
  for (const ColocatedTeacher& c : teachers)
    if (!c.teacher || c.teacher->impl().device != impl_->device)
      throw std::invalid_argument("a colocated teacher must run on the student's device");
  if (teachers.empty() || !(impl_->options.kd_alpha > 0)) return;
  impl_->targets = std::make_unique<ColocatedTargets>(
      std::move(teachers), impl_->options.kd_temperature, impl_->options.feature_losses);
}

double Trainer::evaluate(std::span<const float> images, std::span<const std::int64_t> labels) {
  const auto count = static_cast<double>(labels.size());
  return count > 0 ? static_cast<double>(correct(images, labels)) / count : 0.0;
}

std::int64_t Trainer::correct(std::span<const float> images, std::span<const std::int64_t> labels) {
  Impl& m = *impl_;
  const auto& spec = m.options.model;
  const std::int64_t count = static_cast<std::int64_t>(labels.size());
  const std::int64_t sample = spec.channels * spec.height * spec.width_px;
  if (static_cast<std::int64_t>(images.size()) != count * sample)
    throw std::invalid_argument("evaluate: images and labels disagree in count");
  torch::NoGradGuard no_grad;
  m.net->eval();
  std::int64_t correct = 0;
  constexpr std::int64_t kChunk = 500;
  for (std::int64_t i = 0; i < count; i += kChunk) {
    const std::int64_t k = std::min(kChunk, count - i);
    const torch::Tensor x =
        torch::from_blob(const_cast<float*>(images.data()) + i * sample,
                         {k, spec.channels, spec.height, spec.width_px}, torch::kFloat)
            .to(m.device);
    const torch::Tensor y =
        torch::from_blob(const_cast<std::int64_t*>(labels.data()) + i, {k}, torch::kInt64)
            .to(m.device);
    AutocastScope amp(m.autocast, m.amp_dtype);
    correct += (m.net->forward(x).argmax(1) == y).sum().item<std::int64_t>();
  }
  m.net->train();
  return correct;
}

std::vector<float> Trainer::predict(std::span<const float> images) {
  Impl& m = *impl_;
  const auto& spec = m.options.model;
  const std::int64_t sample = spec.channels * spec.height * spec.width_px;
  const auto count = static_cast<std::int64_t>(images.size()) / sample;
  torch::NoGradGuard no_grad;
  m.net->eval();
  const torch::Tensor x =
      torch::from_blob(const_cast<float*>(images.data()),
                       {count, spec.channels, spec.height, spec.width_px}, torch::kFloat)
          .to(m.device);
  // In full fp32, as the exported file computes: no autocast, and on CUDA no TF32 in cuDNN's
  // convolutions or in matrix products for this pass (the settings and train mode come back
  // however it ends).
  struct Fp32Pass {
    explicit Fp32Pass(Net& n) : net(n) {
      auto& c = at::globalContext();
      c.setAllowTF32CuDNN(false);
      c.setAllowTF32CuBLAS(false);
    }
    ~Fp32Pass() {
      auto& c = at::globalContext();
      c.setAllowTF32CuDNN(conv);
      c.setAllowTF32CuBLAS(matmul);
      net.train();
    }
    Fp32Pass(const Fp32Pass&) = delete;
    Fp32Pass& operator=(const Fp32Pass&) = delete;
    Net& net;
    bool conv = at::globalContext().allowTF32CuDNN();
    bool matmul = at::globalContext().allowTF32CuBLAS();
  };
  torch::Tensor host;
  {
    const Fp32Pass fp32(*m.net);
    host = m.net->forward(x).to(torch::kCPU).to(torch::kFloat).contiguous();
  }
  return {host.data_ptr<float>(), host.data_ptr<float>() + host.numel()};
}

void Trainer::export_student(const std::filesystem::path& path, const std::string& format) {
  Impl& m = *impl_;
  const bool script = m.options.model.arch == "torchscript";
  if (format == "torchscript") {
    if (!script)
      throw InputError(fmt::format("train.export = torchscript: the built-in student {} is "
                                   "exported as ONNX (train.export = onnx)",
                                   m.options.model.arch));
    std::ostringstream out;
    save_script_net(*m.net, out);
    write_file_atomic(path, out.str());
    return;
  }
  if (format != "onnx")
    throw std::invalid_argument("export_student: format " + format + " is not onnx or torchscript");
  if (script)
    throw InputError("train.export = onnx: a TorchScript student is exported as TorchScript "
                     "(train.export = torchscript; torch.onnx.export in Python converts it)");
  torch::NoGradGuard no_grad;
  GraphWriter writer(m.options.model);
  const std::string logits = m.net->export_onnx(writer, writer.input());
  teacher::write_onnx(writer.finish(logits), path.string(), "kdflow");
}

void Trainer::save(const std::filesystem::path& path, const std::string& run_state) const {
  const Impl& m = *impl_;
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model, optim;
  m.net->save(model);
  m.optimizer->save(optim);
  if (!m.features.empty()) {
    torch::serialize::OutputArchive adapters;
    m.adapters->save(adapters);
    archive.write("adapters", adapters);
  }
  archive.write("model", model);
  archive.write("optimizer", optim);
  archive.write("format", torch::tensor(std::int64_t{kCheckpointFormat}));
  archive.write("student", bytes_tensor(m.identity));
  archive.write("step", torch::tensor(m.step));
  archive.write("skipped", torch::tensor(m.skipped));
  archive.write("loss_scale", torch::tensor(m.loss_scale, torch::kDouble));
  archive.write("rng_cpu", at::detail::getDefaultCPUGenerator().get_state());
  archive.write("run_state", bytes_tensor(run_state));
  std::ostringstream out;
  archive.save_to(out);
  const std::string bytes = std::move(out).str();
  write_checked_file(path, std::as_bytes(std::span(bytes.data(), bytes.size())));
}

std::string Trainer::load(const std::filesystem::path& path) {
  return load(read_checked_file(path, "checkpoint"), path.string());
}

std::string Trainer::load(std::span<const std::byte> payload, const std::string& name) {
  Impl& m = *impl_;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(reinterpret_cast<const char*>(payload.data()), payload.size(), m.device);
    // A fresh tensor per key: reading into a defined tensor would set_() its storage in place.
    auto tensor_at = [&archive](const char* key) {
      torch::Tensor t;
      archive.read(key, t);
      return t;
    };
    const auto format = tensor_at("format").item<std::int64_t>();
    if (format != kCheckpointFormat)
      throw InputError(fmt::format("checkpoint {}: format {} (this kdflow reads {})", name, format,
                                   kCheckpointFormat));
    const std::string written = tensor_bytes(tensor_at("student"));
    if (written != m.identity)
      throw InputError(
          fmt::format("checkpoint {}: written for {}; this run has {}", name, written, m.identity));
    torch::serialize::InputArchive model, optim;
    archive.read("model", model);
    archive.read("optimizer", optim);
    m.net->load(model);
    if (!m.features.empty()) {
      torch::serialize::InputArchive adapters;
      archive.read("adapters", adapters);
      m.adapters->load(adapters);
    }
    m.optimizer->load(optim);
    m.step = tensor_at("step").item<std::int64_t>();
    m.skipped = tensor_at("skipped").item<std::int64_t>();
    m.loss_scale = tensor_at("loss_scale").item<double>();
    at::Generator cpu_generator = at::detail::getDefaultCPUGenerator();
    cpu_generator.set_state(tensor_at("rng_cpu").to(torch::kCPU));
    return tensor_bytes(tensor_at("run_state"));
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw InputError(fmt::format("checkpoint {}: unreadable or incompatible ({})", name,
                                 what.substr(0, what.find('\n'))));
  }
}

std::int64_t Trainer::steps_done() const { return impl_->step; }
std::int64_t Trainer::skipped_steps() const { return impl_->skipped; }

std::string Trainer::device() const { return impl_->device_name; }

std::string Trainer::precision() const {
  if (!impl_->autocast) return "fp32";
  return impl_->amp_dtype == torch::kHalf ? "fp16 autocast, loss scaling" : "bf16 autocast";
}

std::int64_t Trainer::parameters() const {
  std::int64_t n = 0;
  for (const auto& p : impl_->net->parameters()) n += p.numel();
  return n;
}

double Trainer::flops_per_sample() const {
  const Impl& m = *impl_;
  if (m.options.model.arch == "torchscript") return 0; // a module of the user's: not counted
  // The student's ONNX form, read back by the teacher's importer, whose FLOP count is the one
  // `kdflow teacher info` prints (multiply-adds counted as 2).
  char dir[] = "/tmp/kdflow-student-flops.XXXXXX";
  if (::mkdtemp(dir) == nullptr) return 0;
  const std::string path = std::string(dir) + "/student.onnx";
  double flops = 0;
  try {
    torch::NoGradGuard no_grad;
    GraphWriter writer(m.options.model);
    const std::string logits = m.net->export_onnx(writer, writer.input());
    teacher::write_onnx(writer.finish(logits), path, "kdflow");
    teacher::LoadOptions lo;
    lo.batch = 1;
    flops = teacher::summarize(teacher::load_onnx(path, lo)).flops_per_sample;
  } catch (const std::exception&) {
    flops = 0; // a count, not the run: it goes unprinted
  }
  // POSIX, not std::filesystem: LibTorch exports an older std::filesystem the linker may bind.
  ::unlink(path.c_str());
  ::rmdir(dir);
  return flops;
}

std::optional<BucketStats> Trainer::bucket_stats() const {
  if (!impl_->sync) return std::nullopt;
  const GradSync& g = *impl_->sync;
  return BucketStats{g.buckets(), g.launched_in_backward(), g.launched_after_backward()};
}

std::vector<float> Trainer::state_vector() const {
  std::vector<float> out;
  auto append = [&out](const torch::Tensor& t) {
    const torch::Tensor c = t.detach().to(torch::kCPU).to(torch::kFloat).contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  };
  for (const auto& p : impl_->net->parameters()) append(p);
  for (const auto& b : impl_->net->buffers()) append(b);
  for (const auto& p : impl_->adapters->parameters()) append(p);
  return out;
}

double Trainer::lr_at(std::int64_t step) const { return impl_->lr_at(step); }

} // namespace kdflow::student
