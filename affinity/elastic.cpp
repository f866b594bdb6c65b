// The elastic policy (elastic.hpp): from each window's stage rates and work, whether one CPU should
// move between the loader pool and the teacher replicas, and which CPU (move_cpu).
#include "kdflow/affinity/elastic.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace kdflow::affinity {

const char* move_name(Move move) {
  switch (move) {
  case Move::none: return "none";
  case Move::to_teacher: return "loader->teacher";
  case Move::to_loader: return "teacher->loader";
  }
  return "?";
}

ElasticDecision ElasticPolicy::observe(const ElasticWindow& window, bool loader_can_give,
                                       bool teacher_can_give) {
  ElasticDecision out;
  const auto hold = [&](std::string reason) {
    pending_ = Move::none;
    streak_ = 0;
    out.reason = std::move(reason);
    return out;
  };
  if (skip_next_) {
    skip_next_ = false;
    return hold("the window straddles the last move");
  }
  const StageWindow& l = window.loader;
  const StageWindow& t = window.teacher;
  if (window.seconds <= 0 || l.batches == 0 || t.batches == 0 || l.work_s <= 0 || t.work_s <= 0 ||
      l.cores <= 0 || t.cores <= 0 || l.bodies <= 0 || t.bodies <= 0)
    return hold("too little work measured");

  // Batches per core-second of work. A loader body is one thread; a replica's body spans its
  // replica's threads (cores / bodies of them on average).
  const double loader_per_core = static_cast<double>(l.batches) / l.work_s;
  const double teacher_per_core =
      static_cast<double>(t.batches) / (t.work_s * static_cast<double>(t.cores) / t.bodies);
  out.loader_rate = loader_per_core * l.cores;
  out.teacher_rate = teacher_per_core * t.cores;
  const double now = std::min(out.loader_rate, out.teacher_rate);

  const double wait = window.student_wait_s / window.seconds;
  if (wait < options_.min_student_wait)
    return hold(
        fmt::format("the student waited {:.1f}% of the window: the CPU side keeps up", 100 * wait));

  const bool teacher_slow = out.teacher_rate < out.loader_rate;
  const Move want = teacher_slow ? Move::to_teacher : Move::to_loader;
  if (teacher_slow ? !loader_can_give : !teacher_can_give)
    return hold(fmt::format("the {} is slower but the {} has no CPU to give",
                            teacher_slow ? "teacher" : "loader pool",
                            teacher_slow ? "loader pool" : "teacher"));
  const int dl = teacher_slow ? -1 : 1;
  out.predicted_rate =
      std::min(loader_per_core * (l.cores + dl), teacher_per_core * (t.cores - dl));
  if (out.predicted_rate < (1 + options_.margin) * now)
    return hold(fmt::format("moving a CPU {} predicts {:.1f} batches/s against {:.1f} now: less "
                            "than the {:.0f}% margin",
                            move_name(want), out.predicted_rate, now, 100 * options_.margin));

  streak_ = pending_ == want ? streak_ + 1 : 1;
  pending_ = want;
  if (streak_ < options_.patience) {
    out.reason =
        fmt::format("{} proposed ({} of {} windows)", move_name(want), streak_, options_.patience);
    return out;
  }
  out.move = want;
  out.reason = fmt::format("the student waited {:.1f}% of the window; the {} is the bottleneck",
                           100 * wait, teacher_slow ? "teacher" : "loader pool");
  pending_ = Move::none;
  streak_ = 0;
  return out;
}

std::optional<PoolAssignment> move_cpu(const PoolAssignment& from, Move move,
                                       const CpuList& student, int replica_width) {
  const auto is_student = [&](int cpu) {
    return std::find(student.begin(), student.end(), cpu) != student.end();
  };
  PoolAssignment to = from;
  if (move == Move::to_teacher) {
    if (to.loader.size() < 2) return std::nullopt;
    const auto it = std::find_if(to.loader.rbegin(), to.loader.rend(),
                                 [&](int cpu) { return !is_student(cpu); });
    if (it == to.loader.rend()) return std::nullopt;
    const int cpu = *it;
    to.loader.erase(std::next(it).base());
    if (to.teacher.empty() || static_cast<int>(to.teacher.back().size()) >= replica_width)
      to.teacher.push_back({cpu});
    else {
      to.teacher.back().push_back(cpu);
      std::sort(to.teacher.back().begin(), to.teacher.back().end());
    }
    return to;
  }
  if (move == Move::to_loader) {
    if (cpu_count(to.teacher) < 2) return std::nullopt;
    CpuList& last = to.teacher.back();
    const int cpu = last.front();
    last.erase(last.begin());
    if (last.empty()) to.teacher.pop_back();
    to.loader.push_back(cpu);
    std::sort(to.loader.begin(), to.loader.end());
    return to;
  }
  return std::nullopt;
}

} // namespace kdflow::affinity
