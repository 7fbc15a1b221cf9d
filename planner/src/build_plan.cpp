// build_plan.cpp — generate → cost → lower → validate.
#include "tdpipe/planner/build_plan.hpp"

#include <utility>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/planner/generators.hpp"

namespace tdpipe::planner {

int chunks_for(std::string_view schedule, const ir::Scenario& scenario) {
  if (schedule == "zb-v") return 2;
  if (schedule == "interleaved") return scenario.chunks() > 1 ? scenario.chunks() : 2;
  return 1;
}

namespace {

int slices_for(std::string_view schedule, const ir::Scenario& scenario, int slices) {
  return schedule == "tdpipe" ? (slices > 0 ? slices : scenario.parallel.slices) : 1;
}

}  // namespace

std::int64_t estimate_ops(const ir::Scenario& scenario, std::string_view schedule, int slices) {
  const std::int64_t per_unit = 3 + 4;  // F, B, W; SEND/RECV of activation and gradient
  const std::int64_t units = std::int64_t{scenario.microbatches()} * chunks_for(schedule, scenario) *
                             slices_for(schedule, scenario, slices);
  const std::int64_t per_rank_extra = 64;  // OPT, data-parallel buckets (few) and their batches
  return std::int64_t{scenario.stages()} * (units * per_unit + per_rank_extra);
}

BuiltPlan build_plan(const ir::Scenario& scenario, std::string_view schedule, int slices, std::int64_t max_ops) {
  ScheduleParams params;
  params.stages = scenario.stages();
  params.microbatches = scenario.microbatches();
  params.chunks = chunks_for(schedule, scenario);
  params.slices = slices_for(schedule, scenario, slices);
  if (slices > 1 && schedule != "tdpipe")
    throw Error(fmt::format("--slices {}: temporal slices apply to the tdpipe schedule only, not {}",
                            slices, schedule));
  if (const std::int64_t ops = estimate_ops(scenario, schedule, slices); ops > max_ops) {
    // Both copies (compute-only and lowered) are held while planning.
    const double gib = 2.0 * static_cast<double>(ops) * sizeof(ir::Op) / double(1u << 30);
    throw Error(fmt::format(
        "{}: the {} plan would have up to {} ops (p = {} stages x m = {} micro-batches x v = {} chunks "
        "x S = {} slices x 7), about {:.1f} GiB while planned; the limit is {} ops (--max-ops N raises it)",
        scenario.name, schedule, ops, params.stages, params.microbatches, params.chunks, params.slices, gib,
        max_ops));
  }
  if (!scenario.synthetic && scenario.model.layers % (params.stages * params.chunks) != 0)
    throw Error(fmt::format(
        "{}: schedule {} runs {} chunk(s) on each of {} stages, so model.layers ({}) must be "
        "divisible by {}",
        scenario.name, schedule, params.chunks, params.stages, scenario.model.layers,
        params.stages * params.chunks));
  // params.slice_costs stays empty (equal): solve_slices gives every slice the same
  // cost given its prefix, which is what the tdpipe list scheduler then assumes.

  BuiltPlan out;
  out.compute_only = make_schedule(schedule, params);
  out.compute_only.data = scenario.synthetic ? 1 : scenario.parallel.data;
  out.compute_only.scenario = scenario;
  apply_costs(out.compute_only, scenario);
  // lower() proves its order deadlock-free (see ValidateOptions); every other check runs.
  ir::ValidateOptions checks;
  checks.check_deadlock = false;
  ir::LoweredPlan lowered =
      ir::lower_validated(out.compute_only, lowering_options(out.compute_only, scenario), checks);
  out.lowered = std::move(lowered.plan);
  out.report = std::move(lowered.report);
  return out;
}

}  // namespace tdpipe::planner
