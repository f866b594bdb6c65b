// teacher.tune = auto: the plan is chosen by timing, at load, at the real batch, precision and
// thread count, never by a rule about the network. Each node that can run more than one way (the
// op table's lowerings offer them: a convolution direct in channels-last or in oneDNN's layout, as
// an inner product, unrolled) is timed in whole plans, the fastest way per node is put together
// and timed again (where that loses, the nodes' faster ways are tried one at a time against the
// fastest plan, as are the other ways of a node whose output that plan reorders for a reader),
// and the fastest whole plan is kept. Then the batch in passes of fewer samples
// (Graph::chunks) is timed against the whole batch, one pass at a time on every thread and as
// many at once as threads, each on one. Choices are cached on disk, keyed by the
// model's bytes, the input, batch, precision, threads, oneDNN and the CPU.
#include "kdflow/core/cache_home.hpp"
#include "kdflow/core/digest.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/versions.hpp"
#include "kdflow/cpu_teacher/engine.hpp"
#include "kdflow/cpu_teacher/versions.hpp"
#include "ops/lowering.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <tuple>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <oneapi/tbb/task_arena.h>

namespace kdflow::teacher {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Choices = std::map<std::string, std::string>;

// Bumped when a lowering's ways change meaning, so that no older choice is reused (2: gemm-only
// channels-last convolutions seen as such; 3: zero Pads folded; 4: the Winograd ways, which a plan
// tuned before them never timed; 5: the channels-last group normalization, with the exporters'
// group_norm fused into one node, and the Concat with its reader's affine; 6: the Winograd ways in
// bf16 plans; 7: the convolutions' second oneDNN implementation, channels_last_alternative; 8:
// that implementation for the first one's ISA only; 9: the batch in passes of fewer samples; 10:
// passes at once, each on one thread; 11: a Concat that convolutions alone read split into their
// parts, a pool before a Concat moved before it: other nodes, other names; 12: binary ops read a
// transpose's output in place and write its layout, so the layouts around them, and the ways
// timed in them, changed, and a linear layer's per-channel scale is folded into its weights; 13:
// the channels-last group normalization and the Concat with its reader's affine in bf16 plans,
// which a bf16 plan tuned before never timed, and a pool's channels-last way over an input
// whose own layout has only oneDNN's simple loop; 14: a Concat of views written slice by slice;
// 15: the search over passes also times the smallest passes, which the halving may stop short of;
// 16: the convolutions over few channels as im2col + matmul, which a plan tuned before never
// timed; 17: the passes' finalists run again in turns, where a plan tuned before kept the fastest
// single timing; 18: the inner products' second oneDNN implementation, inner_product_alternative,
// which a plan tuned before never timed; 19: a MatMul's computed operands read in place where they
// lie strided, the "strided" way, which a plan tuned before never timed; 20: a MatMul that a
// Transpose alone reads writes that Transpose's layout, so the ways around it were timed with a
// copy that is gone; 21: a pass timed past the tolerance is timed once more before it ends the
// pass search, which a plan tuned before may have ended at one slow timing). 22 is used: c167acf
// offered F(4x4) Winograd in bf16 plans, taken out again in the next commit, which tunes as 21
// did, so plans tuned at 21 hold; plans tuned at 22 may hold that way and no later version may
// read them, so the next change took 23. 23: where the composite of each node's fastest way
// loses, the nodes' faster ways tried one at a time against the fastest whole plan, which a plan
// tuned before never timed; 24: the other ways of a node whose output the fastest plan reorders
// for a reader tried against that plan too, wherever the composite stands; 25: 5x5 convolutions
// of stride 1 offer F(4x4, 5x5) and F(2x2, 5x5) Winograd, which a plan tuned before never timed.
constexpr int kPlanVersion = 25;
// Another plan replaces the untuned one only when it is this much faster: below that, the
// difference is the machine's noise, not the plan.
constexpr double kMargin = 0.03;
// Halving the samples per pass goes on while a pass is within this of the fastest so far: where
// the time per batch falls with the pass, it falls a few per cent per halving, about what two
// timings of one plan differ by on a shared machine, so the margin alone would stop the search at
// the first noisy step.
constexpr double kPassTolerance = 0.10;
// The pass finalists: the whole batch and the passes timed within this of the fastest, at most
// kFinalOthers of them, each run kFinalRounds times more (see tuned_plan).
constexpr double kPassFinalBand = 0.25;
constexpr std::size_t kFinalOthers = 3;
constexpr std::size_t kFinalRounds = 2;
// Where the composite of each node's fastest way lost to a whole plan: at most this many nodes'
// faster ways tried one at a time against that plan, each gaining at least this share of it by
// its own steps' timings (less is within two timings' noise).
constexpr std::size_t kRefinements = 3;
constexpr double kRefineGain = 0.01;

// A pass finalist: samples per pass, passes at once, its runs' ms per batch (the search's first).
struct PassFinal {
  std::int64_t samples = 0;
  int lanes = 1;
  std::vector<double> ms;
};

fs::path cache_folder(const TeacherOptions& options) {
  if (!options.cache_dir.empty()) return fs::path(options.cache_dir) / "plans";
  const fs::path home = cache_home();
  return home.empty() ? home : home / "plans";
}

// `text` written whole to a temporary beside `file` (its folder made), whose path it returns for
// the caller to publish (rename or link); `ec` set where it could not be written.
fs::path write_temporary(const fs::path& file, const std::string& text, std::error_code& ec) {
  fs::create_directories(file.parent_path(), ec);
  const fs::path tmp = file.string() + fmt::format(".tmp{}", ::getpid());
  std::ofstream out(tmp);
  out << text;
  out.close();
  if (!out) ec = std::make_error_code(std::errc::io_error);
  return tmp;
}

// Per step, ms per batch (the fastest of the timed runs), and the whole plan's median.
struct Timing {
  std::vector<double> step_ms;
  double total_ms = 0;
};

// What a node's way cost in a timed plan: its own steps, the reorders it asked for included.
std::map<std::string, double> ms_by_node(const Teacher::Plan& plan, const Timing& t) {
  std::map<std::string, double> out;
  for (std::size_t i = 0; i < plan.steps.size(); ++i)
    if (!plan.steps[i].node.empty()) out[plan.steps[i].node] += t.step_ms[i];
  return out;
}

Choices effective(const Teacher::Plan& plan) {
  Choices c;
  for (const auto& o : plan.options) c[o.node] = o.chosen;
  return c;
}

} // namespace

