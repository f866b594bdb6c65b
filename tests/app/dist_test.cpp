// Several ranks, as users launch them: the venv's real torchrun starting kdflow processes that meet
// through c10d's TCPStore and average gradients with ProcessGroupGloo, on this machine's CPUs (the
// ranks share them when it has few). No mocks: what is checked is what the ranks wrote.
#include "kdflow/cpu_teacher/graph.hpp"
#include "kdflow_process.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

using namespace kdflow_test;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The fast run of train_test.cpp (MLP student, MLP fixture teacher) with `sets`, its students on
// the CPU wherever the test runs: several local ranks average through Gloo on the host, and a node
// with one GPU has none for a second rank.
std::vector<std::string> train_args(const fs::path& out, int batch,
                                    std::initializer_list<std::string> sets) {
  return with(with(fast_train_args(out, batch), {"student.device=cpu"}), sets);
}

// How many CUDA devices kdflow sees here (its --version line).
int visible_gpus() {
  const fs::path out = scratch("dist_version.txt");
  const Child c = spawn({"--version"}, out.string() + ".stderr", out);
  EXPECT_EQ(wait_exit(c), 0) << read_text(c.err);
  std::smatch m;
  const std::string text = read_text(out);
  return std::regex_search(text, m, std::regex("GPUs: +([0-9]+)")) ? std::stoi(m[1]) : 0;
}

// torchrun's own options, then kdflow's: each rank's output in <logs>/.../<local rank>/.
std::vector<std::string> launch(std::vector<std::string> torchrun, const fs::path& logs,
                                const std::vector<std::string>& kdflow) {
  torchrun.insert(torchrun.end(),
                  {"--log-dir", logs.string(), "--redirects", "3", "--no-python", KDFLOW_BIN});
  torchrun.insert(torchrun.end(), kdflow.begin(), kdflow.end());
  return torchrun;
}

std::vector<std::string> local(int ranks) {
  return {"--standalone", "--nproc-per-node", std::to_string(ranks)};
}

Child start_torchrun(const std::vector<std::string>& args, const fs::path& out) {
  return spawn_program(KD_TORCHRUN, args, out.string() + ".torchrun");
}

Result torchrun(const std::vector<std::string>& args, const fs::path& out) {
  const Child c = start_torchrun(args, out);
  const int code = wait_exit(c);
  return {code, read_text(c.err)};
}

// What local rank `rank` wrote on stderr (torchrun --log-dir, --redirects 3).
std::string rank_stderr(const fs::path& logs, int rank) {
  for (const auto& e : fs::recursive_directory_iterator(logs))
    if (e.path().filename() == "stderr.log" &&
        e.path().parent_path().filename() == std::to_string(rank))
      return read_text(e.path());
  return "<no stderr.log for local rank " + std::to_string(rank) + " under " + logs.string() + ">";
}

json summary(const fs::path& out) { return json::parse(read_text(out / "summary.json")); }

int metric_lines(const fs::path& out) {
  std::ifstream in(out / "metrics.jsonl");
  int n = 0;
  for (std::string line; std::getline(in, line);)
    n += !json::parse(line).contains("event"); // kd-ctl's moves and the evaluations aside
  return n;
}

