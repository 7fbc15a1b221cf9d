// test_sim_golden.cpp — golden timelines (SimGrid's .tesh practice): small scenarios'
// predicted traces are checked in under tests/sim/golden/ and compared op by op.
// Regenerate after an intended change of the model:
//   TDPIPE_REGEN_GOLDEN=1 build/<dir>/tests/test_sim "[golden]"
// then review the diff (git diff tests/sim/golden) before committing it.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/sim/simulate.hpp"

using namespace tdpipe;

namespace {

std::string golden_path(const std::string& name) {
  return std::string(TDPIPE_SOURCE_DIR) + "/tests/sim/golden/" + name + ".txt";
}

std::string render(const traces::Trace& t) {
  std::ostringstream os;
  os << "# rank stream op start_ns dur_ns — " << t.scenario << " " << t.schedule << "\n";
  for (const auto& e : t.events)
    os << e.rank << " " << e.stream << " " << e.name << " " << e.start_ns << " " << e.dur_ns << "\n";
  return os.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream is(text);
  for (std::string l; std::getline(is, l);) out.push_back(l);
  return out;
}

void check_golden(const std::string& name, const traces::Trace& trace) {
  const std::string got = render(trace);
  const std::string path = golden_path(name);
  if (std::getenv("TDPIPE_REGEN_GOLDEN")) {
    std::ofstream(path) << got;
    WARN("regenerated " << path);
    return;
  }
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream want;
  want << in.rdbuf();
  const auto a = lines(want.str()), b = lines(got);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(path << ":" << i + 1);
    REQUIRE(b[i] == a[i]);
  }
}

/// Fixed op times so the golden file does not move with the cost model's efficiencies.
std::optional<double> fixed_seconds(const ir::Op& op, int) {
  switch (op.kind) {
    case ir::OpKind::F: return 4e-3;
    case ir::OpKind::B: return 4e-3;
    case ir::OpKind::W: return 4e-3;
    case ir::OpKind::BW: return 8e-3;
    case ir::OpKind::OPT: return 1e-3;
    default: return std::nullopt;
  }
}

}  // namespace

TEST_CASE("golden: synthetic uniform p4 m8, 1F1B and ZB-H1", "[sim][golden]") {
  const auto sc = ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/synthetic-uniform-p4-m8.yaml");
  for (const char* schedule : {"1f1b", "zb-h1"}) {
    SECTION(schedule) {
      const auto built = planner::build_plan(sc, schedule);
      check_golden(std::string("synthetic-uniform-p4-m8.") + schedule, sim::simulate(built.lowered).trace);
    }
  }
}

TEST_CASE("golden: Llama-2 70B on 8 DGX A100, t=8 p=4 d=2, 1F1B with bucketed all-reduce", "[sim][golden]") {
  auto sc = ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/llama2-70b-a100-4x8.yaml");
  sc.cluster.groups.front().nodes = 8;
  sc.parallel.data = 2;
  sc.parallel.global_batch = 16;  // m = 8 per pipeline
  const auto built = planner::build_plan(sc, "1f1b");
  sim::SimOptions opt;
  opt.op_seconds = fixed_seconds;
  opt.collective = sim::CollectiveAlgorithm::Ring;
  const auto res = sim::simulate(built.lowered, opt);
  check_golden("llama2-70b-8x8-d2.1f1b", res.trace);
}
