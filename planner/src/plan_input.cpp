// plan_input.cpp — a command's input: a scenario built here, or a plan file as it is.
#include "tdpipe/planner/plan_input.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/json_read.hpp"
#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/ir/validate.hpp"
#include "tdpipe/planner/cost_model.hpp"

namespace tdpipe::planner {
namespace {

bool looks_like_plan(const nlohmann::json& j) {
  return j.is_object() && j.contains("ranks") && j.contains("scenario");
}

// A cheap look at the first bytes: JSON objects only (a YAML scenario is not parsed here).
bool starts_with_brace(const std::string& text) {
  for (char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    return c == '{';
  }
  return false;
}

// The plan JSON in `text`, or null when it is not one (not JSON — a YAML scenario, or a
// broken file the scenario loader names — or JSON without ranks and scenario).
nlohmann::json plan_json(const std::string& text, const std::string& path) {
  if (!starts_with_brace(text)) return nullptr;
  try {
    nlohmann::json j = ir::parse_json(text, path);
    if (!looks_like_plan(j)) return nullptr;
    return j;
  } catch (const Error&) {
    return nullptr;
  }
}

}  // namespace

bool is_plan_file(const std::string& path) { return !plan_json(ir::read_file(path, "input"), path).is_null(); }

PlanInput load_plan_input(const std::string& path, const std::string& schedule, int slices,
                          std::int64_t max_ops) {
  if (auto from_file = load_plan_file(path, schedule, slices, max_ops)) return std::move(*from_file);
  PlanInput in;
  in.scenario = ir::load_scenario(path);
  in.schedule = schedule.empty() ? in.scenario.schedule : schedule;
  in.built = build_plan(in.scenario, in.schedule, slices, max_ops);
  return in;
}

std::optional<PlanInput> load_plan_file(const std::string& path, const std::string& schedule, int slices,
                                        std::int64_t max_ops) {
  const nlohmann::json j = plan_json(ir::read_file(path, "scenario or plan"), path);
  if (j.is_null()) return std::nullopt;
  PlanInput in;
  ir::Plan plan;
  try {
    plan = ir::plan_from_json(j);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
  if (plan.serve)
    throw Error(fmt::format("{}: a serving plan ({} planner); run it with `tdpipe serve {}`", path, plan.serve->planner,
                            path));
  if (!schedule.empty() && schedule != plan.schedule)
    throw Error(fmt::format("{}: a plan of schedule {}; --schedule {} asks for another (a plan file is run as it "
                            "is: plan the scenario again for another schedule)",
                            path, plan.schedule, schedule));
  if (slices != 0 && slices != plan.slices)
    throw Error(fmt::format("{}: a plan of S = {} slices; --slices {} asks for another (a plan file is run as it is)",
                            path, plan.slices, slices == kAutoSlices ? std::string("auto") : std::to_string(slices)));
  // The plan must be its scenario's: the engines place GPUs by the plan's ranks and
  // replicas, the report prices them by the scenario's layout.
  const ir::Scenario& sc = plan.scenario;
  auto mismatch = [&](const char* what, std::int64_t plan_value, const char* field, std::int64_t scenario_value) {
    throw Error(fmt::format("{}: the plan has {} = {} but its scenario's {} is {}: a plan file must be the plan "
                            "of its own scenario (write it with tdpipe plan --format json -o)",
                            path, what, plan_value, field, scenario_value));
  };
  if (sc.synthetic) {
    if (plan.stages != sc.synthetic->stages) mismatch("stages", plan.stages, "synthetic.stages", sc.synthetic->stages);
    if (plan.data != 1) mismatch("data", plan.data, "data parallelism (synthetic)", 1);
  } else {
    const auto& par = sc.parallel;
    if (plan.stages != par.pipeline) mismatch("stages", plan.stages, "parallel.pipeline", par.pipeline);
    if (plan.data != par.data) mismatch("data", plan.data, "parallel.data", par.data);
    const std::int64_t per_step = std::int64_t(std::max(1, par.micro_batch)) * std::max(1, par.data);
    if (std::int64_t(plan.microbatches) * per_step != par.global_batch)
      mismatch("microbatches", plan.microbatches, "parallel.global_batch / (micro_batch · data)",
               par.global_batch / per_step);
    const std::int64_t gpus = std::int64_t(std::max(1, par.tensor)) * plan.stages * plan.data;
    if (gpus > sc.cluster.gpus())
      throw Error(fmt::format("{}: the plan needs {} GPUs (t {} × p {} × d {}), its scenario's cluster has {}", path,
                              gpus, par.tensor, plan.stages, plan.data, sc.cluster.gpus()));
  }
  std::int64_t ops = 0;
  for (const auto& r : plan.ranks) ops += static_cast<std::int64_t>(r.size());
  // The lowered plan's size, as the scenario path bounds it before planning.
  const std::int64_t estimate = plan.lowered ? ops : std::max(ops, estimate_ops(sc, plan.schedule, plan.slices));
  if (estimate > max_ops)
    throw Error(fmt::format("{}: {} ops{}, more than --max-ops {}", path, estimate,
                            plan.lowered ? "" : " once lowered (estimated)", max_ops));
  // A lowered plan's dependencies stay on their rank (transfers are SEND/RECV): the
  // executors would not wait for another rank's op, though the engines would.
  if (plan.lowered)
    for (int r = 0; r < plan.num_ranks(); ++r)
      for (std::size_t i = 0; i < plan.ranks[static_cast<std::size_t>(r)].size(); ++i)
        for (const auto& d : plan.ranks[static_cast<std::size_t>(r)][i].deps)
          if (d.rank != r)
            throw Error(fmt::format("{}: rank {} op {} ({}) depends on rank {}'s op {}: in a lowered plan a rank "
                                    "waits for another only through RECV",
                                    path, r, i, ir::op_to_text(plan.ranks[static_cast<std::size_t>(r)][i]), d.rank,
                                    d.index));
  try {
    if (plan.lowered) {
      in.built.report = ir::validate(plan);
      in.built.lowered = std::move(plan);
    } else {  // `tdpipe plan --compute-only`: lowered here, as build_plan lowers
      in.built.compute_only = plan;
      ir::LoweredPlan lowered = ir::lower_validated(plan, lowering_options(plan, plan.scenario), {});
      in.built.lowered = std::move(lowered.plan);
      in.built.report = std::move(lowered.report);
    }
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
  in.scenario = in.built.lowered.scenario;
  in.schedule = in.built.lowered.schedule;
  in.plan_file = true;
  return in;
}

}  // namespace tdpipe::planner
