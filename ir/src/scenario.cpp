// scenario.cpp — derived quantities of a Scenario.
#include "tdpipe/ir/scenario.hpp"

namespace tdpipe::ir {

int ClusterConfig::nodes() const {
  int n = 0;
  for (const auto& g : groups) n += g.nodes;
  return n;
}

double host_link_bytes_per_second(const ClusterConfig& cluster, const GpuSpec& gpu) {
  if (cluster.host_bytes_per_second > 0) return cluster.host_bytes_per_second;
  if (gpu.name.rfind("h100", 0) == 0 || gpu.name.rfind("h200", 0) == 0) return 50e9;
  if (gpu.name == "cpu") return 10e9;
  return 25e9;
}

int Scenario::stages() const { return synthetic ? synthetic->stages : parallel.pipeline; }
int Scenario::microbatches() const {
  return synthetic ? synthetic->microbatches : parallel.microbatches();
}
int Scenario::chunks() const { return synthetic ? synthetic->chunks : parallel.chunks; }

}  // namespace tdpipe::ir
