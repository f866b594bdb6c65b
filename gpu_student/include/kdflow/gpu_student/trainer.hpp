// The student's training loop, one step per ring batch: forward, the KD + CE loss, backward, the
// optimizer and its schedule, on CUDA (copy stream, mixed precision) or on the CPU (the slot read
// in place). Checkpoints hold model, optimizer, step, RNG state and the caller's run state (sampler
// position and whatever else it needs), in a checked file written atomically. Torch-free header:
// the app includes it.
#pragma once

#include "kdflow/core/image_adapter.hpp"
#include "kdflow/core/slot_ring.hpp"
#include "kdflow/gpu_student/device.hpp"
#include "kdflow/gpu_student/process_group.hpp"
#include "kdflow/gpu_student/students.hpp"
#include "kdflow/gpu_student/torch_teacher.hpp"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace kdflow::student {

// A feature loss (kd.features): the student's tap, compared by `loss` (a feature_losses() row) with
// the teacher's value, weighted into the step's loss. A hint trains an adapter from the student's
// tap to the teacher's shape, kept in checkpoints (not in the exported student).
struct FeatureLoss {
  std::string teacher;       // the ONNX value (messages)
  std::string student;       // the tap (Net::tap_names)
  std::string loss = "hint"; // a feature_losses() row
  double weight = 1.0;
  std::vector<std::int64_t> teacher_shape; // per sample, the batch left out
  std::size_t teacher_output = 1;          // the value's index among the teacher's outputs
  std::string key;                         // "kd.features[k]", for errors
  std::size_t teacher_index = 0;           // which teacher (several: kd.features' `from`)
};

struct TrainerOptions {
  StudentSpec model;
  Device device;   // resolved once (resolve_device)
  int threads = 1; // intra-op threads on the CPU
  std::string optimizer = "sgd";
  double lr = 0.05, momentum = 0.9, weight_decay = 5e-4;
  bool nesterov = true;
  std::int64_t warmup_steps = 50;
  std::int64_t total_steps = 1; // length of the cosine schedule
  double clip_grad_norm = 0.0;
  std::string amp = "auto"; // auto | off | bf16 | fp16 (CUDA only)
  double kd_alpha = 0.9, kd_temperature = 4.0;
  // The distillation loss (a kd_losses() row: kl, dkd, ...) and its parameters in its row's order
  // (empty: the row's defaults); kd_alpha mixes it with CE.
  std::string kd_loss = "kl";
  std::vector<double> kd_params;
  std::vector<FeatureLoss> feature_losses; // added to the KD and CE mix, each with its weight
  bool skip_nonfinite = false;
  std::uint64_t seed = 42;
  // uint8 input slots: x * input_scale[c] + input_shift[c] per channel on the student's device
  // (the loader's normalization, kdflow::channel_scale/shift). Empty: the slots hold float32.
  std::vector<float> input_scale, input_shift;
  // Several ranks (torchrun): gradients averaged over `group` in buckets during the backward pass,
  // parameters and buffers rank 0's (process_group.hpp). Null: one process. Not owned.
  ProcessGroup* group = nullptr;
};

// Region indices of the slot layout the step reads.
struct StepRegions {
  std::size_t inputs = 0, labels = 1;
  std::optional<std::size_t> teacher_logits; // absent when kd.alpha = 0
  // The teacher's values the feature losses read: one region per TrainerOptions::feature_losses
  // (the colocated baseline computes them itself).
  std::vector<std::size_t> teacher_features;
  // Mixed batches (data.mixup_alpha, data.cutmix_alpha): each sample's partner label and the
  // share of its own label; CE is then lam * CE(y) + (1 - lam) * CE(partner), the cross-entropy
  // against torchvision's mixed one-hot target.
  std::optional<std::size_t> mix_labels, mix_lam;
};

// With several ranks the losses, hits and samples are the whole job's (summed over the ranks with
// the gradients); rank_samples is this rank's share.
struct StepStats {
  double loss = 0, kd_loss = 0, ce_loss = 0, lr = 0, grad_norm = 0;
  double feature_loss = 0;  // the feature losses' weighted sum
  std::int64_t correct = 0; // top-1 hits of the student on this (augmented) batch
  std::uint32_t samples = 0;
  bool skipped = false; // non-finite and train.on_nonfinite = "skip" (or an fp16 scale overflow)
  std::uint32_t rank_samples = 0;
  bool stop = false; // a rank asked to stop after this step (every rank sees it at the same step)
};

