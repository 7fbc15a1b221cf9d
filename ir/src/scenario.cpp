// scenario.cpp — derived quantities of a Scenario.
#include "tdpipe/ir/scenario.hpp"

namespace tdpipe::ir {

int ClusterConfig::nodes() const {
  int n = 0;
  for (const auto& g : groups) n += g.nodes;
  return n;
}

int Scenario::stages() const { return synthetic ? synthetic->stages : parallel.pipeline; }
int Scenario::microbatches() const {
  return synthetic ? synthetic->microbatches : parallel.microbatches();
}
int Scenario::chunks() const { return synthetic ? synthetic->chunks : parallel.chunks; }

}  // namespace tdpipe::ir
