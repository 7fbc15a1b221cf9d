// exec_common.hpp — what `tdpipe exec` and `tdpipe calibrate` share across backends
// (cmd_exec.cpp, cmd_calibrate.cpp, cmd_exec_cuda.cpp): loading the scenario and
// building its plan, the --backend check, and the run report (JSON and text).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/ir/scenario.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/plan_input.hpp"

namespace tdpipe::apps {

/// A scenario and the plan built for it, or a plan file as it is (planner/plan_input.hpp).
using LoadedPlan = planner::PlanInput;
/// planner::load_plan_input: a scenario built for `schedule` (the scenario's when empty)
/// with `slices`, or a plan file.
inline LoadedPlan load_plan(const std::string& path, const std::string& schedule, int slices,
                            std::int64_t max_ops = planner::kDefaultMaxOps) {
  return planner::load_plan_input(path, schedule, slices, max_ops);
}

/// Throws for a --backend other than cpu/cuda. `cuda` reaches here only in a binary
/// without the CUDA backend: `tdpipe` hands the whole command line to tdpipe-cuda, next
/// to it, which has it (so that tdpipe itself never loads the CUDA libraries); a build
/// without one throws, saying how to get one.
void check_cpu_backend(const std::string& backend);

/// The training options `exec` takes from its command line, on either backend.
exec::cpu::TrainOptions train_options(int steps, double lr, std::uint64_t seed, const std::string& corpus);
/// --wire auto|bf16|fp32 → TrainOptions::bf16_wire. auto: bf16 on the CUDA backend when
/// model.dtype is bf16 (what the planner prices), fp32 otherwise (the CPU backend exact).
bool bf16_wire(const std::string& wire, bool cuda, const ir::Scenario& sc);

/// --rank-speed "0:1,1:0.5": a speed in [0.01, 1] per listed pipeline rank (each once), 1
/// for the rest of the plan's `ranks`. Throws naming the item and what was expected.
std::vector<double> parse_rank_speed(const std::string& text, int ranks);

/// Median of the iteration times after step 0 (the first step pays for allocations).
double steady_iteration_seconds(const std::vector<double>& iteration_seconds);

/// Largest relative L2 difference, tensor by tensor, of `got` from `want`. Tensors
/// missing from `got` throw unless `skip_missing` (an NCCL process holds only its own).
double max_rel(const exec::cpu::ParamMap& got, const exec::cpu::ParamMap& want, bool skip_missing);

/// The backend-independent fields of the `exec` report.
nlohmann::json run_report(const ir::Scenario& scenario, const ir::Plan& plan, int steps,
                          const exec::cpu::RunResult& run, double weights_l2, double iteration_seconds,
                          const std::string& trace_out);

/// Adds `reference` (loss, weight and grad errors vs the single-device run) to `report`.
void add_reference_errors(nlohmann::json& report, const exec::cpu::RunResult& run,
                          const exec::cpu::RunResult& reference, bool skip_missing);

/// Prints the per-step losses, the summary line and the reference comparison of
/// `report`; `ms_digits` is the precision of the per-step times, `reference_label`
/// names the reference in its line.
void print_run_report(const nlohmann::json& report, const exec::cpu::RunResult& run, double weights_l2,
                      double iteration_seconds, int ms_digits, const std::string& reference_label,
                      const std::string& trace_out);

}  // namespace tdpipe::apps