std::map<std::string, std::string> prefer_ways(const std::vector<NodeOptions>& nodes,
                                               const std::vector<std::string>& prefer) {
  Choices c;
  for (const auto& n : nodes)
    for (const auto& p : prefer)
      if (std::find(n.options.begin(), n.options.end(), p) != n.options.end()) {
        c[n.node] = p;
        break;
      }
  return c;
}

std::unique_ptr<Teacher::Plan> Teacher::tuned_plan(Graph graph, const TeacherOptions& options,
                                                   const std::string& path) {
  const auto started = Clock::now();
  const int threads = replica_threads(options);
  TuneReport report;
  report.mode = Tune::automatic;

  std::string features;
  for (const auto& f : options.features) features += f + ",";
  const OnednnInfo dnnl = onednn_info();
  const std::string key = fmt::format(
      "kdflow plan v{} | model {} | input {} x{} | {} | {} threads | passes at once {} | "
      "features {} | oneDNN {} {} {} | {}{}",
      kPlanVersion, file_digest(path), format_shape(graph.input_shape), graph.chunks,
      precision_name(options.precision), threads, options.passes_at_once, features, dnnl.version,
      dnnl.hash, dnnl.isa, cpu_identity(),
      options.calibration ? fmt::format(" | calibration {:016x}", options.calibration->digest)
                          : std::string());
  const fs::path folder = cache_folder(options);
  const fs::path file =
      folder.empty()
          ? fs::path()
          : folder / fmt::format("{:016x}.json",
                                 fnv1a(std::as_bytes(std::span(key.data(), key.size()))));

  // The cached plan in `file` when it is this key's: the choices as they were measured.
  const auto read_cache = [&](Graph& g) -> std::unique_ptr<Plan> {
    std::ifstream in(file);
    const auto j = nlohmann::json::parse(in);
    if (j.at("key").get<std::string>() != key) return nullptr;
    TuneReport cached;
    cached.mode = Tune::automatic;
    cached.from_cache = true;
    cached.cache_file = file.string();
    cached.untuned_ms = j.at("untuned_ms").get<double>();
    cached.tuned_ms = j.at("tuned_ms").get<double>();
    cached.plans_timed = j.at("plans_timed").get<std::size_t>();
    for (const auto& n : j.at("nodes"))
      cached.nodes.push_back(
          {n.at("node").get<std::string>(), n.at("options").get<std::vector<std::string>>(),
           n.at("ms").get<std::vector<double>>(), n.at("chosen").get<std::string>()});
    Choices choices = j.at("choices").get<Choices>(); // parsed before the graph moves
    cached.samples_per_pass = j.at("samples_per_pass").get<std::int64_t>();
    cached.passes_at_once = j.at("passes_at_once").get<int>();
    using Timings = std::vector<std::pair<std::int64_t, double>>;
    cached.pass_ms = j.at("pass_ms").get<Timings>();
    cached.pass_at_once_ms = j.at("pass_at_once_ms").get<Timings>();
    if (cached.passes_at_once != 1 && cached.passes_at_once != threads)
      throw InputError(
          fmt::format("{} passes at once with {} threads", cached.passes_at_once, threads));
    std::unique_ptr<Plan> plan;
    if (cached.samples_per_pass > 0) {
      auto passes = load_onnx_in_passes(path, load_options(options), g, cached.samples_per_pass);
      if (!passes)
        throw InputError(fmt::format("passes of {} samples do not load", cached.samples_per_pass));
      plan = build_plan(std::move(*passes), options, std::move(choices), cached.passes_at_once);
    } else {
      if (cached.passes_at_once > 1 && g.chunks == 1)
        throw InputError("passes at once of a batch run whole");
      plan = build_plan(std::move(g), options, std::move(choices), cached.passes_at_once);
    }
    cached.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    plan->tune = std::move(cached);
    return plan;
  };
  bool stale = false; // a file at the key's place that is not this key's plan: replaced
  if (!file.empty() && fs::exists(file)) {
    try {
      if (auto plan = read_cache(graph)) return plan;
      report.note = fmt::format("plan cache {} holds another key: tuned again", file.string());
    } catch (const nlohmann::json::exception& e) {
      report.note =
          fmt::format("plan cache {} is unreadable ({}): tuned again", file.string(), e.what());
    } catch (const InputError& e) { // choices this build of oneDNN cannot make
      report.note =
          fmt::format("plan cache {} cannot be used ({}): tuned again", file.string(), e.what());
    }
    stale = true;
  }

  // Times a plan in an arena of the replicas' size: one warm-up run, then the timed runs, each
  // step waited for and timed; or (`wall`) the runs' wall time alone, as they run in a replica
  // (passes at once overlap their steps).
  oneapi::tbb::task_arena arena(threads);
  const auto time_plan = [&](std::unique_ptr<Plan>& plan, bool wall = false) {
    std::shared_ptr<Teacher> t(new Teacher());
    t->plan_ = std::move(plan);
    Timing out;
    arena.execute([&] {
      Replica r(t);
      std::vector<float> input(static_cast<std::size_t>(numel(t->input_shape())));
      std::mt19937 rng(7);
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (auto& v : input) v = u(rng);
      std::vector<std::vector<float>> outs;
      std::vector<float*> ptrs;
      for (std::size_t k = 0; k < t->output_names().size(); ++k)
        outs.emplace_back(static_cast<std::size_t>(numel(t->output_shape(k))));
      for (auto& o : outs) ptrs.push_back(o.data());
      r.run(input.data(), ptrs);
      out.step_ms.assign(t->steps(), std::numeric_limits<double>::infinity());
      std::vector<double> step_s(t->steps()), totals;
      const auto start = Clock::now();
      // At least 3 runs and 0.2 s; one run where a run takes over a second (224 x 224 inputs at
      // batch 64 on one core), whose noise is small against its length.
      const auto enough = [&] {
        const auto spent = Clock::now() - start;
        if (spent > std::chrono::seconds(1)) return !totals.empty();
        return totals.size() >= 3 && spent >= std::chrono::milliseconds(200);
      };
      while (!enough()) {
        if (wall) {
          const auto run_start = Clock::now();
          r.run(input.data(), ptrs);
          totals.push_back(
              std::chrono::duration<double, std::milli>(Clock::now() - run_start).count());
          continue;
        }
        r.run_timed(input.data(), ptrs, step_s);
        double total = 0;
        for (std::size_t i = 0; i < step_s.size(); ++i) {
          out.step_ms[i] = std::min(out.step_ms[i], step_s[i] * 1e3);
          total += step_s[i] * 1e3;
        }
        totals.push_back(total);
      }
      std::sort(totals.begin(), totals.end());
      out.total_ms = totals[totals.size() / 2];
    });
    plan = std::move(t->plan_);
    ++report.plans_timed;
    return out;
  };

  // Every node's ways, and what each cost where it was timed.
  std::map<std::string, std::map<std::string, double>> cost;
  // The ways that lowered the next node with their own (node -> way -> that node), and what each
  // node's steps cost at least where it ran on its own.
  std::map<std::string, std::map<std::string, std::string>> takes_in;
  std::map<std::string, double> alone;
  std::vector<std::pair<Choices, double>> measured; // effective choices, ms per batch
  // Per plan in `measured`: what each node's steps took, and its reorders of a value into the
  // layout or type a reader asked for (the reader's steps count them too, ms_by_node).
  struct Converted {
    std::string producer, value;
    dnnl::memory::desc want;
    double ms;
  };
  std::vector<std::map<std::string, double>> measured_nodes;
  std::vector<std::vector<Converted>> measured_converted;
  // What each node's ways wrote, as timed: node -> way -> value -> layout and type.
  std::map<std::string, std::map<std::string, std::map<std::string, dnnl::memory::desc>>> writes;
  auto plan = build_plan(std::move(graph), options, {});
  const std::vector<NodeOptions> nodes = plan->options;
  const auto measure = [&](std::unique_ptr<Plan>& p) {
    const Timing t = time_plan(p);
    const auto by_node = ms_by_node(*p, t);
    for (const auto& [node, ms] : by_node) {
      auto& least = alone.try_emplace(node, ms).first->second;
      least = std::min(least, ms);
    }
    for (const auto& o : p->options) {
      if (!o.takes_in.empty()) takes_in[o.node][o.chosen] = o.takes_in;
      const auto it = by_node.find(o.node);
      if (it == by_node.end()) continue;
      auto& ms = cost[o.node].try_emplace(o.chosen, it->second).first->second;
      ms = std::min(ms, it->second);
    }
    const Choices chosen = effective(*p);
    for (const auto& [value, w] : p->written)
      if (const auto way = chosen.find(w.node); way != chosen.end())
        writes[w.node][way->second].try_emplace(value, w.md);
    std::vector<Converted> converted;
    for (std::size_t i = 0; i < p->steps.size(); ++i) {
      const Step& st = p->steps[i];
      if (!st.reorder || st.producer.empty() || st.producer == st.node) continue;
      for (const auto& [arg, ref] : st.args)
        if (arg == DNNL_ARG_TO || (!st.prim && &ref == &st.args.back().second))
          converted.push_back({st.producer, st.value, ref.md, t.step_ms[i]});
    }
    measured.emplace_back(chosen, t.total_ms);
    measured_nodes.push_back(by_node);
    measured_converted.push_back(std::move(converted));
    return t.total_ms;
  };
  const auto tried = [&](const Choices& c) {
    return std::any_of(measured.begin(), measured.end(),
                       [&](const auto& m) { return m.first == c; });
  };
  // Builds and times the plan with `choices` unless a plan with the same choices was timed. A
  // way oneDNN cannot build here is left out of the tuning, not an error of the model (which the
  // untuned plan has proved buildable).
  const auto try_choices = [&](Choices choices) {
    std::unique_ptr<Plan> p;
    try {
      p = build_plan(std::move(plan->graph), options, std::move(choices));
    } catch (const InputError& e) {
      report.note += fmt::format("{}a tuning candidate could not be built ({}): left out",
                                 report.note.empty() ? "" : "; ", e.what());
      return;
    }
    if (!tried(effective(*p))) measure(p);
    plan = std::move(p);
  };

  if (!nodes.empty()) {
    report.untuned_ms = measure(plan);
    // Whole plans, each preferring one way everywhere it is offered (layouts agree between
    // neighbours that way), then each node's fastest way as timed in them. oneDNN's own
    // primitives first: its concat too, where kdflow's kernel or slices are a Concat's first way,
    // and its matmul over operands copied out plain, where a MatMul's first way reads them strided.
    for (const auto& prefs : std::vector<std::vector<std::string>>{
             {"library", "reduction", "concat", "plain"},
             {"channels_last", "pooling"},
             {"unrolled", "inner_product", "channels_last", "reduction"},
             {"inner_product", "channels_last", "pooling"},
             {"winograd_4x4", "im2col", "inner_product", "channels_last", "pooling"},
             {"winograd_2x2", "inner_product", "channels_last", "pooling"},
             {"channels_last_alternative", "inner_product_alternative", "inner_product",
              "channels_last", "pooling"}})
      try_choices(prefer_ways(nodes, prefs));
    Choices fastest;
    for (const auto& [node, ways] : cost)
      fastest[node] = std::min_element(ways.begin(), ways.end(), [](const auto& a, const auto& b) {
                        return a.second < b.second;
                      })->first;
    // A way that took in the next node timed both: it is weighed against the node's fastest
    // other way plus the next node's least time on its own.
    for (const auto& [node, ways] : takes_in) {
      const auto& timed = cost[node];
      std::string apart;
      for (const auto& [way, ms] : timed)
        if (!ways.count(way) && (apart.empty() || ms < timed.at(apart))) apart = way;
      if (apart.empty()) continue;
      std::string best = apart;
      double best_ms = timed.at(apart);
      for (const auto& [way, next] : ways) {
        const auto ms = timed.find(way);
        const auto next_ms = alone.find(next);
        if (ms == timed.end() || next_ms == alone.end()) continue;
        if (ms->second < best_ms + (best == apart ? next_ms->second : 0.0)) {
          best = way;
          best_ms = ms->second;
        }
      }
      fastest[node] = best;
    }
    try_choices(std::move(fastest));
    const Choices composite = effective(*plan); // timed now, or with a plan timed before

    // The composite can lose as a whole: a node's fastest way, timed among neighbours of its own
    // layout, can cost a reorder beside neighbours of another (a 3-channel stem in oneDNN's
    // layout ahead of Winograd convolutions that read channels-last, say), where its second
    // fastest would not. So from the fastest whole plan timed, single changes are tried one at a
    // time, the largest gain first, each kept where the plan got faster (at most kRefinements
    // plans not timed before, each change gaining at least kRefineGain of the plan by the
    // timings):
    //  - where the composite is not that plan, each node's faster ways (every faster way of a
    //    node, not just its fastest);
    //  - in any case, the other ways of a node whose output that plan reorders for a reader
    //    that write it as that reader asks (a stem or a pointwise convolution writing
    //    channels-last ahead of a grouped convolution that reads oneDNN's layout, where its way
    //    in oneDNN's layout was timed too). The reorder counts in the reader's time, and the
    //    writer's ways were each timed where their readers took the layout they write, so no
    //    node's fastest way shows it. The gain is weighed as the reorders such a way saves less
    //    what it costs the writer more (its fastest timing against its time in that plan).
    const std::size_t at = static_cast<std::size_t>(
        std::min_element(measured.begin(), measured.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; }) -
        measured.begin()); // of the untuned plan at least
    auto [base, base_ms] = measured[at];
    std::vector<std::tuple<double, std::string, std::string>> gains; // ms, node, way
    const auto fused_way = [&](const std::string& node, const std::string& way) {
      const auto fused = takes_in.find(node);
      return fused != takes_in.end() && fused->second.contains(way);
    };
    if (composite != base) {
      for (const auto& [node, ways] : cost) {
        const auto now = base.find(node);
        if (now == base.end() || !ways.contains(now->second)) continue;
        const double now_ms = ways.at(now->second);
        for (const auto& [way, ms] : ways)
          if (!fused_way(node, way) && ms < now_ms - kRefineGain * base_ms)
            gains.emplace_back(now_ms - ms, node, way);
      }
    }
    std::map<std::pair<std::string, std::string>, double> saves; // (node, way): reorders, ms
    for (const Converted& c : measured_converted[at]) {
      const auto now = base.find(c.producer);
      const auto ways = writes.find(c.producer);
      if (now == base.end() || ways == writes.end()) continue;
      for (const auto& [way, values] : ways->second) {
        const auto md = values.find(c.value);
        if (way != now->second && !fused_way(c.producer, way) && md != values.end() &&
            md->second == c.want)
          saves[{c.producer, way}] += c.ms;
      }
    }
    for (const auto& [node_way, ms] : saves) {
      const auto& [node, way] = node_way;
      const auto own = measured_nodes[at].find(node);
      const auto timed = cost.find(node);
      if (own == measured_nodes[at].end() || timed == cost.end() || !timed->second.contains(way))
        continue;
      const double gain = ms - (timed->second.at(way) - own->second);
      if (gain > kRefineGain * base_ms) gains.emplace_back(gain, node, way);
    }
    std::sort(gains.begin(), gains.end(), std::greater<>());
    std::set<std::string> changed;
    std::size_t tries = 0;
    for (const auto& [gain, node, way] : gains) {
      if (tries == kRefinements) break;
      if (changed.contains(node)) continue;
      Choices c = base;
      c[node] = way;
      if (tried(c)) continue;
      ++tries;
      const std::size_t timed = measured.size();
      try_choices(std::move(c));
      if (measured.size() > timed && measured.back().second < base_ms) {
        std::tie(base, base_ms) = measured.back();
        changed.insert(node);
      }
    }
  }

  // The untuned plan unless another beat it by more than the margin.
  Choices best = measured.empty() ? Choices{} : measured.front().first;
  double best_ms = report.untuned_ms;
  for (const auto& [choices, ms] : measured)
    if (ms < report.untuned_ms * (1 - kMargin) && ms < best_ms) {
      best = choices;
      best_ms = ms;
    }
  report.tuned_ms = best_ms;
  if (effective(*plan) != best) plan = build_plan(std::move(plan->graph), options, best);
  for (const auto& o : plan->options) {
    TunedNode n{o.node, o.options, {}, o.chosen};
    for (const auto& way : o.options) {
      const auto it = cost[o.node].find(way);
      n.ms.push_back(it == cost[o.node].end() ? -1.0 : it->second);
    }
    report.nodes.push_back(std::move(n));
  }

  // The batch in passes of fewer samples, with the ways chosen: a smaller working set (at 224 x 224
  // and batch 64 a network's activations spill every cache; a few samples at a time keep them
  // nearer) against fewer samples per primitive over which to share each weight's load. And with
  // more than one thread, the passes run as many at once as threads, each on one: a pass of a few
  // samples is little work for its primitives to share among threads (each layer's share ends in
  // a wait for the slowest), while passes side by side share nothing but the weights.
  //
  // Each way to run passes halves the samples per pass (the largest divisor of the batch at most
  // half the last; at once, from a pass per thread), while a pass is within kPassTolerance of the
  // fastest so far (one past it is timed once more before it counts), and where that stops short,
  // doubles from one sample as long. All are timed by their wall time, the whole batch first,
  // beside them. Passes are kept where faster than the whole batch by more than the margin. Not
  // where the caller fixed the samples per pass, or the model its batch: there the passes it has
  // are timed one at a time against at once.
  std::vector<PassFinal> pass_finals;         // the whole batch first where it may run so
  const int at_once = options.passes_at_once; // 0: the tuner's choice
  const bool try_at_once = threads > 1 && at_once != 1;
  const bool try_one_at_a_time = at_once <= 1;
  const LoadOptions lo = load_options(options);
  const auto build_or_note = [&](Graph&& g, int lanes, std::int64_t n) -> std::unique_ptr<Plan> {
    try {
      return build_plan(std::move(g), options, effective(*plan), lanes);
    } catch (const InputError& e) {
      report.note +=
          fmt::format("{}passes of {} samples{} could not be built ({}): left out",
                      report.note.empty() ? "" : "; ", n, lanes > 1 ? " at once" : "", e.what());
      return nullptr;
    }
  };
  if (options.samples_per_pass == 0 && options.batch > 1 && plan->graph.chunks == 1) {
    double whole_ms = time_plan(plan, true).total_ms;
    report.pass_ms.emplace_back(options.batch, whole_ms);
    if (nodes.empty()) report.untuned_ms = report.tuned_ms = whole_ms;
    const auto divisor_at_most = [&](std::int64_t n) {
      while (n > 1 && options.batch % n != 0) --n;
      return n;
    };
    std::unique_ptr<Plan> fastest;
    double fastest_ms = std::numeric_limits<double>::infinity();
    const auto divisor_at_least = [&](std::int64_t n) {
      while (n < options.batch && options.batch % n != 0) ++n;
      return n;
    };
    // Halving from `first` samples per pass, `lanes` passes at once; the timings into `timed`,
    // largest pass first. Where the halving stops before the smallest passes, they are timed too,
    // doubling from one sample while within the tolerance of the fastest: the time per batch is
    // not monotone in the pass (it can stay level or rise while a pass's activations still spill
    // the last cache, then fall once they fit), so a rise is no sign that smaller passes lose.
    const auto search = [&](std::int64_t first, int lanes,
                            std::vector<std::pair<std::int64_t, double>>& timed) {
      double best_ms = std::numeric_limits<double>::infinity();
      // Whether passes of `n` were timed and the search goes on from them.
      const auto time_passes = [&](std::int64_t n) {
        auto g = load_onnx_in_passes(path, lo, plan->graph, n);
        if (!g) return false; // the model does not compute per sample alike at that batch
        auto p = build_or_note(std::move(*g), lanes, n);
        if (!p) return false;
        double ms = time_plan(p, true).total_ms;
        // A rise past the tolerance ends the search: timed once more first, the lesser kept. A
        // timing is one run or two, and a slow spell of a shared machine (seconds long) inside
        // one must not end the search short of the smaller passes.
        if (ms > best_ms * (1 + kPassTolerance)) ms = std::min(ms, time_plan(p, true).total_ms);
        timed.emplace_back(n, ms);
        if (ms < fastest_ms) {
          fastest_ms = ms;
          fastest = std::move(p);
        }
        if (ms < best_ms) {
          best_ms = ms;
          return true;
        }
        return ms <= best_ms * (1 + kPassTolerance);
      };
      std::int64_t smallest = options.batch; // the smallest pass the halving timed
      bool went_on = true;
      for (std::int64_t n = first, last = options.batch; went_on && n < last;
           last = n, n = divisor_at_most(n / 2)) {
        const std::size_t before = timed.size();
        went_on = time_passes(n);
        if (timed.size() == before) return; // passes of n do not load or build: none smaller
        smallest = n;
      }
      for (std::int64_t n = 1; n < smallest && time_passes(n); n = divisor_at_least(2 * n)) {
      }
      std::sort(timed.begin(), timed.end(),
                [](const auto& a, const auto& b) { return a.first > b.first; });
    };
    if (try_one_at_a_time) search(divisor_at_most(options.batch / 2), 1, report.pass_ms);
    // At once: from a pass per thread, or (to spare the tuning time) from twice the samples of
    // the fastest pass one at a time, where fewer.
    std::int64_t from = divisor_at_most(options.batch / threads);
    if (report.pass_ms.size() > 1)
      from = std::min(from, divisor_at_most(2 * std::min_element(report.pass_ms.begin() + 1,
                                                                 report.pass_ms.end(),
                                                                 [](const auto& a, const auto& b) {
                                                                   return a.second < b.second;
                                                                 })
                                                    ->first));
    if (try_at_once && options.batch >= threads) search(from, threads, report.pass_at_once_ms);
    // The finalists run again, in turns: each timing above is one run or two, and a slow spell of
    // a shared machine (seconds long) makes one pass look slower than its neighbours, a quiet one
    // faster. The whole batch (the reference the margin is against, where it may run so) and the
    // fastest passes within kPassFinalBand of the fastest are each run kFinalRounds times more,
    // their order turned every round; each is weighed by its fastest run (the noise adds time).
    if (fastest) {
      std::vector<PassFinal> candidates;
      for (const auto& [n, ms] : report.pass_ms)
        if (n != options.batch) candidates.push_back({n, 1, {ms}});
      for (const auto& [n, ms] : report.pass_at_once_ms) candidates.push_back({n, threads, {ms}});
      std::sort(candidates.begin(), candidates.end(),
                [](const auto& a, const auto& b) { return a.ms[0] < b.ms[0]; });
      if (try_one_at_a_time) pass_finals.push_back({options.batch, 1, {whole_ms}});
      const std::size_t others = pass_finals.size();
      for (auto& c : candidates)
        if (pass_finals.size() - others < kFinalOthers &&
            c.ms[0] <= fastest_ms * (1 + kPassFinalBand))
          pass_finals.push_back(std::move(c));
      const auto least = [](const PassFinal& f) {
        return *std::min_element(f.ms.begin(), f.ms.end());
      };
      const auto whole = [&](const PassFinal& f) {
        return f.samples == options.batch && f.lanes == 1;
      };
      if (pass_finals.size() > 1) {
        for (std::size_t round = 0; round < kFinalRounds; ++round)
          for (std::size_t k = 0; k < pass_finals.size(); ++k) {
            PassFinal& f = pass_finals[(k + round + 1) % pass_finals.size()];
            if (whole(f)) {
              f.ms.push_back(time_plan(plan, true).total_ms);
              continue;
            }
            auto g = load_onnx_in_passes(path, lo, plan->graph, f.samples);
            auto p = g ? build_or_note(std::move(*g), f.lanes, f.samples) : nullptr;
            if (p) f.ms.push_back(time_plan(p, true).total_ms);
          }
        if (try_one_at_a_time) whole_ms = least(pass_finals.front());
        const PassFinal* best = nullptr;
        for (const auto& f : pass_finals)
          if (!whole(f) && (best == nullptr || least(f) < least(*best))) best = &f;
        if (best != nullptr) {
          if (fastest->graph.batch != best->samples || fastest->passes_at_once != best->lanes) {
            auto g = load_onnx_in_passes(path, lo, plan->graph, best->samples);
            if (auto p = g ? build_or_note(std::move(*g), best->lanes, best->samples) : nullptr)
              fastest = std::move(p);
          }
          if (fastest->graph.batch == best->samples && fastest->passes_at_once == best->lanes)
            fastest_ms = least(*best);
        }
      }
    }
    if (fastest && (fastest_ms < whole_ms * (1 - kMargin) || !try_one_at_a_time)) {
      report.samples_per_pass = fastest->graph.batch;
      report.passes_at_once = fastest->passes_at_once;
      report.tuned_ms = fastest_ms;
      plan = std::move(fastest);
    } else if (!try_one_at_a_time) {
      throw InputError(fmt::format("{}: {} passes at once: the batch of {} cannot run in passes "
                                   "(the model computes its samples differently at a smaller "
                                   "batch)",
                                   path, at_once, options.batch));
    }
  } else if (plan->graph.chunks > 1 && try_at_once) {
    // The passes the caller or the model fixed: one at a time (timed here unless refused) against
    // as many at once as threads.
    const double one_ms = try_one_at_a_time ? time_plan(plan, true).total_ms
                                            : std::numeric_limits<double>::infinity();
    if (try_one_at_a_time) report.pass_ms.emplace_back(plan->graph.batch, one_ms);
    Graph again = plan->graph; // the plan keeps its own, should the other be slower
    if (auto p = build_or_note(std::move(again), threads, plan->graph.batch)) {
      const double ms = time_plan(p, true).total_ms;
      report.pass_at_once_ms.emplace_back(plan->graph.batch, ms);
      if (ms < one_ms) {
        report.passes_at_once = threads;
        report.tuned_ms = ms;
        plan = std::move(p);
      }
    } else if (!try_one_at_a_time) {
      throw InputError(fmt::format("{}: its passes cannot run at once ({})", path, report.note));
    }
  }

  // The last guard of a forced at-once (Teacher::load refuses a batch smaller than it, and the
  // searches above throw where no pass runs at once): never a plan that runs otherwise.
  if (at_once > 1 && plan->passes_at_once != at_once)
    throw InputError(fmt::format("{}: {} passes at once, but the batch of {} runs whole", path,
                                 at_once, options.batch));

  // Cached for the next load: written beside, then renamed, so a reader never sees half a file.
  if (!file.empty() && report.plans_timed > 0) {
    nlohmann::json final_json = nlohmann::json::array();
    for (const auto& f : pass_finals)
      final_json.push_back(
          {{"samples_per_pass", f.samples}, {"passes_at_once", f.lanes}, {"ms", f.ms}});
    nlohmann::json nodes_json = nlohmann::json::array();
    for (const auto& n : report.nodes)
      nodes_json.push_back(
          {{"node", n.node}, {"options", n.options}, {"ms", n.ms}, {"chosen", n.chosen}});
    const nlohmann::json j = {{"key", key},
                              {"choices", effective(*plan)},
                              {"untuned_ms", report.untuned_ms},
                              {"tuned_ms", report.tuned_ms},
                              {"plans_timed", report.plans_timed},
                              {"samples_per_pass", report.samples_per_pass},
                              {"passes_at_once", report.passes_at_once},
                              {"pass_ms", report.pass_ms},
                              {"pass_at_once_ms", report.pass_at_once_ms},
                              {"pass_final_ms", final_json},
                              {"nodes", nodes_json}};
    std::error_code ec;
    const fs::path tmp = write_temporary(file, j.dump(1), ec);
    // The first plan written for a key wins: processes that tuned the same teacher at once
    // (ranks, parallel runs) all run the same plan, so their teacher outputs agree bit for bit.
    bool lost_race = false;
    if (!ec && stale) {
      fs::rename(tmp, file, ec);
    } else if (!ec) {
      if (::link(tmp.c_str(), file.c_str()) != 0) {
        lost_race = errno == EEXIST;
        if (!lost_race) ec = std::error_code(errno, std::generic_category());
      }
      std::error_code ignored;
      fs::remove(tmp, ignored);
    }
    if (ec) {
      std::error_code ignored;
      fs::remove(tmp, ignored);
      report.note += fmt::format("{}could not write the plan cache {} ({}): kept for this run only",
                                 report.note.empty() ? "" : "; ", file.string(), ec.message());
    } else if (lost_race) {
      // Theirs read onto the model's graph at the whole batch (ours may run in passes).
      const bool in_passes = report.samples_per_pass > 0;
      Graph whole = in_passes ? load_onnx(path, load_options(options)) : std::move(plan->graph);
      try {
        if (auto theirs = read_cache(whole)) return theirs;
      } catch (const nlohmann::json::exception&) {
        // Another writer's half-made file cannot be: link() publishes whole files. Keep ours.
      } catch (const InputError&) {
        // Their choices do not build here (another oneDNN behind the same key?): keep ours.
      }
      if (!in_passes) plan->graph = std::move(whole); // (a build that throws gives it back)
    } else {
      report.cache_file = file.string();
    }
  }
  report.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  plan->tune = std::move(report);
  return plan;
}

