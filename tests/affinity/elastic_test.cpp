// kd-ctl's policy against a model of the pipeline: each pool delivers (its cores) x (its rate per
// core) batches/s, the pipeline runs at the slowest of the pools and the student, and every
// measurement carries noise. From a deliberately unbalanced start the policy must reach the best
// split and then stay there; a student-bound run must never move; and CPU moves must keep the
// student's CPU, the pool minimums and the replica width.
#include "kdflow/affinity/elastic.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace kdflow::affinity {
namespace {

struct Model {
  double loader_per_core;  // batches/s one loader core delivers
  double teacher_per_core; // batches/s per teacher core (a replica of w cores: w times faster)
  double student;          // batches/s the student can take
  double noise;            // relative noise on every measurement
};

int cores(const std::vector<CpuList>& replicas) {
  int n = 0;
  for (const auto& r : replicas) n += static_cast<int>(r.size());
  return n;
}

// Ten seconds of the modelled pipeline under `a`, measured with noise.
ElasticWindow measure(const Model& m, const PoolAssignment& a, std::mt19937& rng) {
  std::uniform_real_distribution<double> jitter(1 - m.noise, 1 + m.noise);
  const int nl = static_cast<int>(a.loader.size()), nt = cores(a.teacher);
  const double rate = std::min({nl * m.loader_per_core, nt * m.teacher_per_core, m.student});
  ElasticWindow w;
  w.seconds = 10.0;
  w.student_wait_s = std::max(0.0, 1.0 - rate / m.student) * w.seconds * jitter(rng);
  const auto batches =
      static_cast<std::uint64_t>(std::max(1.0, std::round(rate * w.seconds * jitter(rng))));
  const auto n = static_cast<double>(batches);
  w.loader = {batches, n / m.loader_per_core * jitter(rng), nl, nl};
  // A replica of w cores takes 1 / (w x per_core) seconds a batch.
  const auto replicas = static_cast<int>(a.teacher.size());
  w.teacher = {batches, n * replicas / (nt * m.teacher_per_core) * jitter(rng), nt, replicas};
  return w;
}

struct Trace {
  PoolAssignment end;
  int moves = 0;
  int last_move_window = -1;
};

Trace run(const Model& m, PoolAssignment a, const CpuList& student, int width, int windows) {
  ElasticPolicy policy(ElasticOptions{});
  std::mt19937 rng(7);
  Trace t;
  for (int i = 0; i < windows; ++i) {
    const ElasticWindow w = measure(m, a, rng);
    const bool loader_can = move_cpu(a, Move::to_teacher, student, width).has_value();
    const bool teacher_can = move_cpu(a, Move::to_loader, student, width).has_value();
    const ElasticDecision d = policy.observe(w, loader_can, teacher_can);
    if (d.move == Move::none) continue;
    const auto next = move_cpu(a, d.move, student, width);
    EXPECT_TRUE(next.has_value()) << "the policy proposed a move the pools cannot make";
    if (!next) continue;
    EXPECT_GT(d.predicted_rate, std::min(d.loader_rate, d.teacher_rate));
    a = *next;
    policy.moved();
    ++t.moves;
    t.last_move_window = i;
  }
  t.end = a;
  return t;
}

// Student CPU 0; loaders 1-7; one teacher CPU 8: a teacher-bound start on 8 movable CPUs.
PoolAssignment teacher_starved() { return {{1, 2, 3, 4, 5, 6, 7}, {{8}}}; }

TEST(ElasticPolicy, TeacherBoundStartConvergesToTheBestSplitAndStaysThere) {
  // 10 batches/s per loader core, 2 per teacher core, student 100: the best split of 8 CPUs is 2
  // loader cores and 6 teacher cores (min(20, 12) = 12 batches/s).
  const Model m{10, 2, 100, 0.05};
  const Trace t = run(m, teacher_starved(), {0}, 2, 200);
  EXPECT_EQ(t.end.loader.size(), 2u);
  EXPECT_EQ(cores(t.end.teacher), 6);
  EXPECT_EQ(t.moves, 5) << "every move toward balance, none back";
  EXPECT_LT(t.last_move_window, 30) << "converged early, then held for the rest of the run";
  for (const auto& r : t.end.teacher) EXPECT_LE(r.size(), 2u);
}

TEST(ElasticPolicy, LoaderBoundStartGivesTheLoadersEveryCoreTheTeacherCanSpare) {
  // 1 batch/s per loader core, 10 per teacher core: the loaders want everything but the last
  // teacher CPU (min(7, 10) = 7).
  const Model m{1, 10, 100, 0.05};
  const PoolAssignment start{{1}, {{2, 3}, {4, 5}, {6, 7}, {8}}};
  const Trace t = run(m, start, {0}, 2, 200);
  EXPECT_EQ(t.end.loader.size(), 7u);
  EXPECT_EQ(cores(t.end.teacher), 1);
  EXPECT_EQ(t.moves, 6);
}

TEST(ElasticPolicy, NoMoveWhileTheStudentIsTheBottleneck) {
  // The teacher is slower than the loaders, but the student is slower still: it never waits.
  const Model m{10, 2, 1.5, 0.05};
  const Trace t = run(m, teacher_starved(), {0}, 2, 100);
  EXPECT_EQ(t.moves, 0);
  EXPECT_EQ(t.end, teacher_starved());
}

TEST(ElasticPolicy, HysteresisHoldsAtABalanceWithinTheMargin) {
  // 4 + 4 CPUs at equal per-core rates: every move predicts less; with 8% noise on every figure
  // nothing moves in 300 windows.
  const Model m{3, 3, 100, 0.08};
  const PoolAssignment start{{1, 2, 3, 4}, {{5, 6}, {7, 8}}};
  const Trace t = run(m, start, {0}, 2, 300);
  EXPECT_EQ(t.moves, 0);
}

TEST(ElasticPolicy, NeedsPatienceAndSkipsTheWindowAfterAMove) {
  ElasticPolicy policy(ElasticOptions{});
  ElasticWindow w{1.0, 0.5, {10, 1.0, 4, 4}, {10, 10.0, 1, 1}}; // teacher 1 batch/s, loaders 40
  EXPECT_EQ(policy.observe(w, true, true).move, Move::none) << "one window is not enough";
  const ElasticDecision d = policy.observe(w, true, true);
  EXPECT_EQ(d.move, Move::to_teacher);
  EXPECT_DOUBLE_EQ(d.loader_rate, 40);
  EXPECT_DOUBLE_EQ(d.teacher_rate, 1);
  EXPECT_DOUBLE_EQ(d.predicted_rate, 2);
  policy.moved();
  EXPECT_EQ(policy.observe(w, true, true).move, Move::none);
  EXPECT_EQ(policy.observe(w, true, true).move, Move::none);
  EXPECT_EQ(policy.observe(w, true, true).move, Move::to_teacher);
  // Nothing to give, or nothing measured: no move, and the streak starts over.
  EXPECT_EQ(policy.observe(w, false, true).move, Move::none);
  EXPECT_EQ(policy.observe(w, true, true).move, Move::none);
  ElasticWindow idle = w;
  idle.teacher.batches = 0;
  EXPECT_EQ(policy.observe(idle, true, true).move, Move::none);
  EXPECT_EQ(policy.observe(w, true, true).move, Move::none);
}

TEST(MoveCpu, KeepsTheStudentsCpuTheMinimumsAndTheReplicaWidth) {
  // On small machines the loaders share the student's CPU: it never moves.
  EXPECT_FALSE(move_cpu({{0}, {{1}}}, Move::to_teacher, {0}, 1));
  EXPECT_FALSE(move_cpu({{0}, {{1}}}, Move::to_loader, {0}, 1));
  EXPECT_FALSE(move_cpu({{0, 2}, {{1}}}, Move::to_teacher, {0, 2}, 1));
  const auto a = move_cpu({{0, 1, 2}, {{3}}}, Move::to_teacher, {0}, 2);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->loader, (CpuList{0, 1}));
  EXPECT_EQ(a->teacher, (std::vector<CpuList>{{2, 3}})) << "joins the last replica while narrow";
  const auto b = move_cpu(*a, Move::to_teacher, {0}, 2);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->teacher, (std::vector<CpuList>{{2, 3}, {1}})) << "a full replica: a new one";
  EXPECT_FALSE(move_cpu(*b, Move::to_teacher, {0}, 2)) << "the loaders keep one CPU";
  // The move back restores each step.
  const auto c = move_cpu(*b, Move::to_loader, {0}, 2);
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, *a);
  const auto d = move_cpu(*c, Move::to_loader, {0}, 2);
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, (PoolAssignment{{0, 1, 2}, {{3}}}));
  EXPECT_FALSE(move_cpu(*d, Move::to_loader, {0}, 2)) << "the teacher keeps one CPU";
}

} // namespace
} // namespace kdflow::affinity
