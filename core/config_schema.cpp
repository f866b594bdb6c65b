// The schema of kdflow's configuration: every key, its default and its rule, in one table. Later
// modules add their keys here so that `config.toml` always lists the whole resolved configuration.
#include "kdflow/core/config.hpp"
#include "kdflow/core/dataset.hpp"

namespace kdflow {

const std::vector<ConfigKey>& config_schema() {
  using T = ConfigType;
  static const std::vector<ConfigKey> schema = {
      {"data.dataset", T::string, std::string("fashion-mnist"), "dataset format", dataset_names()},
      {"data.path", T::string, std::string("/usr/share/datasets/fashion-mnist"),
       "folder holding the dataset files (Debian's dataset-fashion-mnist by default; folder: "
       "train/<class>/*.jpg|png and val/ or test/ beside it)"},
      {"data.image_size",
       T::integer,
       std::int64_t{224},
       "folder only: the square crop each image becomes (3 channels)",
       {},
       8,
       4096},
      {"data.resize",
       T::integer,
       std::int64_t{256},
       "folder only: each image's shorter side is resized to this before the crop (random when "
       "training, centred for evaluation); at least data.image_size",
       {},
       8,
       8192},
      {"data.batch_size", T::integer, std::int64_t{64}, "samples per batch", {}, 1, 65536},
      {"data.pad_crop",
       T::integer,
       std::int64_t{0},
       "training augmentation: random crop after padding this many pixels (0: off; the default "
       "one-epoch job converges faster without, longer runs gain from 2-4)",
       {},
       0,
       64},
      {"data.hflip", T::boolean, false, "training augmentation: random horizontal flips"},
      {"data.mixup_alpha",
       T::real,
       0.0,
       "training augmentation: Mixup (torchvision.transforms.v2.MixUp): each batch mixed with "
       "itself rolled by one sample, lam ~ Beta(alpha, alpha); the teacher sees the mixed images "
       "and the CE target is the mixed labels (0: off; timm's recipes use 0.8)",
       {},
       0.0,
       100.0},
      {"data.cutmix_alpha",
       T::real,
       0.0,
       "training augmentation: CutMix (torchvision.transforms.v2.CutMix): a box of each image "
       "from the previous one, its area share ~ Beta(alpha, alpha); with data.mixup_alpha too, "
       "each batch takes one of them at even odds (0: off; timm's recipes use 1.0)",
       {},
       0.0,
       100.0},
      {"data.color_jitter", T::string, std::string("0,0,0,0"),
       "training augmentation: torchvision's ColorJitter(brightness, contrast, saturation, hue) "
       "as \"b,c,s,h\" after the crop and flip (factors uniform in [max(0, 1 - b), 1 + b], hue's "
       "in [-h, h] with h <= 0.5, the four in a random order; 0 turns one off; a one-channel image "
       "takes brightness and contrast only; e.g. 0.4,0.4,0.4,0)"},
      {"data.random_resized_crop", T::boolean, false,
       "folder only, training augmentation: torchvision's RandomResizedCrop(data.image_size, "
       "data.crop_scale, data.crop_ratio) instead of the resize and random crop (evaluation stays "
       "Resize(data.resize) + CenterCrop(data.image_size))"},
      {"data.dct_scaling", T::boolean, true,
       "folder only: decode a large JPEG at 1/2, 1/4 or 1/8 scale in the DCT domain where the crop "
       "keeps at least its output size (faster; false: always the full decode, whose crops are "
       "pixel for pixel torchvision's)"},
      {"data.crop_scale", T::string, std::string("0.08,1"),
       "data.random_resized_crop: the range of the crop's share of the image's area, \"lo,hi\" "
       "with 0 < lo <= hi <= 1"},
      {"data.crop_ratio", T::string, std::string("0.75,1.3333333"),
       "data.random_resized_crop: the range of the crop's aspect ratio (width / height), "
       "\"lo,hi\" with 0 < lo <= hi"},
      {"data.mean", T::string, std::string("auto"),
       "per-channel normalization mean, e.g. \"0.49,0.48,0.45\" (auto: the dataset's own; "
       "folder: ImageNet's)"},
      {"data.std", T::string, std::string("auto"),
       "per-channel normalization std (auto: the dataset's own; folder: ImageNet's)"},
      {"data.slot_dtype",
       T::string,
       std::string("float32"),
       "what the loaders write into a slot's input region: float32, normalized; or uint8 pixels as "
       "stored (4x less to copy to the GPU), normalized by the teacher and on the student's device",
       {"float32", "uint8"}},
      {"data.drop_last", T::boolean, true,
       "drop each epoch's last incomplete batch (false: train on it, short)"},
      {"teacher.model", T::string, std::string("models/fmnist_teacher.onnx"),
       "ONNX file of the frozen teacher (relative paths resolve against the working directory)"},
      // Choices of the keys below that name a module's vocabulary (teacher.precision,
      // student.device, train.amp, dist.backend, kd.loss, student.arch) are the module's, which
      // the app adds (run_schema): core includes no module.
      {"teacher.precision", T::string, std::string("fp32"),
       "teacher arithmetic on the CPU: fp32; bf16 (AVX512_BF16 or AMX); int8 (VNNI or AMX: "
       "calibrated at start on teacher.calibration_batches batches of training images, then "
       "checked against fp32 on the next batch)"},
      {"teacher.calibration_batches",
       T::integer,
       std::int64_t{8},
       "teacher.precision = int8: training batches (unaugmented, a fixed draw by train.seed) the "
       "fp32 teacher runs at start to set each quantized input's range",
       {},
       1,
       1024},
      {"teacher.tune",
       T::string,
       std::string("auto"),
       "auto: time each node's ways to run at load (at the run's batch, precision and threads) "
       "and keep the fastest, cached per model, batch and machine; off: the untuned plan",
       {"auto", "off"}},
      {"teacher.features", T::strings, std::vector<std::string>{},
       "intermediate values of the teacher's ONNX graph to compute beside the logits, each into "
       "its own slot region carried to the student's device (`kdflow teacher info` lists the "
       "names and shapes; a value named here is never fused away)"},
      {"teacher.input_size", T::string, std::string("auto"),
       "the images the teacher reads, \"N\" or \"HxW\": its replicas resize the slot's images "
       "to it (box average, then bilinear, as the loader resizes); auto: the size the model "
       "declares, and the data's where it leaves one open"},
      {"teacher.mean", T::string, std::string("auto"),
       "per-channel mean the teacher was trained with, e.g. \"0.485,0.456,0.406\" (auto: "
       "data.mean)"},
      {"teacher.std", T::string, std::string("auto"),
       "per-channel std the teacher was trained with (auto: data.std)"},
      {"teacher.weight",
       T::real,
       1.0,
       "this teacher's weight when teacher.others adds more: the target is the weighted mean of "
       "the teachers' distributions softened at kd.temperature (weights normalized to sum to 1)",
       {},
       1e-6,
       1e6},
      {"teacher.others",
       T::tables,
       std::vector<ConfigRow>{},
       "more teachers beside this one, one [[teacher.others]] table each (or write every teacher "
       "as a [[teacher]] block, the first being this one): each an ONNX model with the same "
       "classes, run by its own replicas on its own cores, on every batch beside the first",
       {},
       -1e300,
       1e300,
       {{"model", T::string, std::string(""), "ONNX file of the teacher"},
        {"precision", T::string, std::string("fp32"), "its arithmetic on the CPU"},
        {"weight", T::real, 1.0, "its weight in the teachers' mix", {}, 1e-6, 1e6},
        {"input_size", T::string, std::string("auto"), "as teacher.input_size, for this teacher"},
        {"mean", T::string, std::string("auto"), "as teacher.mean, for this teacher"},
        {"std", T::string, std::string("auto"), "as teacher.std, for this teacher"},
        {"features", T::strings, std::vector<std::string>{},
         "as teacher.features, for this teacher (its regions are feature<k>:<value>)"}}},
      // Its choices are the student registry's names (the app's run_schema).
      {"student.arch", T::string, std::string("cnn"),
       "student network: a built-in one, or torchscript (your module, student.path)"},
      {"student.path", T::string, std::string(""),
       "student.arch = torchscript: the module saved by torch.jit.script(m).save(path) or "
       "torch.jit.trace; it takes [batch, channels, height, width] float32 images and returns "
       "[batch, classes] logits (or a tuple or dict whose first or 'logits' entry they are)"},
      {"student.width",
       T::real,
       1.0,
       "width multiplier of the student's channels (or hidden units)",
       {},
       0.0625,
       16.0},
      // Its choices are the student module's (the app's run_schema).
      {"student.stem", T::string, std::string("auto"),
       "the built-in ResNets' and MobileNetV2's first layers: cifar (3x3 stride 1, for 28-64 pixel "
       "images), imagenet (torchvision's: 7x7 stride 2 and max-pool; stride-2 3x3), auto "
       "(imagenet from 96 pixels a side)"},
      {"student.device", T::string, std::string("auto"),
       "where the student trains: auto picks a GPU when one exists"},
      {"kd.temperature",
       T::real,
       4.0,
       "softmax temperature of the distillation loss",
       {},
       1e-3,
       1e3},
      // Its choices and each one's parameter keys (kd.<loss>_<param>) are the student's loss
      // table's, which the app adds (run_schema).
      {"kd.loss", T::string, std::string("kl"), "the distillation loss"},
      {"kd.alpha",
       T::real,
       0.9,
       "weight of the distillation loss; 0 trains without a teacher (the teacher is not run)",
       {},
       0.0,
       1.0},
      {"kd.features",
       T::tables,
       std::vector<ConfigRow>{},
       "feature distillation, one [[kd.features]] table per pair: a teacher value (computed as "
       "teacher.features are), a student tap (stage1..stageN or penultimate of a built-in "
       "student; a TorchScript student's named outputs) and a loss added to the KD and CE mix "
       "with its weight",
       {},
       -1e300,
       1e300,
       {{"teacher",
         T::string,
         std::string(""),
         "the teacher's ONNX value",
         {},
         -1e300,
         1e300,
         {},
         true},
        {"student", T::string, std::string(""), "the student's tap", {}, -1e300, 1e300, {}, true},
        // Its choices are the student's feature loss table's (run_schema).
        {"loss", T::string, std::string("hint"), "the feature loss (default: hint)"},
        {"weight", T::real, 1.0, "the loss's weight", {}, 0.0, 1e6},
        {"from",
         T::integer,
         std::int64_t{0},
         "the teacher the value is from, with several: 0 for [teacher] (the first [[teacher]] "
         "block), k for teacher.others[k]",
         {},
         0.0,
         1e6}}},
      {"kd.cache",
       T::string,
       std::string("none"),
       "the teacher's outputs kept per sample from its first time (memory): later epochs read them "
       "instead of running the teacher; disk: also kept in a file between runs (kd.cache_path), so "
       "a later run with the same teacher and data reads them from its first epoch (with several "
       "teachers, their mix is kept); needs the same teacher input every epoch (data.pad_crop = 0, "
       "data.hflip = false, no colour jitter, data held in memory) unless kd.cache_augmented; "
       "refused with mixup/cutmix; teacher features are kept beside the logits; "
       "several ranks each keep their own shard's",
       {"none", "memory", "disk"}},
      {"kd.cache_path", T::string, std::string(""),
       "kd.cache = disk: the file (\"\": teacher-outputs/<digest of what the outputs are computed "
       "from>.kdcache in kdflow's cache folder, $KDFLOW_CACHE_DIR or ~/.cache/kdflow); one written "
       "for another teacher or other data is refused"},
      {"kd.cache_topk",
       T::integer,
       std::int64_t{0},
       "kd.cache: keep only each sample's K largest logits, the other classes sharing the rest of "
       "the probability at kd.temperature (0: every logit)",
       {},
       0,
       1 << 20},
      {"kd.cache_augmented", T::boolean, false,
       "kd.cache with random views (crops, flips, colour jitter, an image folder): later epochs "
       "read the teacher's outputs for each sample's first view, not the view they train on "
       "(stale targets, no teacher cost); false: such a cache is refused"},
      {"train.epochs", T::integer, std::int64_t{1}, "passes over the training set", {}, 1, 100000},
      {"train.max_steps",
       T::integer,
       std::int64_t{0},
       "stop after this many steps (0: no limit)",
       {},
       0,
       1e15},
      {"train.lr", T::real, 0.2, "peak learning rate", {}, 0.0, 1e3},
      {"train.seed",
       T::integer,
       std::int64_t{42},
       "seed of sampling, augmentation and init",
       {},
       0,
       4294967295.0},
      {"train.checkpoint_every",
       T::integer,
       std::int64_t{500},
       "steps between checkpoints (0: only at each epoch's end)",
       {},
       0,
       1e15},
      {"train.optimizer", T::string, std::string("sgd"), "optimizer", {"sgd", "adamw"}},
      {"train.momentum", T::real, 0.9, "SGD momentum (AdamW: beta1)", {}, 0.0, 0.9999},
      {"train.nesterov", T::boolean, true, "Nesterov momentum (SGD)"},
      {"train.weight_decay", T::real, 5e-4, "weight decay (AdamW: decoupled)", {}, 0.0, 1.0},
      {"train.warmup_steps",
       T::integer,
       std::int64_t{50},
       "linear warm-up steps before the cosine schedule",
       {},
       0,
       1e15},
      {"train.clip_grad_norm",
       T::real,
       0.0,
       "clip the global gradient norm to this (0: no clipping)",
       {},
       0.0,
       1e9},
      {"train.amp", T::string, std::string("auto"),
       "mixed precision on CUDA: auto (bf16 where supported), bf16, fp16 (loss scaling) or off; "
       "the CPU always trains in fp32"},
      {"train.on_nonfinite",
       T::string,
       std::string("abort"),
       "a non-finite loss, gradient or teacher output: abort (last good checkpoint kept) or skip "
       "the step and count it",
       {"abort", "skip"}},
      {"train.log_every",
       T::integer,
       std::int64_t{50},
       "steps between lines of metrics.jsonl",
       {},
       1,
       1e15},
      {"train.tensorboard", T::boolean, true,
       "TensorBoard event files in the run folder (events.out.tfevents.*, rank 0): the scalars of "
       "metrics.jsonl at their steps, the configuration and the core plan as text"},
      {"train.export",
       T::string,
       std::string("auto"),
       "the trained student written beside summary.json at the end of the run, and checked "
       "against the student: onnx (built-in students: student.onnx), torchscript (a TorchScript "
       "student: student.pt), auto (the student's own form), off",
       {"auto", "onnx", "torchscript", "off"}},
      {"train.keep_checkpoints",
       T::integer,
       std::int64_t{3},
       "checkpoints kept in the run folder (older ones are deleted)",
       {},
       1,
       1000000},
      {"train.threads",
       T::integer,
       std::int64_t{0},
       "intra-op threads of the student on the CPU (0: the student's CPUs in the plan; more than "
       "those: the extra threads run on the teachers' CPUs too, sharing them; run with "
       "OMP_WAIT_POLICY=PASSIVE then)",
       {},
       0,
       4096},
      {"ring.slots",
       T::integer,
       std::int64_t{0},
       "batches in flight between loaders, teacher and student (0: sized for the plan: one for "
       "each loader and teacher CPU and each teacher replica and 4 for the student, at least 8, "
       "the ring at most an eighth of the machine's memory; 1 is refused)",
       {},
       0,
       4096},
      {"pipeline.stall_timeout_s",
       T::real,
       600.0,
       "seconds the student may wait for (or work on) one batch before the run stops, naming the "
       "stage that holds the batch (a stalled loader, teacher or student); 0: no limit",
       {},
       0.0,
       1e7},
      {"cores.plan", T::string, std::string("auto"),
       "core allocation: auto (from the topology) or a JSON plan file from kdflow tune-cores"},
      {"cores.student_cpus", T::string, std::string(""),
       "explicit CPU list for the student, e.g. \"0\" (with loader_cpus and teacher_cpus; empty: "
       "use cores.plan)"},
      {"cores.loader_cpus", T::string, std::string(""),
       "explicit CPU list for the loader pool, e.g. \"1-3\""},
      {"cores.teacher_cpus", T::string, std::string(""),
       "explicit CPU lists of the teacher replicas, ';' between replicas, e.g. \"4-7;8-11\""},
      {"cores.loader_cores",
       T::integer,
       std::int64_t{0},
       "cores for the loader pool with cores.plan = auto (0: a quarter of the rest, at least 1)",
       {},
       0,
       4096},
      {"cores.teacher_threads",
       T::integer,
       std::int64_t{0},
       "threads per teacher replica with cores.plan = auto (0: replicas of at most 8 cores)",
       {},
       0,
       4096},
      {"cores.student_first",
       T::string,
       std::string("auto"),
       "loaders and teachers on CPUs that the student's threads beyond its own CPUs also run on "
       "(train.threads) run only when the student's threads leave the CPU idle (Linux's "
       "SCHED_IDLE), so that the student's parallel steps never wait behind them: auto (those "
       "CPUs only), on (every loader and teacher CPU), off",
       {"auto", "on", "off"}},
      {"cores.elastic", T::boolean, true,
       "kd-ctl: while training, move CPUs between the loader pool and the teacher replicas when "
       "the student waits for the slower of them (false: the plan stays as it starts)"},
      {"cores.elastic_window_s",
       T::real,
       1.0,
       "kd-ctl's measurement window in seconds (a move needs two windows that agree)",
       {},
       0.05,
       3600.0},
      {"cores.elastic_margin",
       T::real,
       0.1,
       "kd-ctl moves a CPU only when that predicts at least this much more throughput (hysteresis)",
       {},
       0.0,
       10.0},
      {"dist.backend", T::string, std::string("auto"),
       "several ranks (torchrun): c10d's process group, auto (nccl for a CUDA student, else gloo); "
       "named, one rank under torchrun joins a group of one"},
      {"dist.timeout_s",
       T::real,
       300.0,
       "several ranks: a collective or the rendezvous that takes longer ends the job, naming the "
       "lost rank",
       {},
       1.0,
       86400.0},
      {"dist.bucket_mb",
       T::real,
       25.0,
       "several ranks: gradient bucket size; each bucket is all-reduced as soon as the backward "
       "pass has filled it",
       {},
       0.001,
       65536.0},
  };
  return schema;
}

} // namespace kdflow
