// Core plans on synthetic topologies (independent of this machine): disjoint, inside the allowed
// set, physical cores before SMT siblings, replicas inside one NUMA node, the student near a
// described GPU; and bad plan files rejected with the role named.
#include "kdflow/affinity/plan.hpp"
#include "kdflow/core/error.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace kdflow::affinity {
namespace {

struct Case {
  std::string desc;
  int gpu_numa; // -1: no GPU described
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.desc << " gpu_numa=" << c.gpu_numa; }

class AutoPlan : public ::testing::TestWithParam<Case> {};

TEST_P(AutoPlan, HoldsItsProperties) {
  const Topology topo = Topology::synthetic(GetParam().desc);
  PlanRequest req;
  if (GetParam().gpu_numa >= 0) req.gpu_local = topo.numa_cpus(GetParam().gpu_numa);
  const Plan plan = plan_auto(topo, req);

  std::map<int, const Core*> core_of;
  for (const auto& c : topo.cores())
    for (const int pu : c.pus) core_of[pu] = &c;
  const CpuList allowed = topo.allowed_cpus();
  const std::set<int> allowed_set(allowed.begin(), allowed.end());
  const bool small = topo.cores().size() < 3;

  // Every CPU is allowed; teacher replicas and the loader pool are disjoint from everything else.
  std::map<int, std::string> owner;
  const auto claim = [&](const CpuList& cpus, const std::string& role, bool may_share_student) {
    for (const int c : cpus) {
      EXPECT_TRUE(allowed_set.count(c)) << role << " CPU " << c;
      if (owner.count(c) && !(may_share_student && owner[c] == "student")) {
        ADD_FAILURE() << role << " overlaps " << owner[c] << " on CPU " << c;
      }
      owner.emplace(c, role);
    }
  };
  ASSERT_EQ(plan.student.size(), 1u);
  claim(plan.student, "student", false);
  EXPECT_EQ(to_json(plan)["copy"], to_json(plan)["student"]);
  claim(plan.loader, "loader", small);
  ASSERT_FALSE(plan.teacher.empty());
  for (std::size_t i = 0; i < plan.teacher.size(); ++i)
    claim(plan.teacher[i], "teacher" + std::to_string(i), topo.cores().size() == 1);

  // Physical cores first: no two roles' CPUs on one core while whole cores are spare, and never an
  // SMT sibling in use while a physical core is unused.
  std::set<const Core*> used_cores;
  int siblings_used = 0;
  for (const auto& [cpu, role] : owner) {
    used_cores.insert(core_of[cpu]);
    if (core_of[cpu]->pus[0] != cpu) ++siblings_used;
  }
  if (used_cores.size() < topo.cores().size()) {
    EXPECT_EQ(siblings_used, 0);
  }

  // A replica's threads share one NUMA node and one L3; no replica has more threads than CPUs.
  for (const auto& replica : plan.teacher) {
    std::set<int> numas, l3s;
    for (const int c : replica) {
      numas.insert(core_of[c]->numa);
      l3s.insert(core_of[c]->l3);
    }
    EXPECT_EQ(numas.size(), 1u);
    EXPECT_EQ(l3s.size(), 1u);
    EXPECT_LE(replica.size(), 8u);
  }
  // The student near the described GPU.
  if (req.gpu_local) {
    EXPECT_EQ(core_of[plan.student[0]]->numa, GetParam().gpu_numa);
  }
  // Everything allowed is either used or spare.
  EXPECT_EQ(owner.size() + plan.spare.size(), allowed.size());
}

INSTANTIATE_TEST_SUITE_P(
    Synthetic, AutoPlan,
    ::testing::Values(Case{"pack:1 core:2 pu:1", -1}, Case{"pack:2 numa:2 core:8 pu:2", -1},
                      Case{"pack:2 numa:2 core:8 pu:2", 2}, Case{"pack:1 l3:4 core:16 pu:1", -1},
                      Case{"pack:1 core:1 pu:1", -1}, Case{"pack:1 core:16 pu:2", 0}));

TEST(AutoPlan, CountsFromTheRequestAreHonoured) {
  const Topology topo = Topology::synthetic("pack:1 core:16 pu:2");
  PlanRequest req;
  req.loader_cores = 3;
  req.teacher_threads = 4;
  const Plan plan = plan_auto(topo, req);
  EXPECT_EQ(plan.loader.size(), 3u);
  ASSERT_EQ(plan.teacher.size(), 3u); // 12 cores left: 3 replicas of 4
  for (const auto& r : plan.teacher) EXPECT_EQ(r.size(), 4u);
  req.loader_cores = 15;
  EXPECT_THROW(plan_auto(topo, req), InputError);
}

TEST(AutoPlan, NoTeacherMeansNoTeacherCores) {
  const Topology topo = Topology::synthetic("pack:1 core:4 pu:1");
  PlanRequest req;
  req.teacher_runs = false;
  const Plan plan = plan_auto(topo, req);
  EXPECT_TRUE(plan.teacher.empty());
  EXPECT_EQ(plan.loader.size(), 3u);
}

std::string expect_plan_error(const std::string& json,
                              const std::string& desc = "pack:1 core:4 pu:1") {
  const auto path = std::filesystem::temp_directory_path() / "kdflow_plan_test.json";
  std::ofstream(path) << json;
  const Topology topo = Topology::synthetic(desc);
  try {
    Plan plan = read_plan_file(path).plan;
    validate(plan, topo, true);
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError for " << json;
  return {};
}

TEST(PlanFile, BadPlansNameTheRole) {
  EXPECT_NE(expect_plan_error(R"({"student":[0],"loader":[1],"teacher":[[1,2]]})")
                .find("'loader' and 'teacher[0]' overlap"),
            std::string::npos);
  EXPECT_NE(expect_plan_error(R"({"student":[0],"loader":[1],"teacher":[[2,9]]})")
                .find("'teacher[0]' uses CPUs 9"),
            std::string::npos);
  EXPECT_NE(expect_plan_error(R"({"student":[0],"loader":[],"teacher":[[2]]})")
                .find("'loader' has no CPU"),
            std::string::npos);
  EXPECT_NE(expect_plan_error(R"({"student":[0],"loader":[1]})").find("'teacher' has no CPU"),
            std::string::npos);
  EXPECT_NE(expect_plan_error(R"({"student":[0],"loader":[1],"teacher":[[2]],"gpu":[3]})")
                .find("unknown key 'gpu'"),
            std::string::npos);
  EXPECT_NE(
      expect_plan_error(R"({"student":[0],"loader":["a"],"teacher":[[2]]})").find("key 'loader'"),
      std::string::npos);
  EXPECT_NE(expect_plan_error(R"({"student":[0], )").find("not valid JSON"), std::string::npos);
  // The device copies are issued from the student's thread: a copy role elsewhere is refused.
  EXPECT_NE(expect_plan_error(R"({"student":[0],"copy":[3],"loader":[1],"teacher":[[2]]})")
                .find("key 'copy' = 3 differs from 'student' = 0"),
            std::string::npos);
  EXPECT_NE(
      expect_plan_error(
          R"({"plan":{"student":[0],"loader":[1],"teacher":[[2]]},"teacher_precision":"fp16"})")
          .find("key 'teacher_precision' = \"fp16\""),
      std::string::npos);
}

TEST(PlanFile, AValidFileRoundTrips) {
  const auto path = std::filesystem::temp_directory_path() / "kdflow_plan_ok.json";
  const Topology topo = Topology::synthetic("pack:1 core:4 pu:2");
  PlanRequest req;
  Plan a = plan_auto(topo, req);
  // The writer's keys, and a report beside them (as tune-cores writes).
  nlohmann::json doc = plan_file_json(a, "bf16");
  doc["measured"] = 1.0;
  std::ofstream(path) << doc.dump();
  const PlanFile file = read_plan_file(path);
  EXPECT_EQ(file.teacher_precision, "bf16");
  Plan b = file.plan;
  validate(b, topo, true);
  EXPECT_EQ(a.student, b.student);
  EXPECT_EQ(a.loader, b.loader);
  EXPECT_EQ(a.teacher, b.teacher);
  EXPECT_EQ(a.spare, b.spare);
}

TEST(PlanFromConfig, ExplicitCpuListsAndCounts) {
  const Topology topo = Topology::synthetic("pack:1 core:8 pu:1");
  Config c;
  c.set("cores.student_cpus=0");
  c.set("cores.loader_cpus=1-2");
  c.set("cores.teacher_cpus=3-5;6,7");
  Plan p = plan_from_config(c, topo, std::nullopt);
  EXPECT_EQ(p.loader, (CpuList{1, 2}));
  ASSERT_EQ(p.teacher.size(), 2u);
  EXPECT_EQ(p.teacher[1], (CpuList{6, 7}));
  c.set("cores.teacher_cpus=2-5");
  EXPECT_THROW(plan_from_config(c, topo, std::nullopt), InputError); // overlaps the loaders
  c.set("cores.teacher_cpus=3-x");
  EXPECT_THROW(plan_from_config(c, topo, std::nullopt), InputError);
  Config counts;
  counts.set("cores.loader_cores=2");
  counts.set("cores.teacher_threads=5");
  p = plan_from_config(counts, topo, std::nullopt);
  EXPECT_EQ(p.loader.size(), 2u);
  ASSERT_EQ(p.teacher.size(), 1u);
  EXPECT_EQ(p.teacher[0].size(), 5u);
  EXPECT_EQ(parse_cpus("0-2,5", "k"), (CpuList{0, 1, 2, 5}));
}

TEST(Topology, BadSyntheticDescriptionIsInputError) {
  EXPECT_THROW(Topology::synthetic("pack:two"), InputError);
  // A machine of 10^9 PUs is refused before hwloc builds it (it used to take minutes).
  EXPECT_THROW(Topology::synthetic("pack:1 core:1000000000 pu:1"), InputError);
  EXPECT_THROW(Topology::synthetic("pack:1000 numa:100 core:100 pu:2"), InputError);
}

TEST(PlanFromConfig, CpuRangesBeyondAnyMachineAreRefusedAtOnce) {
  // "0-2147483647" used to expand into 2^31 entries (a hang, then out of memory).
  for (const char* list : {"0-2147483647", "65536", "3-70000"}) {
    try {
      (void)parse_cpus(list, "cores.loader_cpus");
      ADD_FAILURE() << list;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("cores.loader_cpus"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse_cpus("65534-65535", "k"), (CpuList{65534, 65535}));
}

TEST(Topology, ThisMachineHasItsAllowedCpus) {
  const Topology topo = Topology::load();
  EXPECT_FALSE(topo.cores().empty());
  EXPECT_EQ(format_cpus({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
}

} // namespace
} // namespace kdflow::affinity

namespace kdflow::affinity {
namespace {

// torchrun's local ranks on one node: each rank's GPU on a NUMA node (gpu_numa[r]); the shares
// must be disjoint, cover the node, be near-equal, lie on the rank's GPU's NUMA node when it has
// cores enough there, and a plan inside each share must be a valid plan of that share.
struct ShareCase {
  std::string desc;
  std::vector<int> gpu_numa;
};

void PrintTo(const ShareCase& c, std::ostream* os) {
  *os << c.desc << " with " << c.gpu_numa.size() << " GPUs";
}

class RankShares : public ::testing::TestWithParam<ShareCase> {};

TEST_P(RankShares, AreDisjointBalancedAndNearTheirGpus) {
  const Topology topo = Topology::synthetic(GetParam().desc);
  const auto& numa = GetParam().gpu_numa;
  const int ranks = static_cast<int>(numa.size());
  std::vector<std::optional<CpuList>> near;
  for (const int n : numa) near.emplace_back(topo.numa_cpus(n));
  const auto shares = rank_shares(topo, ranks, near);
  ASSERT_EQ(shares.size(), numa.size());

  std::map<int, int> owner; // PU -> rank
  std::map<int, int> numa_of;
  for (const auto& c : topo.cores())
    for (const int pu : c.pus) numa_of[pu] = c.numa;
  std::size_t fewest = SIZE_MAX, most = 0;
  for (int r = 0; r < ranks; ++r) {
    const auto& share = shares[static_cast<std::size_t>(r)];
    EXPECT_FALSE(share.shared);
    ASSERT_FALSE(share.cpus.empty()) << "rank " << r;
    for (const int pu : share.cpus) {
      EXPECT_FALSE(owner.count(pu)) << "CPU " << pu << " in ranks " << owner[pu] << " and " << r;
      owner[pu] = r;
      EXPECT_EQ(numa_of[pu], numa[static_cast<std::size_t>(r)])
          << "rank " << r << " CPU " << pu << " is not on its GPU's NUMA node";
    }
    fewest = std::min(fewest, share.cpus.size());
    most = std::max(most, share.cpus.size());

    PlanRequest request;
    request.gpu_local = near[static_cast<std::size_t>(r)];
    request.share = share.cpus;
    const Plan plan = plan_auto(topo, request);
    std::set<int> in_share(share.cpus.begin(), share.cpus.end());
    for (const auto& cpus : {plan.student, plan.loader})
      for (const int c : cpus) EXPECT_TRUE(in_share.count(c)) << "rank " << r << " CPU " << c;
    for (const auto& replica : plan.teacher)
      for (const int c : replica) EXPECT_TRUE(in_share.count(c)) << "rank " << r << " CPU " << c;
  }
  EXPECT_EQ(owner.size(), topo.allowed_cpus().size()); // the whole node is shared out
  EXPECT_LE(most - fewest, topo.cores().front().pus.size()) << "one core apart at most";
}

INSTANTIATE_TEST_SUITE_P(
    Synthetic, RankShares,
    ::testing::Values(ShareCase{"pack:2 numa:1 core:8 pu:2", {0, 0, 0, 0, 1, 1, 1, 1}},
                      // GPUs listed out of socket order: each rank still finds its own socket.
                      ShareCase{"pack:2 numa:1 core:8 pu:2", {1, 0, 1, 0}},
                      ShareCase{"pack:1 numa:1 core:8 pu:2", {0, 0, 0, 0}},
                      ShareCase{"pack:2 numa:2 core:6 pu:1", {0, 1, 2, 3}}));

TEST(RankShares, WithoutLocalityAreContiguousRuns) {
  const Topology topo = Topology::synthetic("pack:1 numa:1 core:7 pu:1");
  const auto shares = rank_shares(topo, 3, {});
  EXPECT_EQ(shares[0].cpus, (CpuList{0, 1, 2}));
  EXPECT_EQ(shares[1].cpus, (CpuList{3, 4}));
  EXPECT_EQ(shares[2].cpus, (CpuList{5, 6}));
}

TEST(RankShares, FewerCoresThanRanksShareAndStillPlan) {
  const Topology topo = Topology::synthetic("pack:1 numa:1 core:2 pu:1");
  const auto shares = rank_shares(topo, 3, {});
  for (std::size_t r = 0; r < 3; ++r) {
    EXPECT_TRUE(shares[r].shared);
    EXPECT_EQ(shares[r].cpus, (CpuList{static_cast<int>(r % 2)}));
    PlanRequest request;
    request.share = shares[r].cpus;
    const Plan plan = plan_auto(topo, request); // every role on the one core
    EXPECT_EQ(plan.student, shares[r].cpus);
    EXPECT_EQ(plan.loader, shares[r].cpus);
  }
}

TEST(RankShares, PlanFilesAndCpuListsAreRefusedForAShare) {
  const Topology topo = Topology::synthetic("pack:1 numa:1 core:4 pu:1");
  Config config;
  config.set("cores.student_cpus=0");
  config.set("cores.loader_cpus=1");
  config.set("cores.teacher_cpus=2");
  // The same lists plan this node for one process.
  EXPECT_NO_THROW(plan_from_config(config, topo, std::nullopt));
  const auto refusal = [&](const Config& c) {
    try {
      (void)plan_from_config(c, topo, std::nullopt, CpuList{0, 1});
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("<no InputError>");
  };
  EXPECT_NE(refusal(config).find("each plans its own share"), std::string::npos) << refusal(config);
  // A plan file is refused before it is read (this one does not exist: the message says why).
  Config file;
  file.set("cores.plan=plan.json");
  EXPECT_NE(refusal(file).find("cores.plan = plan.json: a plan file plans one process's node"),
            std::string::npos)
      << refusal(file);
}

} // namespace
} // namespace kdflow::affinity

namespace kdflow::affinity {
namespace {

// Several teachers: the teacher cores shared by cost (at least one each), each teacher's own
// replicas; with fewer cores than teachers each runs on all of them; replicas of different
// teachers may share CPUs, one teacher's may not; every teacher needs a replica.
TEST(SeveralTeachers, AutoSharesTheTeacherCoresByCost) {
  const Topology topo = Topology::synthetic("pack:1 core:10 pu:1");
  PlanRequest req;
  req.loader_cores = 1;
  req.teacher_costs = {3.0, 1.0};
  const Plan plan = plan_auto(topo, req);
  ASSERT_EQ(plan.teacher.size(), plan.teacher_of.size());
  std::map<int, std::size_t> cpus;
  std::set<int> seen;
  for (std::size_t i = 0; i < plan.teacher.size(); ++i) {
    cpus[plan.teacher_of[i]] += plan.teacher[i].size();
    for (const int c : plan.teacher[i]) EXPECT_TRUE(seen.insert(c).second) << "CPU " << c;
  }
  EXPECT_EQ(cpus[0], 6u); // 8 teacher cores at 3:1
  EXPECT_EQ(cpus[1], 2u);
  EXPECT_EQ(teacher_core_counts(8, {3.0, 1.0}), (std::vector<std::size_t>{6, 2}));
  EXPECT_EQ(teacher_core_counts(3, {1.0, 1.0, 100.0}), (std::vector<std::size_t>{1, 1, 1}));
  EXPECT_EQ(teacher_core_counts(1, {1.0, 2.0}), (std::vector<std::size_t>{1, 1})); // they share
  EXPECT_EQ(to_json(plan)["teacher_of"].size(), plan.teacher.size());
  EXPECT_NE(format_plan(plan, topo).find("t1"), std::string::npos);

  // Two cores: one teacher core, which both teachers run on.
  const Topology two = Topology::synthetic("pack:1 core:2 pu:1");
  const Plan shared = plan_auto(two, req);
  ASSERT_EQ(shared.teacher.size(), 2u);
  EXPECT_EQ(shared.teacher[0], shared.teacher[1]);
  EXPECT_EQ(shared.teacher_of, (std::vector<int>{0, 1}));
}

TEST(SeveralTeachers, ValidateAndConfigListsNameWhatIsWrong) {
  const Topology topo = Topology::synthetic("pack:1 core:8 pu:1");
  Plan p;
  p.student = {0};
  p.loader = {1};
  p.teacher = {{2, 3}, {3, 4}};
  p.teacher_of = {0, 1};
  EXPECT_NO_THROW(validate(p, topo, true, std::nullopt, 2)); // different teachers may share
  p.teacher_of = {0, 0};
  EXPECT_THROW(validate(p, topo, true, std::nullopt, 2), InputError); // teacher 1 has none
  p.teacher_of = {0, 2};
  EXPECT_THROW(validate(p, topo, true, std::nullopt, 2), InputError); // no teacher 2
  p.teacher_of = {0, 1};
  p.teacher = {{2, 3}, {4}, {3}};
  p.teacher_of = {0, 1, 0};
  EXPECT_THROW(validate(p, topo, true, std::nullopt, 2), InputError); // teacher 0 twice on CPU 3

  Config c;
  c.set("cores.student_cpus=0");
  c.set("cores.loader_cpus=1");
  c.set("cores.teacher_cpus=2-3;4|5-7");
  c.set("teacher.others=[{model = \"b.onnx\"}]");
  const Plan listed = plan_from_config(c, topo, std::nullopt);
  EXPECT_EQ(listed.teacher_of, (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(listed.teacher[2], (CpuList{5, 6, 7}));
  c.set("cores.teacher_cpus=2-7");
  EXPECT_THROW(plan_from_config(c, topo, std::nullopt), InputError); // teacher 1 has no replica
  c.set("cores.teacher_cpus=2-3|4");
  c.set("kd.alpha=0"); // no teacher runs: the lists are not held against the teacher count
  EXPECT_NO_THROW(plan_from_config(c, topo, std::nullopt));
  c.set("kd.alpha=0.9");

  // A plan file carries teacher_of; a bad one is named.
  const auto path = std::filesystem::temp_directory_path() / "kdflow_plan_teachers.json";
  std::ofstream(path) << nlohmann::json{{"plan", to_json(listed)}}.dump();
  EXPECT_EQ(read_plan_file(path).plan.teacher_of, listed.teacher_of);
  std::ofstream(path) << R"({"plan": {"student": [0], "loader": [1], "teacher": [[2]],
                            "teacher_of": ["x"]}})";
  try {
    (void)read_plan_file(path);
    ADD_FAILURE() << "a bad teacher_of was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("teacher_of"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

} // namespace
} // namespace kdflow::affinity