std::vector<fs::path> checkpoints(const fs::path& out) {
  std::vector<fs::path> files;
  if (!fs::exists(out / "checkpoints")) return files;
  for (const auto& e : fs::directory_iterator(out / "checkpoints"))
    if (e.path().extension() == ".ckpt") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

// A TCP port nobody listens on now (the kernel's pick), for a rendezvous endpoint.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t size = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &size);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// The worker process of `torchrun` that has RANK=`rank` (-1 when none yet).
pid_t worker(pid_t torchrun, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_text(e.path() / "stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    pid_t parent = 0;
    rest >> state >> parent;
    if (parent != torchrun) continue;
    std::string environ_text = read_text(e.path() / "environ");
    std::replace(environ_text.begin(), environ_text.end(), '\0', '\n');
    if (("\n" + environ_text).find("\nRANK=" + std::to_string(rank) + "\n") != std::string::npos)
      return static_cast<pid_t>(std::stoi(name));
  }
  return -1;
}

// The student's exported weights (run passes off: the initializers as written).
std::map<std::string, kdflow::teacher::Tensor> weights(const fs::path& onnx) {
  kdflow::teacher::LoadOptions options;
  options.batch = 1;
  options.run_passes = false;
  return kdflow::teacher::load_onnx(onnx.string(), options).constants;
}

// How far apart the exported students of runs `a` and `b` are: the largest difference of any
// weight, relative to that tensor's largest magnitude.
double student_distance(const fs::path& a_run, const fs::path& b_run) {
  const auto a = weights(a_run / "student.onnx"), b = weights(b_run / "student.onnx");
  EXPECT_EQ(a.size(), b.size());
  EXPECT_FALSE(a.empty());
  double worst = 0;
  for (const auto& [name, t] : a) {
    if (!b.count(name)) {
      ADD_FAILURE() << name << " is missing from " << b_run;
      return 1e300;
    }
    const auto& u = t.f;
    const auto& v = b.at(name).f;
    EXPECT_EQ(u.size(), v.size()) << name;
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < std::min(u.size(), v.size()); ++i) {
      diff = std::max(diff, static_cast<double>(std::abs(u[i] - v[i])));
      scale = std::max(scale, static_cast<double>(std::abs(u[i])));
    }
    worst = std::max(worst, diff / std::max(scale, 1e-30));
  }
  return worst;
}

// Two ranks of 32 and one process of 64 sum the same gradients in another order; over 30 SGD
// steps that rounding grows, by how much depends on the CPU's kernels: 3e-7 of the largest weight
// on an AMD EPYC Zen 4 (2.6-3.8e-7 there with LibTorch and MKL capped at AVX2 or SSE4.2), 1.8e-4
// once and 3.0e-3 once on CI machines. A wrong global batch (other samples, a gradient summed and
// not averaged, a bucket left out) is 0.19-1.2 (measured: batch 32 against 64), nine times the
// bound and more.
constexpr double kSummationOrder = 2e-2;
// The least distance a wrong global batch gave (one process on batches of 32, above).
constexpr double kWrongBatch = 0.1;

// The exported students of runs `a` and `b` hold the same weights within float summation order.
void expect_same_student(const fs::path& a_run, const fs::path& b_run) {
  const double distance = student_distance(a_run, b_run);
  std::cerr << "student distance " << a_run << " to " << b_run << ": " << distance << "\n";
  EXPECT_LE(distance, kSummationOrder) << a_run << " against " << b_run;
}

