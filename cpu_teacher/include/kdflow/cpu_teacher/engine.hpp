// The teacher's execution plan on oneDNN: built once at load for one batch size (primitives chosen
// with format_tag::any, weights reordered once, a user-mode scratchpad), then run many times by
// replicas. A Teacher is immutable and shared; each Replica owns its intermediate buffers, its
// scratchpad and its stream, so replicas run concurrently from different threads. Parallelism
// stays inside the TBB arena the calling thread runs in (oneDNN's TBB runtime).
#pragma once

#include "kdflow/cpu_teacher/graph.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kdflow::teacher {

enum class Precision { fp32, bf16, int8 };

Precision parse_precision(const std::string& text); // "fp32" | "bf16" | "int8", else InputError
const char* precision_name(Precision p);
// Whether this CPU runs bf16 natively (AVX512_BF16 or AMX); bf16 elsewhere is emulated and slow.
bool has_native_bf16();
// Whether this CPU has int8 dot products (VNNI: AVX512_VNNI, AVX-VNNI, or AMX).
bool has_native_int8();
// Whether teacher.precision = int8 runs here: with dot products, or on AVX2 (and AVX-512) without
// them, where oneDNN's int8 kernels sum pairs of u8 x s8 products in 16 bits (vpmaddubsw), which
// saturate past 32767: there each pair of weights that a kernel may sum is held within 128
// together, or where the pairing is not known each weight within 7 bits (int8_weight_levels), so
// that no pair can reach it (255 x 128 = 32640, 255 x 63 x 2 = 32130).
bool has_int8();
// The largest magnitude of a quantized weight: 127 with int8 dot products, 63 without them where
// the kernel's pairs are not known (StepInfo::weight_levels and weight_pairs).
int int8_weight_levels();

// teacher.precision = int8: post-training calibration. Each quantized product's input (a
// convolution's, a Gemm's or MatMul's with constant weights) gets one scale for the whole tensor
// from the range the fp32 plan saw on real batches; weights get one scale per output channel at
// load. Products read u8 where the range is non-negative (after a ReLU), s8 elsewhere, and write
// f32, or u8/s8 where only quantized products read their output; every other op runs in f32.
struct Calibration {
  std::map<std::string, std::pair<float, float>> ranges; // value -> (min, max) seen
  std::size_t batches = 0;
  std::size_t samples = 0;
  std::uint64_t digest = 0; // of the ranges: keys the tuned plans
  // Kept in the plan cache's folder, keyed by the model's bytes, its input, the features and the
  // samples' bytes: a run that calibrates on the same samples reads the ranges back.
  bool from_cache = false;
  std::string cache_file; // "" where it could not be kept (the reason in `note`)
  std::string note;
};

// teacher.tune: `auto` times each node's ways to run at load (or reads the choice from the plan
// cache) and keeps the fastest; `off` runs every node its first way.
enum class Tune { off, automatic };
Tune parse_tune(const std::string& text); // "auto" | "off", InputError otherwise
const char* tune_name(Tune t);

// teacher.input_size (`key` in errors): "auto" -> nullopt; "N" or "HxW" -> the sample shape
// {0 (the model's channels), H, W} for TeacherOptions::sample_shape; InputError otherwise.
constexpr std::int64_t kMaxInputSide = 8192;
std::optional<Shape> parse_input_size(const std::string& text, const std::string& key);

struct TeacherOptions {
  std::int64_t batch = 64;
  Precision precision = Precision::fp32;
  // Intermediate values to return besides the graph's outputs (outputs after them, in this
  // order), each leading with the batch; `features_source` names what asked ("teacher.features",
  // "--feature") in errors.
  std::vector<std::string> features;
  std::string features_source = "feature";
  // The input's sample dimensions required (> 0; 0: the model's), the ones bound where the model
  // leaves them open, and what asked for them, for errors (LoadOptions).
  std::optional<Shape> sample_shape;
  std::optional<Shape> sample_default;
  std::string sample_source;
  Tune tune = Tune::off;
  // Threads each replica runs with: the tuner times the plans in an arena this size (0: the
  // calling thread's arena).
  int threads = 0;
  // With tune = off: ways every node that offers them runs, first listed first ("library",
  // "channels_last", "inner_product", "unrolled", "pointwise_depthwise", "winograd_4x4",
  // "winograd_2x2", "im2col", "pooling", "reduction"); a node offering none runs its first way.
  // Pins a plan by hand; the tests run every way through it.
  std::vector<std::string> prefer;
  // Samples per pass of the plan: a batch run as batch / samples_per_pass passes, each on the next
  // samples (a divisor of the batch; the model must compute each sample alike at both batches).
  // 0: with tune = auto the tuner times passes of fewer samples (a smaller working set) against the
  // whole batch and keeps the fastest; with tune = off the batch runs whole.
  std::int64_t samples_per_pass = 0;
  // How many of those passes run at once: 1, one pass at a time on all the replica's threads (each
  // primitive shares its work among them); or the replica's threads, each running passes of its
  // own on one thread (no primitive shares work: a pass of a few samples is too little to share
  // among threads well). 0: with tune = auto the tuner times both and keeps the faster; with
  // tune = off, or where the batch runs whole, one at a time.
  int passes_at_once = 0;
  // Where tuned plans are kept between runs; "" = $KDFLOW_CACHE_DIR, else $XDG_CACHE_HOME/kdflow,
  // else ~/.cache/kdflow (a "plans" folder inside).
  std::string cache_dir;
  GraphLimits limits; // LoadOptions
  // teacher.precision = int8: the ranges to quantize with (calibrate()); required there.
  std::shared_ptr<const Calibration> calibration;
};

