// kd-ctl's decisions: when the student waits because the loaders or the teacher fall behind, move
// one CPU from the other pool to the slow one. The policy only reads measurements (one window at a
// time) and says which way to move; the pipeline makes the move (pipeline.hpp), so the policy is
// tested on its own against a model of the pipeline.
#pragma once

#include "kdflow/affinity/topology.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kdflow::affinity {

// One stage over one window.
struct StageWindow {
  std::uint64_t batches = 0; // batches the stage completed
  double work_s = 0;         // time in its bodies, claims' waits for slots left out, summed
  int cores = 0;             // CPUs the stage held
  int bodies = 0;            // bodies that ran at once: loader workers, teacher replicas
};

struct ElasticWindow {
  double seconds = 0;        // the window's length
  double student_wait_s = 0; // time the student waited for a ready slot
  StageWindow loader, teacher;
};

struct ElasticOptions {
  double min_student_wait = 0.05; // act only when the student waited this share of the window
  double margin = 0.10;           // a move must promise at least this much more pipeline throughput
  int patience = 2;               // consecutive windows that agree on a move before it is made
};

enum class Move { none, to_teacher, to_loader };
const char* move_name(Move move);

struct ElasticDecision {
  Move move = Move::none;
  double loader_rate = 0, teacher_rate = 0; // batches/s each pool can deliver with its cores
  double predicted_rate = 0; // the slower pool's after the proposed move (0: none proposed)
  std::string reason;        // why it moves, or why not
};

// A stage's capacity scales with its cores: the rate per core-second of work measured in the window
// times the cores it would have. The hysteresis: a move must predict `margin` more throughput than
// now (so the move back, which predicts less, never follows), `patience` windows in a row must
// agree, and the window in which a move happened is not used.
class ElasticPolicy {
public:
  explicit ElasticPolicy(ElasticOptions options) : options_(options) {}

  // `loader_can_give` / `teacher_can_give`: whether the pool has a CPU it may hand over.
  ElasticDecision observe(const ElasticWindow& window, bool loader_can_give, bool teacher_can_give);
  // The proposed move was made: the next window straddles it and is skipped.
  void moved() { skip_next_ = true; }

private:
  ElasticOptions options_;
  Move pending_ = Move::none;
  int streak_ = 0;
  bool skip_next_ = false;
};

// Which CPUs the loader pool and each teacher replica hold.
struct PoolAssignment {
  CpuList loader;
  std::vector<CpuList> teacher;
  friend bool operator==(const PoolAssignment&, const PoolAssignment&) = default;
};

// The assignment after moving one CPU; nullopt when the giving pool has none it may give (each pool
// keeps one CPU, `student` CPUs never move). To the teacher: the loaders' highest CPU joins the
// last replica while it is narrower than `replica_width`, else starts a new replica. To the
// loaders: the last replica's lowest CPU (the replica goes when it was its only one), so a move and
// the move back restore the assignment.
std::optional<PoolAssignment> move_cpu(const PoolAssignment& from, Move move,
                                       const CpuList& student, int replica_width);

} // namespace kdflow::affinity
