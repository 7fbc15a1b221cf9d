// bench_profile_replay.cpp — a profile-driven prediction for machines without
// SimGrid (the GPU machine): replays the plan's op order (ir::replay: per-stream
// order, deps, rendezvous SEND/RECV, batches) with each compute op's measured median
// from a calibration profile and the profile's transport fits, and writes the
// predicted trace (origin "analytic") for `tdpipe compare`.
//   bench_profile_replay SCENARIO(.json|.yaml) SCHEDULE SLICES PROFILE OUT_TRACE
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "tdpipe/exec/cuda/timeline.hpp"
#include "tdpipe/ir/replay.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/profile.hpp"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s SCENARIO SCHEDULE SLICES PROFILE OUT_TRACE\n", argv[0]);
    return 2;
  }
  try {
    using namespace tdpipe;
    const ir::Scenario sc = ir::load_scenario(argv[1]);
    const planner::BuiltPlan built = planner::build_plan(sc, argv[2], std::atoi(argv[3]));
    const ir::Plan& plan = built.lowered;
    const traces::Profile prof = traces::read_profile(argv[4]);
    int missing = 0;
    auto ns = [](double s) { return static_cast<std::int64_t>(std::llround(s * 1e9)); };
    const ir::ReplayResult r = ir::replay(plan, [&](const ir::Op& op, int rank) -> std::int64_t {
      if (ir::is_p2p(op.kind)) return ns(prof.p2p.seconds(static_cast<double>(op.bytes)));
      if (ir::is_collective(op.kind)) return ns(prof.collective.seconds(static_cast<double>(op.bytes)));
      if (!ir::is_compute(op.kind)) return 0;
      const int stage = op.kind == ir::OpKind::OPT ? -1 : plan.stage_of[static_cast<std::size_t>(rank)][static_cast<std::size_t>(op.chunk)];
      auto s = traces::profile_seconds(prof, op.kind, stage, op.slice);
      if (!s) {
        ++missing;
        return 0;
      }
      return ns(*s);
    });
    traces::Trace t;
    t.origin = "analytic";
    t.schedule = plan.schedule;
    t.scenario = sc.name;
    t.ranks = plan.num_ranks();
    t.metadata["predictor"] = "ir::replay with calibration profile " + std::string(argv[4]);
    for (int rank = 0; rank < plan.num_ranks(); ++rank)
      for (std::size_t i = 0; i < plan.ranks[static_cast<std::size_t>(rank)].size(); ++i) {
        const ir::Op& op = plan.ranks[static_cast<std::size_t>(rank)][i];
        const ir::OpTiming& tm = r.timing[static_cast<std::size_t>(rank)][i];
        traces::TraceEvent e;
        e.rank = rank;
        e.stream = static_cast<int>(op.stream);
        e.name = exec::cuda::trace_name(op);
        e.kind = op.kind;
        e.mb = op.mb;
        e.chunk = op.chunk;
        e.slice = op.slice;
        e.peer = op.peer;
        e.bytes = op.bytes;
        e.start_ns = tm.start_ns;
        e.dur_ns = tm.end_ns - tm.start_ns;
        t.events.push_back(e);
      }
    traces::write_trace(t, argv[5]);
    std::printf("%s: predicted iteration %.3f ms (%d compute ops without a profile entry)\n", argv[5],
                static_cast<double>(r.makespan_ns) * 1e-6, missing);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_profile_replay: %s\n", e.what());
    return 1;
  }
  return 0;
}