// The graph import a teacher with `options` reads: its batch, sample shape, limits and the
// features kept from fusion.
LoadOptions load_options(const TeacherOptions& options);

// One node that can run more than one way, and what the tuner measured for each way (ms per
// batch of the node's own steps, the reorders it needs included; < 0 where not measured).
struct TunedNode {
  std::string node;
  std::vector<std::string> options;
  std::vector<double> ms;
  std::string chosen;
};

struct TuneReport {
  Tune mode = Tune::off;
  bool from_cache = false;
  std::string cache_file; // "" when the cache could not be used (the reason in `note`)
  std::string note;       // a cache that was unreadable or stale, a cache that could not be written
  double untuned_ms = 0;  // the plan with every node's first way, ms per batch (when tuned)
  double tuned_ms = 0;    // the plan kept
  std::size_t plans_timed = 0;
  double seconds = 0; // spent tuning
  // The batch in passes: the samples per pass kept (0: the batch whole, or the model's own fixed
  // batch), how many run at once (TeacherOptions::passes_at_once; 1 where the batch runs whole),
  // and what each number of samples per pass that was timed cost (ms per batch, the tuned ways):
  // one pass at a time (the whole batch first), and as many at once as threads, each on one.
  std::int64_t samples_per_pass = 0;
  int passes_at_once = 1;
  std::vector<std::pair<std::int64_t, double>> pass_ms;
  std::vector<std::pair<std::int64_t, double>> pass_at_once_ms;
  std::vector<TunedNode> nodes;
};

class Replica;

// How closely one teacher's logits follow a reference's on the same samples ([samples, classes]
// each): the share of samples whose top-1 class agrees, and the mean KL(reference || other) of
// their softmaxes (nats). int8 against fp32 on a batch the calibration did not see.
struct LogitAgreement {
  double top1 = 0;
  double kl = 0;
  std::size_t samples = 0;
};
LogitAgreement compare_logits(std::span<const float> reference, std::span<const float> other,
                              std::int64_t classes);
// One line for the user where int8 moved teacher `model`'s answers beyond quantization noise on
// its check batch: more than max(2, 5%) of the check's samples changed their top-1 (a trained
// network keeps 99% and more; a barely trained one's near-tied logits do not, nor activations far
// outside the calibrated ranges). Names the figures and the levers; empty where the check is fine.
std::string int8_check_warning(const LogitAgreement& check, const std::string& model);

// One step of the execution plan, for profiles: what it computes and what runs it.
struct StepInfo {
  std::string label; // the node ("Conv 'features.2.conv.1.0'") or the conversion ("reorder ...")
  std::string kind;  // ONNX op type, convolutions refined: "Conv (depthwise)", "Conv (pointwise)",
                     // "Conv (unrolled)", "Conv (grouped)", "Conv (pointwise+dw)",
                     // "Conv (winograd 4x4)", "Conv (winograd 2x2)" (3x3 kernels),
                     // "Conv (winograd 4x4, 5x5)", "Conv (winograd 2x2, 5x5)"; or "reorder"
  // oneDNN's implementation ("brgemm:avx512_core_amx"); or kdflow's own code: "plain kernel"
  // (rows or blocks: contiguous inner loops, copies, fills) or "reference loop" (element by
  // element, each element's offsets computed from its index, as the reference computes it); or a
  // kernel of kdflow's that runs a primitive itself
  // ("kdflow winograd 4x4 (avx512) + brg_matmul:avx512_core"), or a vectorized one of its own
  // ("kdflow planar->channels-last (avx512_vbmi)": no " + ").
  std::string impl;
  // The element type it writes: "f32" or "bf16" (teacher.precision = bf16 keeps some values in
  // f32, as PyTorch's autocast does).
  std::string writes;
  // int8: the largest magnitude of the step's quantized weights (127, or 63 where its kernel sums
  // pairs of u8 x s8 products in 16 bits and which it pairs is not known: conv_weight_quant); 0
  // for a step without them.
  int weight_levels = 0;
  // int8 without dot products: each pair of one sign among neighbouring input channels' weights
  // (at one tap) is held within weight_levels + 1 together, so that the kernel's 16-bit sum of a
  // pair of u8 x s8 products cannot saturate (quantize_rows); false elsewhere.
  bool weight_pairs = false;
  // The node whose lowering added the step ("" for the outputs' reorders); for a reorder that
  // converts a value into the layout or type that node reads it in, also the node that wrote the
  // value (`producer`; "" for the network's input and for a reorder that is an op's own work).
  std::string node;
  std::string producer;
  // The multiply-adds (counted 2 each) of a batch that the step computes: its node's products
  // and those of the nodes its lowering took in (a depthwise convolution run as the pointwise
  // one's post-op), on the node's last step that is not a reorder; 0 for the other steps. Only
  // convolutions, Gemm, MatMul and Einsum count (summarize's flops_per_sample), as written in
  // the graph: a Winograd step's figure is the direct convolution's.
  double flops = 0;
};