// Several ranks: how the gradient buckets went, over every step so far.
struct BucketStats {
  std::size_t buckets = 0;
  std::uint64_t launched_in_backward = 0;    // from the gradient hooks, overlapping backward
  std::uint64_t launched_after_backward = 0; // after it (buckets holding unused parameters)
};

// A non-finite loss, gradient or teacher output with train.on_nonfinite = "abort".
class NonFiniteError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// The student's mixed precision, chosen once for its device: "off" on the CPU (autocast is for
// CUDA only). On CUDA, `auto` is bf16 where the GPU computes in bf16 (compute capability 8.0 and
// up) and fp16 with loss scaling before that; bf16 asked of an older GPU is an InputError naming
// it. `gpu` names the device for that message ("" on the CPU).
std::string resolve_amp(const std::string& requested, int capability_major, const std::string& gpu);

// A teacher the colocated baseline runs on the student's device, and its weight among several.
struct ColocatedTeacher {
  std::shared_ptr<const TorchTeacher> teacher;
  std::optional<ImageAdapter> input;
  double weight = 1;
};

class Trainer {
public:
  // Builds the student (initialised from options.seed) on its device and the optimizer.
  Trainer(const TrainerOptions& options, SlotRing& ring, StepRegions regions);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains on ring batch `batch` (the next in order). nullopt when the ring closed and drained.
  // Rethrows a failed stage's StageError; NonFiniteError as above. `stop`: this process was asked
  // to stop (a signal); StepStats::stop says whether any rank was.
  std::optional<StepStats> step(std::uint64_t batch, bool stop = false);
  // Waits for the device and releases every slot still in flight.
  void drain();
  // The colocated baseline: each step first runs these teachers on the student's device on the
  // batch's inputs (instead of reading the slot's logits region), each made its own input by its
  // adapter when it has one (input_size, mean/std); several make their mix at kd_temperature the
  // target, as the pipeline's TeacherMix does. Empty: off.
  void set_colocated_teachers(std::vector<ColocatedTeacher> teachers);

  // Top-1 accuracy on plain float32 images [count, C, H, W] (normalized like the training data).
  double evaluate(std::span<const float> images, std::span<const std::int64_t> labels);
  // The number of those the student classifies right (a rank's share of a sharded evaluation).
  std::int64_t correct(std::span<const float> images, std::span<const std::int64_t> labels);
  // The student's logits in eval mode and full fp32 (no autocast, no TF32) for plain float32
  // images [count, C, H, W], [count, classes] row-major on the host (the reference an export is
  // checked against).
  std::vector<float> predict(std::span<const float> images);
  // Writes the trained student to `path`, atomically: "onnx" (built-in students: opset 17, input
  // "input" and output "logits" with an open batch, BatchNorm folded into the convolutions) or
  // "torchscript" (a TorchScript student: its module with the trained weights, in eval mode).
  // InputError for a format the student has no form in.
  void export_student(const std::filesystem::path& path, const std::string& format);

  // Checkpoint = model + optimizer + step + RNG state + `run_state` (opaque to the trainer).
  void save(const std::filesystem::path& path, const std::string& run_state) const;
  // Restores a checkpoint and returns its run state. InputError naming the file when it is
  // corrupt or was written for another student; the trainer is unusable after such an error.
  std::string load(const std::filesystem::path& path);
  // The same from a checked file's bytes (read_checked_file), `name` for the messages: every rank
  // restores the checkpoint rank 0 read.
  std::string load(std::span<const std::byte> payload, const std::string& name);

  [[nodiscard]] std::int64_t steps_done() const;
  [[nodiscard]] std::int64_t skipped_steps() const;
  [[nodiscard]] std::string device() const;    // "cpu" or "cuda:0 (name)"
  [[nodiscard]] std::string precision() const; // fp32, bf16 autocast, fp16 autocast
  [[nodiscard]] std::int64_t parameters() const;
  // The built-in student's forward FLOPs per sample (multiply-adds counted as 2); 0 for a
  // TorchScript student (its module is not counted).
  [[nodiscard]] double flops_per_sample() const;
  // Several ranks (TrainerOptions::group): the gradient buckets' record; nullopt for one process.
  [[nodiscard]] std::optional<BucketStats> bucket_stats() const;
  // Every parameter and buffer, flattened (tests compare runs bit for bit).
  [[nodiscard]] std::vector<float> state_vector() const;
  // The learning rate the schedule gives at `step`.
  [[nodiscard]] double lr_at(std::int64_t step) const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace kdflow::student
