// Exhaustive-interleaving model check of the slot protocol for the smallest interesting rings
// (2 slots, 2 producers, with and without a teacher stage, with and without an early close, and
// with several teachers that each work on every batch: the first claims, the others join, the
// last to finish hands the slot on). Every
// thread is a small state machine whose atomic steps call the same slot_protocol functions the ring
// runs (decide, advance_delta, kReleaseDelta); a depth-first search visits every reachable state
// and checks in each: exclusive access to a slot's payload, in-order delivery of intact batches, no
// deadlock, and that close() lets every thread finish. Atomic steps are sequentially consistent
// here; the ring's acquire/release pairs are what carry that order to the hardware.
#include "kdflow/core/slot_protocol.hpp"

#include <gtest/gtest.h>

#include <array>
#include <ostream>
#include <set>
#include <string>
#include <vector>

namespace kdflow {
namespace {

namespace sp = slot_protocol;
using sp::SlotState;

constexpr int kSlots = 2;
constexpr int kMaxThreads = 5;

struct Scenario {
  int loaders;
  int teachers; // teacher threads; 0: loaders publish straight to ready (kd.alpha = 0)
  int batches;
  int close_after; // the student closes the ring after this many batches (-1: never)
  int lanes = 1;   // distinct teachers (thread t runs teacher t % lanes), each on every batch
};

void PrintTo(const Scenario& s, std::ostream* os) {
  *os << s.loaders << " loaders, " << s.teachers << " teacher threads of " << s.lanes
      << " teacher(s), " << s.batches << " batches, close after " << s.close_after;
}

constexpr int kMaxLanes = 2;

struct Thread {
  int role = 0; // 0 loader, 1 teacher, 2 student
  int lane = 0; // a teacher's teacher
  int pc = 0;
  int batch = 0; // ticket (producers) or next batch (student)
  bool done = false;
  auto operator<=>(const Thread&) const = default;
};

struct State {
  std::array<std::uint32_t, kSlots> word{};
  std::array<int, kSlots> input{}; // batch whose inputs the slot holds (-1 none)
  std::array<std::array<int, kMaxLanes>, kSlots> output{}; // each teacher's output: its batch
  std::array<int, kSlots> owner{};                         // thread with exclusive access (-1 none)
  std::array<int, kSlots> sharers{}; // teacher threads working on the slot together
  std::array<int, kSlots> taught{};  // teachers done with the slot's batch (SlotRing's counter)
  std::array<int, 1 + kMaxLanes> ticket{}; // loader, then each teacher's ticket counter
  int delivered = 0;
  int closed_words = 0; // close() sets the closed bit one word at a time, as the ring does
  std::array<Thread, kMaxThreads> threads{};
  auto operator<=>(const State&) const = default;
};

struct Checker {
  Scenario sc;
  int nthreads = 0;
  std::set<State> seen;
  std::vector<std::string> errors;
  std::size_t terminal_states = 0;

  void fail(const std::string& what) {
    if (errors.size() < 5) errors.push_back(what);
  }

  static SlotState from_of(int role) {
    return role == 0 ? SlotState::free : role == 1 ? SlotState::filled : SlotState::ready;
  }