class Teacher {
public:
  static std::shared_ptr<const Teacher> load(const std::string& path,
                                             const TeacherOptions& options);
  // teacher.precision = int8's calibration: the fp32 plan of the teacher at `path` (`options` as
  // for load; its precision, tuning and features are not used) runs `samples` (plain floats of
  // the teacher's input, real samples, a whole number of batches) and records the range of every
  // value a product reads quantized under int8. An InputError naming `source` when `samples` is
  // not a whole number of batches.
  static Calibration calibrate(const std::string& path, const TeacherOptions& options,
                               std::span<const float> samples, const std::string& source);
  // teacher.precision = int8 in one call: calibrate on `samples` (options.calibration is set from
  // them), load the int8 teacher, and compare its logits (output 0) with the fp32 plan's on
  // `check`, one batch of real samples the calibration did not see (int8_check()). `source`
  // names the data in errors.
  static std::shared_ptr<const Teacher> load_int8(const std::string& path, TeacherOptions options,
                                                  std::span<const float> samples,
                                                  std::span<const float> check,
                                                  const std::string& source);
  ~Teacher();

  [[nodiscard]] const Graph& graph() const;
  [[nodiscard]] Precision precision() const;
  [[nodiscard]] std::int64_t batch() const;
  [[nodiscard]] Shape input_shape() const;                     // [batch, sample...]
  [[nodiscard]] std::vector<std::string> output_names() const; // graph outputs, then features
  [[nodiscard]] Shape output_shape(std::size_t k) const;
  [[nodiscard]] std::size_t steps() const;    // primitives and kernels per batch
  [[nodiscard]] std::size_t reorders() const; // of which layout/type conversions
  // Intermediate memory per replica (buffers whose lives do not overlap share it; a lane's worth
  // per pass run at once), and what one pass's buffers would take each on its own.
  [[nodiscard]] std::size_t buffer_bytes() const;
  [[nodiscard]] std::size_t unshared_buffer_bytes() const;
  [[nodiscard]] std::vector<StepInfo> step_info() const; // one per step, in execution order
  [[nodiscard]] const TuneReport& tune_report() const;
  // int8: the ranges it quantizes with, and (load_int8) its logits against the fp32 plan's on a
  // batch the calibration did not see; null / nullopt otherwise.
  [[nodiscard]] const Calibration* calibration() const;
  [[nodiscard]] std::optional<LogitAgreement> int8_check() const;

  struct Plan;
  [[nodiscard]] const Plan& plan() const { return *plan_; }

private:
  Teacher() = default;
  // The plan for `graph` in options' precision (and calibration), with its features and
  // `choices`; where it cannot be built, `graph` is left as it was.
  // passes_at_once > 1: built for one thread, to run that many of graph.chunks at once.
  static std::unique_ptr<Plan> build_plan(Graph&& graph, const TeacherOptions& options,
                                          std::map<std::string, std::string> choices,
                                          int passes_at_once = 1);
  // tune.cpp: the plan cache, or the fastest of the plans timed at load.
  static std::unique_ptr<Plan> tuned_plan(Graph graph, const TeacherOptions& options,
                                          const std::string& path);
  std::unique_ptr<Plan> plan_;
};

// How `t`'s plan runs its batch, for people: "the batch whole", "passes of N samples, one at a
// time" or "passes of N samples, K at once, each on one thread".
std::string describe_passes(const Teacher& t);

// Plain float32 buffers for every output of a teacher (output_shape(k) each), and their pointers
// as Replica::run takes them: for callers that keep the outputs outside a ring slot.
struct OutputBuffers {
  explicit OutputBuffers(const Teacher& teacher);
  std::vector<std::vector<float>> data;
  std::vector<float*> pointers;
};

class Replica {
public:
  explicit Replica(std::shared_ptr<const Teacher> teacher);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // One batch: `input` is plain row-major float32 of input_shape(); outputs[k] receives output k
  // (plain float32 of output_shape(k)), e.g. straight into a ring slot. Allocates nothing.
  void run(const float* input, std::span<float* const> outputs);
  // run(), also timing each step into step_seconds (one entry per Teacher::steps()). Each step is
  // waited for before the next starts; for profiles (`kdflow teacher bench --profile`).
  void run_timed(const float* input, std::span<float* const> outputs,
                 std::span<double> step_seconds);

  [[nodiscard]] const Teacher& teacher() const { return *teacher_; }

private:
  void execute(const float* input, std::span<float* const> outputs, std::span<double> step_seconds);
  struct State;
  std::shared_ptr<const Teacher> teacher_;
  std::unique_ptr<State> state_;
};

} // namespace kdflow::teacher
