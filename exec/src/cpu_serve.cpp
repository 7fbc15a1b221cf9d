// cpu_serve.cpp — PLACEHOLDER until the serving executor lands (same session).
#include "tdpipe/exec/cpu/serve.hpp"

#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cpu {
ServeRun run_serving(const ir::Plan&) { throw Error("run_serving: not built yet"); }
std::vector<int> prompt_tokens(std::uint64_t, int, int, int) { return {}; }
std::vector<std::vector<int>> greedy_reference(const ir::Scenario&, const std::vector<ir::Request>&, std::uint64_t) {
  return {};
}
}  // namespace tdpipe::exec::cpu