TEST(Dist, TwoRanksTrainAsOneProcessOnTheGlobalBatch) {
  constexpr int kSteps = 30;
  const std::string steps = "train.max_steps=" + std::to_string(kSteps);
  const fs::path plain = scratch("plain"), one = scratch("one_rank"), two = scratch("two_ranks");
  const Result p = run(train_args(plain, 64, {steps}), plain);
  ASSERT_EQ(p.code, 0) << p.err;

  // One rank under torchrun is the plain run, bit for bit.
  const Result r1 =
      torchrun(launch(local(1), one.string() + ".logs", train_args(one, 64, {steps})), one);
  ASSERT_EQ(r1.code, 0) << r1.err << rank_stderr(one.string() + ".logs", 0);
  EXPECT_EQ(summary(one)["state_digest"], summary(plain)["state_digest"]);
  EXPECT_EQ(summary(one)["world_size"], 1);
  EXPECT_TRUE(summary(one)["dist"].is_null());
  // One rank that names its backend joins a group of one and reduces through it: still the plain
  // run, bit for bit.
  const fs::path grouped = scratch("one_rank_gloo");
  const Result g = torchrun(launch(local(1), grouped.string() + ".logs",
                                   train_args(grouped, 64, {steps, "dist.backend=gloo"})),
                            grouped);
  ASSERT_EQ(g.code, 0) << g.err << rank_stderr(grouped.string() + ".logs", 0);
  EXPECT_EQ(summary(grouped)["dist"]["backend"], "gloo");
  EXPECT_GT(summary(grouped)["dist"]["buckets"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(summary(grouped)["state_digest"], summary(plain)["state_digest"]);

  // Two ranks of 32: the same global batch of 64.
  const fs::path logs = two.string() + ".logs";
  // Small buckets: several per step, each launched from the backward pass's hooks.
  const Result r2 =
      torchrun(launch(local(2), logs, train_args(two, 32, {steps, "dist.bucket_mb=0.01"})), two);
  ASSERT_EQ(r2.code, 0) << r2.err << rank_stderr(logs, 0) << rank_stderr(logs, 1);
  const json s = summary(two);
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["batch_size"], 32);
  EXPECT_EQ(s["global_batch_size"], 64);
  EXPECT_EQ(s["steps"], kSteps);
  EXPECT_EQ(s["dist"]["backend"], "gloo");
  const auto buckets = s["dist"]["buckets"].get<std::uint64_t>();
  EXPECT_GE(buckets, 3u); // the MLP's 6 tensors (220 KB) in 10 KB buckets
  EXPECT_EQ(s["dist"]["buckets_launched_in_backward"].get<std::uint64_t>(), buckets * kSteps);
  EXPECT_EQ(s["dist"]["buckets_launched_after_backward"].get<std::uint64_t>(), 0u);
  // Every rank holds the same parameters and buffers, bit for bit.
  ASSERT_EQ(s["ranks"].size(), 2u);
  EXPECT_EQ(s["ranks"][0]["rank"], 0);
  EXPECT_EQ(s["ranks"][1]["rank"], 1);
  EXPECT_EQ(s["ranks"][0]["state_digest"], s["ranks"][1]["state_digest"]);
  EXPECT_EQ(s["ranks"][0]["state_digest"], s["state_digest"]);
  for (const auto& rank : s["ranks"]) {
    EXPECT_GT(rank["samples_per_s"].get<double>(), 0.0);
    EXPECT_TRUE(rank["plan"].contains("student"));
  }
  // The job's rate counts both ranks' samples.
  const double steps_s = s["train_loop_s"].get<double>() - s["evaluation_s"].get<double>() -
                         s["checkpoint_s"].get<double>();
  EXPECT_NEAR(s["samples_per_s"].get<double>() * steps_s, kSteps * 64.0, 1e-6 * kSteps * 64);
  // Rank 0 alone writes the folder: one metrics line per 5 steps, not two.
  EXPECT_EQ(metric_lines(two), kSteps / 5);
  // The trained weights equal the one-process run's within float summation order, and that bound
  // tells a wrong global batch apart: one process on batches of 32 is far outside it.
  expect_same_student(plain, two);
  const fs::path half = scratch("plain_batch_32");
  const Result h = run(train_args(half, 32, {steps}), half);
  ASSERT_EQ(h.code, 0) << h.err;
  const double wrong = student_distance(plain, half);
  std::cerr << "student distance, batch 32 against 64: " << wrong << "\n";
  EXPECT_GT(wrong, kWrongBatch);
}

// Under torchrun, rank 0 alone writes TensorBoard's events: one file, holding the job's metrics
// lines (read back by TensorBoard's EventAccumulator, as in Train.TensorBoardEvents*).
TEST(Dist, TensorBoardEventsComeFromRankZeroAlone) {
  const fs::path two = scratch("tensorboard_two_ranks");
  const fs::path logs = two.string() + ".logs";
  const Result r =
      torchrun(launch(local(2), logs, train_args(two, 32, {"train.max_steps=10"})), two);
  ASSERT_EQ(r.code, 0) << r.err << rank_stderr(logs, 0) << rank_stderr(logs, 1);
  EXPECT_EQ(check_tensorboard(two, 1), 0) << read_text(two.string() + ".tensorboard.txt");
}

// kd.features under two ranks: the hint's adapter is trained and averaged with the student, so two
// ranks of 32 agree with each other bit for bit (adapters in the digest) and with one process on
// the batch of 64 within float summation order; the job's feature loss is logged.
TEST(Dist, FeatureLossesOfTwoRanksAreOneProcessOnTheGlobalBatch) {
  const std::string steps = "train.max_steps=20",
                    pair = "kd.features=[{teacher = \"/Relu_output_0\", student = \"stage2\"}]";
  const fs::path plain = scratch("features_plain"), two = scratch("features_two");
  const Result p = run(train_args(plain, 64, {steps, pair}), plain);
  ASSERT_EQ(p.code, 0) << p.err;
  const fs::path logs = two.string() + ".logs";
  const Result r = torchrun(launch(local(2), logs, train_args(two, 32, {steps, pair})), two);
  ASSERT_EQ(r.code, 0) << r.err << rank_stderr(logs, 0) << rank_stderr(logs, 1);
  const json s = summary(two);
  ASSERT_EQ(s["ranks"].size(), 2u);
  EXPECT_EQ(s["ranks"][0]["state_digest"], s["ranks"][1]["state_digest"]);
  expect_same_student(plain, two);
  std::ifstream metrics(two / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    const json m = json::parse(line);
    if (m.contains("event")) continue; // the evaluations
    EXPECT_GT(m.value("feature_loss", 0.0), 0.0) << line;
    ++lines;
  }
  EXPECT_EQ(lines, 4);
}

// kd.cache under two ranks: each keeps its own shard of the data every epoch (the sampler's fixed
// shards), so its cache, filled in the first epoch, serves every batch of the second, and each
// writes its own file; the ranks still hold one model.
TEST(Dist, TwoRanksEachCacheTheirShard) {
  const fs::path data = scratch("dist_cache_data"), two = scratch("dist_cache_two");
  write_fmnist_subset(data, 640, 256);
  const fs::path file = scratch("dist_cache.kdcache");
  const fs::path logs = two.string() + ".logs";
  const Result r = torchrun(launch(local(2), logs,
                                   train_args(two, 32,
                                              {"data.path=" + data.string(), "kd.cache=disk",
                                               "kd.cache_path=" + file.string(), "train.epochs=2",
                                               "train.export=off", "ring.slots=3"})),
                            two);
  ASSERT_EQ(r.code, 0) << r.err << rank_stderr(logs, 0) << rank_stderr(logs, 1);
  const json s = summary(two);
  ASSERT_EQ(s["ranks"].size(), 2u);
  EXPECT_EQ(s["ranks"][0]["state_digest"], s["ranks"][1]["state_digest"]);
  const json& cache = s["teacher_cache"];
  EXPECT_EQ(cache["samples_kept"], 320) << "rank 0's shard: half the samples" << cache.dump();
  // Its second epoch's batches, from the third at least (3 ring slots: a batch may meet the
  // cache before the last of epoch 1 are kept when a rank has several replicas).
  EXPECT_GE(cache["batches_from_cache"].get<int>(), 8) << cache.dump();
  EXPECT_LE(cache["batches_from_cache"].get<int>(), 10) << cache.dump();
  for (const char* rank : {".rank0-of-2", ".rank1-of-2"})
    EXPECT_TRUE(fs::exists(file.string() + rank)) << rank;
}

// Two local ranks that want a GPU each on a node with fewer: every rank refuses alike with one line
// before any rendezvous (not rank 1 alone, leaving rank 0 to wait for it until dist.timeout_s).
// The ranks are started as torchrun starts them (its environment) but without its agent, which
// stops the other workers once one fails: each must refuse on its own, the slower one included.
TEST(Dist, FewerGpusThanLocalRanksIsRefusedByEveryRankBeforeTheyMeet) {
  const int gpus = visible_gpus();
  if (gpus >= 2) GTEST_SKIP() << gpus << " GPUs: two local ranks have one each";
  const fs::path out = scratch("dist_too_few_gpus");
  const std::string port = std::to_string(free_port());
  const auto start = Clock::now();
  std::vector<Child> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.push_back(spawn(
        with(fast_train_args(out, 32), {"student.device=cuda", "dist.timeout_s=120"}),
        out.string() + ".rank" + std::to_string(rank), "/dev/null",
        {"RANK=" + std::to_string(rank), "LOCAL_RANK=" + std::to_string(rank), "WORLD_SIZE=2",
         "LOCAL_WORLD_SIZE=2", "GROUP_RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port}));
  const std::string expected = gpus == 0 ? "student.device = cuda: no CUDA device is visible"
                                         : "LOCAL_WORLD_SIZE = 2: this node has 1 CUDA device(s)";
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(wait_exit(ranks[static_cast<std::size_t>(rank)]), 2) << "local rank " << rank;
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT_LT(took, 60.0) << "local rank " << rank << " waited for the other";
    const std::string err = read_text(ranks[static_cast<std::size_t>(rank)].err);
    EXPECT_NE(err.find(expected), std::string::npos) << "local rank " << rank << ": " << err;
  }
  EXPECT_FALSE(fs::exists(out / "checkpoints"));
}

TEST(Dist, TwoNodesOnOneHostEqualTwoLocalRanks) {
  // A student with BatchNorm: its running statistics are buffers the ranks must agree on too.
  // The teacher untuned: on a host of 4 CPUs or more the two layouts give it different threads,
  // so each would be tuned on its own, and its ways (oneDNN's brgemm or sgemm inner product)
  // need not round alike, where the digests compared here are bit for bit.
  const std::initializer_list<std::string> sets = {"train.max_steps=20", "student.arch=cnn",
                                                   "teacher.tune=off"};
  const fs::path ranks = scratch("local_ranks"), nodes = scratch("nodes");
  const Result r =
      torchrun(launch(local(2), ranks.string() + ".logs", train_args(ranks, 32, sets)), ranks);
  ASSERT_EQ(r.code, 0) << r.err;

  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<Child> agents;
  for (int node = 0; node < 2; ++node)
    agents.push_back(start_torchrun(launch({"--nnodes", "2", "--node-rank", std::to_string(node),
                                            "--nproc-per-node", "1", "--rdzv-endpoint", endpoint},
                                           nodes.string() + ".logs" + std::to_string(node),
                                           train_args(nodes, 32, sets)),
                                    nodes.string() + std::to_string(node)));
  for (const auto& a : agents) EXPECT_EQ(wait_exit(a), 0) << read_text(a.err);
  const json s = summary(nodes);
  EXPECT_EQ(s["state_digest"], summary(ranks)["state_digest"]);
  ASSERT_EQ(s["ranks"].size(), 2u);
  EXPECT_EQ(s["ranks"][0]["state_digest"], s["ranks"][1]["state_digest"]);
  EXPECT_EQ(s["ranks"][0]["node"], 0);
  EXPECT_EQ(s["ranks"][1]["node"], 1);
}

// Two ranks on a run of 100 epochs (longer than any test waits), returned once rank 0 has written
// its first checkpoint (every 50 steps), or after 60 s.
Child start_long_job(const fs::path& out, const fs::path& logs,
                     std::initializer_list<std::string> sets) {
  const auto args =
      with(train_args(out, 32, {"train.epochs=100", "train.checkpoint_every=50"}), sets);
  const Child agent = start_torchrun(launch(local(2), logs, args), out);
  for (int i = 0; i < 6000 && checkpoints(out).empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(checkpoints(out).empty()) << read_text(agent.err);
  return agent;
}

TEST(Dist, LostRankEndsTheJobNamingIt) {
  const fs::path out = scratch("lost"), logs = out.string() + ".logs";
  const Child agent = start_long_job(out, logs, {});
  const pid_t victim = worker(agent.pid, 1);
  ASSERT_GT(victim, 0) << read_text(agent.err);
  ::kill(victim, SIGKILL);
  const auto killed = Clock::now();
  EXPECT_NE(wait_exit(agent), 0);
  EXPECT_LT(Clock::now() - killed, std::chrono::seconds(60));
  const std::string survivor = rank_stderr(logs, 0);
  EXPECT_TRUE(std::regex_search(survivor, std::regex("rank 0: .* failed: lost rank 1 ")))
      << survivor;

  // The last checkpoint loads: a new job of two ranks continues from it.
  const fs::path last = checkpoints(out).back();
  const int step = std::stoi(last.stem().string().substr(5));
  auto resume = train_args(out, 32,
                           {"train.epochs=100", "train.checkpoint_every=50",
                            "train.max_steps=" + std::to_string(step + 5)});
  resume.insert(resume.end(), {"--resume", last.string()});
  const Result r = torchrun(launch(local(2), out.string() + ".logs2", resume), out);
  ASSERT_EQ(r.code, 0) << r.err << rank_stderr(out.string() + ".logs2", 0);
  EXPECT_EQ(summary(out)["steps"], step + 5);
}

TEST(Dist, StoppedRankEndsTheJobWithinTheTimeoutNamingIt) {
  // A rank that hangs (here: SIGSTOP, so its heartbeat stops too): the others' collective fails
  // after dist.timeout_s and they name it.
  constexpr int kTimeoutS = 8;
  const fs::path out = scratch("stopped"), logs = out.string() + ".logs";
  const Child agent = start_long_job(out, logs, {"dist.timeout_s=" + std::to_string(kTimeoutS)});
  const pid_t victim = worker(agent.pid, 1);
  ASSERT_GT(victim, 0) << read_text(agent.err);
  ::kill(victim, SIGSTOP);
  const auto stopped = Clock::now();
  std::string survivor;
  while (Clock::now() - stopped < std::chrono::seconds(kTimeoutS + 30) &&
         survivor.find("lost rank 1") == std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    survivor = rank_stderr(logs, 0);
  }
  const double waited = std::chrono::duration<double>(Clock::now() - stopped).count();
  ::kill(victim, SIGKILL); // torchrun's SIGTERM waits while it is stopped
  EXPECT_NE(wait_exit(agent), 0);
  EXPECT_TRUE(std::regex_search(survivor, std::regex("rank 0: .* failed: lost rank 1 ")))
      << survivor;
  EXPECT_GE(waited, kTimeoutS - 1.0);
  EXPECT_LT(waited, kTimeoutS + 15.0);
}

TEST(Dist, InterruptStopsEveryRankAtOneStepAndResumesExactly) {
  const std::string steps = "train.max_steps=3000";
  const fs::path ref = scratch("dist_reference"), out = scratch("dist_interrupted");
  const Result r =
      torchrun(launch(local(2), ref.string() + ".logs", train_args(ref, 32, {steps})), ref);
  ASSERT_EQ(r.code, 0) << r.err;

  const fs::path logs = out.string() + ".logs";
  const Child agent = start_torchrun(launch(local(2), logs, train_args(out, 32, {steps})), out);
  // Once the steps run: the first interval's metrics line (the teacher's evaluation line comes
  // before the first step).
  for (int i = 0;
       i < 6000 && read_text(out / "metrics.jsonl").find("samples_per_s") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(agent.pid, SIGINT); // as Ctrl-C does to torchrun: it passes the signal to every rank
  EXPECT_NE(wait_exit(agent), 0);
  // Both ranks stopped after the same step; rank 0 saved it.
  const std::regex stopped("interrupted at step ([0-9]+)");
  std::smatch m0, m1;
  const std::string e0 = rank_stderr(logs, 0), e1 = rank_stderr(logs, 1);
  ASSERT_TRUE(std::regex_search(e0, m0, stopped)) << e0;
  ASSERT_TRUE(std::regex_search(e1, m1, stopped)) << e1;
  EXPECT_EQ(m0[1], m1[1]);
  const int at = std::stoi(m0[1]);
  EXPECT_LT(at, 3000);
  EXPECT_TRUE(summary(out)["interrupted"].get<bool>());
  EXPECT_EQ(summary(out)["steps"], at);
  ASSERT_FALSE(checkpoints(out).empty());
  EXPECT_EQ(std::stoi(checkpoints(out).back().stem().string().substr(5)), at);

  // One process cannot continue a two-rank run: exit 2, both sizes named.
  auto resume = train_args(out, 32, {steps});
  resume.insert(resume.end(), {"--resume", "auto"});
  const Result wrong = run(resume, out);
  EXPECT_EQ(wrong.code, 2) << wrong.err;
  expect_one_line_naming(wrong.err, "written by a job of 2 rank(s); this job has 1");

  const Result resumed = torchrun(launch(local(2), out.string() + ".logs2", resume), out);
  ASSERT_EQ(resumed.code, 0) << resumed.err << rank_stderr(out.string() + ".logs2", 0);
  EXPECT_EQ(summary(out)["state_digest"], summary(ref)["state_digest"]) << "interrupted at " << at;
}

} // namespace

namespace {

TEST(Dist, CoresPrintsEveryLocalRanksShareAndPlan) {
  const fs::path out = scratch("cores_ranks.json");
  const Child c = spawn({"cores", "--synthetic", "pack:2 numa:1 core:8 pu:2", "--gpu-numa",
                         "0,0,0,0,1,1,1,1", "--local-world-size", "8", "--json"},
                        out.string() + ".stderr", out);
  ASSERT_EQ(wait_exit(c), 0) << read_text(c.err);
  const json j = json::parse(read_text(out));
  ASSERT_EQ(j["ranks"].size(), 8u);
  std::set<int> seen;
  for (int r = 0; r < 8; ++r) {
    const json& rank = j["ranks"][static_cast<std::size_t>(r)];
    const auto share = rank["share"].get<std::vector<int>>();
    EXPECT_EQ(share.size(), 4u) << "2 cores of 2 PUs each";
    const auto& near = j["topology"]["gpus"][static_cast<std::size_t>(r)]["local_cpus"];
    for (const int cpu : share) {
      EXPECT_TRUE(seen.insert(cpu).second) << "CPU " << cpu << " in two shares";
      EXPECT_NE(std::find(near.begin(), near.end(), cpu), near.end())
          << "rank " << r << " CPU " << cpu << " is not near its GPU";
    }
    for (const int cpu : rank["plan"]["student"].get<std::vector<int>>())
      EXPECT_NE(std::find(share.begin(), share.end(), cpu), share.end());
  }
  const Result bad = run({"cores", "--synthetic", "pack:2 numa:1 core:8 pu:2", "--gpu-numa", "0,2",
                          "--local-world-size", "2"},
                         scratch("cores_bad"));
  EXPECT_EQ(bad.code, 2);
  expect_one_line_naming(bad.err, "--gpu-numa 0,2: '2' is not a NUMA node");
}

} // namespace

namespace {

TEST(Dist, BenchOverlapReportsEveryRankAndTheJob) {
  const fs::path dir = scratch("dist_overlap");
  fs::create_directories(dir);
  // The fast run's student and teacher, six measured steps per mode.
  const auto bench =
      with({"bench-overlap", "--steps", "6", "--repeats", "1", "--min-seconds", "0", "--json",
            (dir / "overlap.json").string()},
           {"teacher.model=" + fixture("mlp_opset13.onnx").string(), "student.arch=mlp",
            "student.width=0.25", "ring.slots=4", "student.device=cpu"});
  const Result r = torchrun(launch(local(2), dir / "logs", bench), dir / "run");
  ASSERT_EQ(r.code, 0) << r.err << rank_stderr(dir / "logs", 0) << rank_stderr(dir / "logs", 1);
  const json report = json::parse(read_text(dir / "overlap.json"));
  EXPECT_EQ(report["world_size"], 2);
  ASSERT_EQ(report["ranks"].size(), 2u);
  const json& job = report["job"];
  for (const auto& [mode, figures] : job["modes"].items()) {
    const double sum = report["ranks"][0]["modes"][mode]["samples_per_s"].get<double>() +
                       report["ranks"][1]["modes"][mode]["samples_per_s"].get<double>();
    EXPECT_NEAR(figures["samples_per_s"].get<double>(), sum, 1e-9 * sum) << mode;
  }
  const double one = job["one_rank_overlapped_samples_per_s"].get<double>();
  EXPECT_GT(one, 0.0);
  EXPECT_NEAR(job["scaling_efficiency"].get<double>(),
              job["modes"]["overlapped"]["samples_per_s"].get<double>() / (2 * one), 1e-9);
  // Rank 0's own figures are the report's top level.
  EXPECT_EQ(report["modes"]["overlapped"]["samples_per_s"],
            report["ranks"][0]["modes"]["overlapped"]["samples_per_s"]);
}

} // namespace
