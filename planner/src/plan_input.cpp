// plan_input.cpp — a command's input: a scenario built here, or a plan file as it is.
#include "tdpipe/planner/plan_input.hpp"

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

}  // namespace

bool is_plan_file(const std::string& path) {
  const std::string text = ir::read_file(path, "input");
  if (!starts_with_brace(text)) return false;
  try {
    return looks_like_plan(ir::parse_json(text, path));
  } catch (const Error&) {
    return false;  // (not JSON: the scenario loader says what is wrong with it)
  }
}

PlanInput load_plan_input(const std::string& path, const std::string& schedule, int slices,
                          std::int64_t max_ops) {
  PlanInput in;
  const std::string text = ir::read_file(path, "scenario or plan");
  nlohmann::json j;
  if (starts_with_brace(text)) j = ir::parse_json(text, path);
  if (!looks_like_plan(j)) {
    in.scenario = ir::load_scenario(path);
    in.schedule = schedule.empty() ? in.scenario.schedule : schedule;
    in.built = build_plan(in.scenario, in.schedule, slices, max_ops);
    return in;
  }
  ir::Plan plan;
  try {
    plan = ir::plan_from_json(j);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
  if (!schedule.empty() && schedule != plan.schedule)
    throw Error(fmt::format("{}: a plan of schedule {}; --schedule {} asks for another (a plan file is run as it "
                            "is: plan the scenario again for another schedule)",
                            path, plan.schedule, schedule));
  if (slices != 0 && slices != plan.slices)
    throw Error(fmt::format("{}: a plan of S = {} slices; --slices {} asks for another (a plan file is run as it is)",
                            path, plan.slices, slices == kAutoSlices ? std::string("auto") : std::to_string(slices)));
  std::int64_t ops = 0;
  for (const auto& r : plan.ranks) ops += static_cast<std::int64_t>(r.size());
  if (ops > max_ops)
    throw Error(fmt::format("{}: {} ops, more than --max-ops {}", path, ops, max_ops));
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
