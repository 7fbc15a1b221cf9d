// bench_generators.cpp — time and peak memory of the schedule generators at scale
// (compute-only plans, no lowering). Prints figures; never passes or fails on time.
// Best of 3 runs; cpu_ms is the process CPU time, a steadier figure than wall time on
// a shared machine.
#include "bench_help.hpp"
#include <sys/resource.h>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <string>
#include <vector>

#include "tdpipe/planner/generators.hpp"

namespace {

long max_rss_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

}  // namespace

int main(int argc, char** argv) {
  if (tdpipe::bench::help_requested(argc, argv)) return 0;
  using clock = std::chrono::steady_clock;
  struct Case {
    const char* name;
    int p, m, v, S;
  };
  const std::vector<Case> cases = {
      {"gpipe", 64, 1024, 1, 1},       {"1f1b", 64, 1024, 1, 1},
      {"interleaved", 64, 1024, 4, 1}, {"zb-h1", 64, 1024, 1, 1},
      {"zb-h2", 64, 1024, 1, 1},       {"zb-v", 64, 1024, 2, 1},
      {"tdpipe", 64, 1024, 1, 1},      {"tdpipe", 64, 1024, 1, 4},
      {"tdpipe", 64, 1024, 1, 16},
  };
  std::printf("%-12s %4s %5s %2s %3s %10s %10s %10s %10s %12s\n", "schedule", "p", "m", "v", "S",
              "ops", "wall_ms", "cpu_ms", "Mops/s", "max_rss_MiB");
  for (const Case& c : cases) {
    tdpipe::planner::ScheduleParams params;
    params.stages = c.p;
    params.microbatches = c.m;
    params.chunks = c.v;
    params.slices = c.S;
    const int reps = 3;
    double best_ms = 1e300, best_cpu_ms = 1e300;
    std::size_t ops = 0;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = clock::now();
      const std::clock_t c0 = std::clock();
      const auto plan = tdpipe::planner::make_schedule(c.name, params);
      const double cpu_ms = 1e3 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
      const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
      best_ms = ms < best_ms ? ms : best_ms;
      best_cpu_ms = cpu_ms < best_cpu_ms ? cpu_ms : best_cpu_ms;
      ops = 0;
      for (const auto& rank : plan.ranks) ops += rank.size();
    }
    std::printf("%-12s %4d %5d %2d %3d %10zu %10.1f %10.1f %10.2f %12.1f\n", c.name, c.p, c.m,
                c.v, c.S, ops, best_ms, best_cpu_ms, ops / best_cpu_ms / 1e3,
                max_rss_kib() / 1024.0);
  }
  return 0;
}