namespace {

// Where the calibration under `key` is kept ("" without a cache folder).
fs::path calibration_file(const TeacherOptions& options, const std::string& key) {
  const fs::path folder = cache_folder(options);
  if (folder.empty()) return folder;
  return folder / fmt::format("calibration-{:016x}.json",
                              fnv1a(std::as_bytes(std::span(key.data(), key.size()))));
}

} // namespace

std::optional<Calibration> read_calibration_cache(const TeacherOptions& options,
                                                  const std::string& key) {
  const fs::path file = calibration_file(options, key);
  if (file.empty()) return std::nullopt;
  std::error_code ec;
  if (!fs::exists(file, ec)) return std::nullopt;
  try {
    std::ifstream in(file);
    const auto j = nlohmann::json::parse(in);
    if (j.at("key").get<std::string>() != key) return std::nullopt;
    Calibration c;
    c.batches = j.at("batches").get<std::size_t>();
    c.samples = j.at("samples").get<std::size_t>();
    for (const auto& r : j.at("ranges"))
      c.ranges.emplace(r.at(0).get<std::string>(),
                       std::pair{r.at(1).get<float>(), r.at(2).get<float>()});
    c.digest = ranges_digest(c);
    c.from_cache = true;
    c.cache_file = file.string();
    return c;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt; // damaged: calibrated again and replaced
  }
}

void write_calibration_cache(const TeacherOptions& options, const std::string& key,
                             Calibration& c) {
  const fs::path file = calibration_file(options, key);
  if (file.empty()) {
    c.note = "no cache folder: the calibration is kept for this run only";
    return;
  }
  nlohmann::json ranges = nlohmann::json::array();
  for (const auto& [value, range] : c.ranges) ranges.push_back({value, range.first, range.second});
  const nlohmann::json j = {
      {"key", key}, {"batches", c.batches}, {"samples", c.samples}, {"ranges", ranges}};
  std::error_code ec;
  const fs::path tmp = write_temporary(file, j.dump(1), ec);
  if (!ec) fs::rename(tmp, file, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    c.note = fmt::format("could not write the calibration cache {} ({}): kept for this run only",
                         file.string(), ec.message());
    return;
  }
  c.cache_file = file.string();
}

} // namespace kdflow::teacher
