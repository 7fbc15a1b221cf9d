// bench_search.cpp — how long `tdpipe search` takes on large spaces: GPT-3 175B and
// Megatron-Turing 530B on 5,120 A100 80GB (640 DGX nodes, HDR InfiniBand), the analytic
// stage only (enumerate, prune, bound, plan the candidates that can still win). Prints
// the wall time, the layouts considered / pruned / planned and the winner.
//   bench_search            both models
//   bench_search FILE GPUS BATCH   one scenario file
#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/search.hpp"

namespace {

void run(const std::string& file, int gpus, int batch) {
  using namespace tdpipe;
  const ir::Scenario sc = ir::load_scenario(file);
  planner::SearchOptions o;
  o.gpus = gpus;
  o.global_batches = {batch};
  const planner::SearchResult r = planner::search_layouts(sc, o);
  fmt::print("{} on {} GPUs, global batch {}: {:.2f} s; {} layouts considered, {} pruned by memory, {} bounded, "
             "{} planned\n",
             sc.model.name, gpus, batch, r.seconds, r.considered, r.pruned_memory, r.pruned_bound, r.planned);
  for (int k = 0; k < int(r.top.size()); ++k) {
    const auto& c = r.candidates[r.top[k]];
    fmt::print("  #{} {:<52} {:8.3f} s  MFU {:4.1f} %  {:5.1f} GiB\n", k + 1, c.layout.label(),
               c.iteration_seconds, 100 * c.mfu, c.peak_bytes / double(1u << 30));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4) {
    run(argv[1], std::atoi(argv[2]), std::atoi(argv[3]));
    return 0;
  }
  const std::string dir = TDPIPE_SOURCE_DIR "/scenarios/";
  run(dir + "gpt3-175b-a100-8x8.yaml", 5120, 1536);
  run(dir + "turing-530b-a100-35x8.yaml", 5120, 2560);
  return 0;
}
