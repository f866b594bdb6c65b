// The schema of kdflow's configuration: every key, its default and its rule, in one table. Later
// modules add their keys here so that `config.toml` always lists the whole resolved configuration.
#include "kdflow/core/config.hpp"

namespace kdflow {

const std::vector<ConfigKey>& config_schema() {
  using T = ConfigType;
  static const std::vector<ConfigKey> schema = {
      {"data.dataset", T::string, std::string("fashion-mnist"), "dataset format",
       {"fashion-mnist", "mnist", "cifar10", "cifar100", "folder"}},
      {"data.path", T::string, std::string("/usr/share/datasets/fashion-mnist"),
       "folder holding the dataset files (Debian's dataset-fashion-mnist by default)"},
      {"data.batch_size", T::integer, std::int64_t{128}, "samples per batch", {}, 1, 65536},
      {"teacher.model", T::string, std::string("models/fmnist_teacher.onnx"),
       "ONNX file of the frozen teacher (relative paths resolve against the working directory)"},
      {"teacher.precision", T::string, std::string("fp32"), "teacher arithmetic on the CPU",
       {"fp32", "bf16"}},
      {"student.arch", T::string, std::string("cnn"), "student network",
       {"mlp", "cnn", "resnet20", "resnet56", "resnet18", "mobilenetv2"}},
      {"student.device", T::string, std::string("auto"),
       "where the student trains: auto picks a GPU when one exists", {"auto", "cpu", "cuda"}},
      {"kd.temperature", T::real, 4.0, "softmax temperature of the distillation loss", {}, 1e-3,
       1e3},
      {"kd.alpha", T::real, 0.9,
       "weight of the distillation loss; 0 trains without a teacher (the teacher is not run)", {},
       0.0, 1.0},
      {"train.epochs", T::integer, std::int64_t{1}, "passes over the training set", {}, 1, 100000},
      {"train.max_steps", T::integer, std::int64_t{0}, "stop after this many steps (0: no limit)",
       {}, 0, 1e15},
      {"train.lr", T::real, 0.05, "peak learning rate", {}, 0.0, 1e3},
      {"train.seed", T::integer, std::int64_t{42}, "seed of sampling, augmentation and init", {},
       0, 4294967295.0},
      {"train.checkpoint_every", T::integer, std::int64_t{500},
       "steps between checkpoints (0: only at each epoch's end)", {}, 0, 1e15},
      {"ring.slots", T::integer, std::int64_t{8},
       "batches in flight between loaders, teacher and student", {}, 2, 4096},
      {"cores.plan", T::string, std::string("auto"),
       "core allocation: auto (from the topology) or a JSON plan file from kdflow tune-cores"},
      {"cores.student_cpus", T::string, std::string(""),
       "explicit CPU list for the student, e.g. \"0\" (with loader_cpus and teacher_cpus; empty: use cores.plan)"},
      {"cores.loader_cpus", T::string, std::string(""), "explicit CPU list for the loader pool, e.g. \"1-3\""},
      {"cores.teacher_cpus", T::string, std::string(""),
       "explicit CPU lists of the teacher replicas, ';' between replicas, e.g. \"4-7;8-11\""},
      {"cores.loader_cores", T::integer, std::int64_t{0},
       "cores for the loader pool with cores.plan = auto (0: a quarter of the rest, at least 1)", {},
       0, 4096},
      {"cores.teacher_threads", T::integer, std::int64_t{0},
       "threads per teacher replica with cores.plan = auto (0: replicas of at most 8 cores)", {}, 0,
       4096},
  };
  return schema;
}

} // namespace kdflow
