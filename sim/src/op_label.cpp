// op_label.cpp — an op's name in traces and error messages (the plan text form).
#include <fmt/format.h>

#include "engine.hpp"

namespace tdpipe::sim::detail {
namespace {
std::string ids(int mb, int chunk, int slice, const ir::Plan& plan) {
  std::string s = mb >= 0 ? fmt::format("{}", mb) : std::string();
  if (chunk != 0 || plan.chunks > 1) s += fmt::format(".c{}", chunk);
  if (slice != 0 || plan.slices > 1) s += fmt::format(":s{}", slice);
  return s;
}
}  // namespace

std::string op_label(const ir::Op& op, const ir::Plan& plan) {
  using ir::OpKind;
  const std::string kind(ir::to_string(op.kind));
  if (op.kind == OpKind::OPT) return kind;
  if (ir::is_p2p(op.kind))
    return fmt::format("{}({}{}{}r{})", kind, ir::to_string(op.payload),
                       ids(op.mb, op.chunk, op.slice, plan),
                       op.kind == OpKind::SEND ? ">" : "<", op.peer);
  if (ir::is_collective(op.kind)) return fmt::format("{}(b{})", kind, op.tag);
  return kind + ids(op.mb, op.chunk, op.slice, plan);
}

}  // namespace tdpipe::sim::detail