  // Tries to run one step of thread i; false when it is blocked (waiting) or done.
  bool step(State& s, int i) {
    Thread& t = s.threads[i];
    if (t.done) return false;
    const bool student = t.role == 2;
    if (student && t.pc == 3) { // close(): one word per step
      s.word[s.closed_words] |= sp::kClosedBit;
      if (++s.closed_words == kSlots) t.done = true;
      return true;
    }
    if (!student && t.pc == 0) { // take a ticket
      t.batch = s.ticket[t.role == 0 ? 0 : 1 + t.lane]++;
      if (t.batch >= sc.batches)
        t.done = true;
      else
        t.pc = 1;
      return true;
    }
    const int slot = t.batch % kSlots;
    const std::uint64_t lap = static_cast<std::uint64_t>(t.batch / kSlots);
    if (t.pc == (student ? 0 : 1)) { // claim: enabled unless it would wait
      const SlotState from = from_of(t.role);
      const bool joins = t.role == 1 && sc.lanes > 1;
      switch (sp::decide(s.word[slot], lap, from, student, joins)) {
      case sp::Decision::wait: return false;
      case sp::Decision::stop:
        if (student && s.closed_words == 0) fail("student stopped although nobody closed the ring");
        t.done = true;
        return true;
      case sp::Decision::join:
        if (!joins) fail("a lone stage joined");
        if (s.owner[slot] != -1) fail("a teacher joins a slot another stage owns");
        s.sharers[slot] |= 1 << i;
        t.pc = 2;
        return true;
      case sp::Decision::claim: break;
      }
      const SlotState to = t.role == 0   ? SlotState::filling
                           : t.role == 1 ? SlotState::teaching
                                         : SlotState::in_flight;
      s.word[slot] += sp::advance_delta(from, to);
      if (s.owner[slot] != -1 || s.sharers[slot] != 0)
        fail("two threads own slot " + std::to_string(slot));
      if (joins)
        s.sharers[slot] |= 1 << i;
      else
        s.owner[slot] = i;
      t.pc = student ? 1 : 2;
      return true;
    }
    const bool mine =
        t.role == 1 && sc.lanes > 1 ? (s.sharers[slot] >> i & 1) != 0 : s.owner[slot] == i;
    if (!mine) fail("thread " + std::to_string(i) + " touches a slot it does not own");
    if (t.role == 0 && t.pc == 2) { // fill, then publish
      s.input[slot] = t.batch;
      s.output[slot].fill(-1);
      s.owner[slot] = -1;
      const SlotState to = sc.teachers > 0 ? SlotState::filled : SlotState::ready;
      if (!sp::holds(s.word[slot], lap, SlotState::filling))
        fail("loader publishes a slot not filling");
      s.word[slot] += sp::advance_delta(SlotState::filling, to);
      t.pc = 0;
      return true;
    }
    if (t.role == 1 && t.pc == 2) { // teach, then publish (the last of several teachers)
      if (s.input[slot] != t.batch) fail("teacher reads the wrong batch");
      if (s.output[slot][t.lane] != -1) fail("a teacher works on a batch twice");
      s.output[slot][t.lane] = t.batch;
      if (sc.lanes > 1) {
        s.sharers[slot] &= ~(1 << i);
        if (!sp::holds(s.word[slot], lap, SlotState::teaching))
          fail("a teacher finishes a slot not teaching");
        if (++s.taught[slot] < sc.lanes) {
          t.pc = 0;
          return true;
        }
        s.taught[slot] = 0;
        for (int k = 0; k < sc.lanes; ++k)
          if (s.output[slot][k] != t.batch) fail("the last teacher hands on an unfinished batch");
      } else {
        s.owner[slot] = -1;
      }
      s.word[slot] += sp::advance_delta(SlotState::teaching, SlotState::ready);
      t.pc = 0;
      return true;
    }
    if (student && t.pc == 1) { // read in place
      bool taught = true;
      for (int k = 0; k < sc.lanes; ++k) taught = taught && s.output[slot][k] == t.batch;
      if (s.input[slot] != t.batch || (sc.teachers > 0 && !taught))
        fail("student got slot " + std::to_string(slot) + " holding batch " +
             std::to_string(s.input[slot]) + " for batch " + std::to_string(t.batch));
      if (s.delivered != t.batch) fail("out of order");
      ++s.delivered;
      t.pc = 2;
      return true;
    }
    if (student && t.pc == 2) { // release
      s.owner[slot] = -1;
      if (!sp::holds(s.word[slot], lap, SlotState::in_flight))
        fail("release of a slot not in flight");
      s.word[slot] += sp::kReleaseDelta;
      ++t.batch;
      if (t.batch == sc.close_after)
        t.pc = 3;
      else if (t.batch == sc.batches)
        t.done = true;
      else
        t.pc = 0;
      return true;
    }
    fail("bad pc");
    return false;
  }

  void explore(const State& s) {
    if (!seen.insert(s).second || !errors.empty()) return;
    bool any = false;
    for (int i = 0; i < nthreads; ++i) {
      State next = s;
      if (step(next, i)) {
        any = true;
        explore(next);
      }
    }
    if (any) return;
    ++terminal_states;
    for (int i = 0; i < nthreads; ++i)
      if (!s.threads[i].done)
        fail("deadlock: thread " + std::to_string(i) + " (role " +
             std::to_string(s.threads[i].role) + ") blocked at pc " +
             std::to_string(s.threads[i].pc) + " batch " + std::to_string(s.threads[i].batch));
    if (sc.close_after < 0 && s.delivered != sc.batches)
      fail("only " + std::to_string(s.delivered) + " batches delivered");
  }

  void run() {
    State s;
    for (int i = 0; i < kSlots; ++i) {
      s.word[i] = sp::encode(0, SlotState::free);
      s.input[i] = s.owner[i] = -1;
      s.output[i].fill(-1);
    }
    for (int l = 0; l < sc.loaders; ++l) s.threads[nthreads++].role = 0;
    for (int t = 0; t < sc.teachers; ++t) {
      s.threads[nthreads].role = 1;
      s.threads[nthreads++].lane = t % sc.lanes;
    }
    s.threads[nthreads++].role = 2;
    explore(s);
  }
};

class RingModel : public ::testing::TestWithParam<Scenario> {};

TEST_P(RingModel, EveryInterleavingIsSafeAndLive) {
  Checker c{GetParam()};
  c.run();
  for (const auto& e : c.errors) ADD_FAILURE() << e;
  EXPECT_GT(c.terminal_states, 0u);
  std::printf("model: %zu states, %zu terminal\n", c.seen.size(), c.terminal_states);
}

INSTANTIATE_TEST_SUITE_P(
    TwoSlots, RingModel,
    ::testing::Values(Scenario{2, 0, 5, -1}, // 2 loaders straight to the student, 2.5 laps
                      Scenario{2, 1, 4, -1}, // 2 loaders, 1 teacher
                      Scenario{1, 2, 4, -1}, // 1 loader, 2 teachers finishing out of order
                      Scenario{2, 1, 5, 1},  // the student closes early: everyone must finish
                      Scenario{2, 2, 4, 2},
                      Scenario{1, 2, 5, -1, 2},  // 2 teachers, each on every batch (join)
                      Scenario{2, 2, 4, -1, 2},  // ... beside 2 loaders
                      Scenario{1, 2, 5, 2, 2})); // ... and an early close

} // namespace
} // namespace kdflow
