// cmd_compare.cpp — `tdpipe compare PREDICTED MEASURED`: how far a prediction is
// from a measured run of the same plan.
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/trace_io.hpp"
#include "tdpipe/traces/compare.hpp"

namespace tdpipe::apps {
namespace {

struct CompareArgs {
  std::string predicted, measured;
  bool json = false;
  int top = 10;
};

void run_compare(const CompareArgs& a) {
  const traces::Trace predicted = traces::read_trace(a.predicted);
  const traces::Trace measured = traces::read_trace(a.measured);
  traces::CompareOptions options;
  options.top_drift = a.top;
  const traces::Comparison c = traces::compare(predicted, measured, options);
  if (a.json)
    std::cout << traces::to_json(c).dump(2) << "\n";
  else
    std::cout << traces::to_text(c);
}

}  // namespace

void add_compare_command(CLI::App& app) {
  auto args = std::make_shared<CompareArgs>();
  CLI::App* cmd = app.add_subcommand("compare", "Compare a predicted trace with a measured one");
  cmd->add_option("predicted", args->predicted, "Predicted trace (tdpipe sim --trace-out)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("measured", args->measured,
                  "Measured trace: tdpipe exec --trace-out, a Kineto file or folder of per-rank files (PyTorch "
                  "profiler; ranges named like tdpipe ops), or an Nsight Systems SQLite export (NVTX ranges)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
  cmd->add_option("--top", args->top, "How many ops with the largest start drift to list")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->callback([args] { run_compare(*args); });
}

}  // namespace tdpipe::apps
