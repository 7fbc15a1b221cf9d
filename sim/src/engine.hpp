// engine.hpp — internal: runs one SimGrid simulation of a lowered plan in this process
// (simulate() calls it in a forked child) and returns raw op timings.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/sim/simulate.hpp"

namespace tdpipe::sim::detail {

struct RawResult {
  /// Reported pipeline (trace_replica, trace_tp): [rank][op] = {start_ns, end_ns}.
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> timing;
  /// Same shape: when a comm op's data started to move (−1: not a comm op).
  std::vector<std::vector<std::int64_t>> xfer_ns;
  std::int64_t makespan_ns = 0;  ///< over every simulated GPU
  std::vector<LinkUsage> links;
  std::int64_t gpus = 0, actors = 0, flows = 0;
  std::string collective;
  int trace_replica = 0, trace_tp = 0;
  std::vector<int> replicas;  ///< reduced: the replicas simulated
  double wall_seconds = 0, cpu_seconds = 0;
  std::int64_t peak_rss_bytes = 0;
};

/// Runs the simulation; throws tdpipe::Error on bad plans and deadlocks. Must be called
/// at most once per process (SimGrid 3.32 keeps global engine state).
RawResult run_engine(const ir::Plan& plan, const SimOptions& options,
                     const std::function<void(double)>& progress);

/// The same, as the engine plugin (libtdpipe_sim_engine.so, which `tdpipe` opens only in
/// the simulation's child process, so that its start-up never maps SimGrid) exports it.
inline constexpr const char* kEngineEntry = "tdpipe_sim_run_engine";
using EngineEntry = void (*)(const ir::Plan&, const SimOptions&, const std::function<void(double)>&, RawResult&);
/// The plugin's ABI tag, which the caller compares with its own before it passes C++
/// values across: a plugin of another build (TDPIPE_SIM_ENGINE) is refused, not run.
inline constexpr const char* kEngineAbiEntry = "tdpipe_sim_engine_abi";
/// kEngineAbiVersion: bump it with any change to ir::Plan, ir::Op, ir::Scenario,
/// SimOptions or RawResult (sizes alone miss a field that fits in padding).
inline constexpr int kEngineAbiVersion = 2;
inline std::string engine_abi() {
  return "tdpipe-sim-engine/" + std::to_string(kEngineAbiVersion) + " " __VERSION__ " " + std::to_string(sizeof(ir::Plan)) + " " +
         std::to_string(sizeof(ir::Op)) + " " + std::to_string(sizeof(ir::Scenario)) + " " +
         std::to_string(sizeof(SimOptions)) + " " + std::to_string(sizeof(RawResult));
}

}  // namespace tdpipe::sim::detail
