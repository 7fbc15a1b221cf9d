// backend.cpp — checks shared by every backend's transport.
#include "tdpipe/exec/backend.hpp"

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec {

void check_p2p_op(const P2POp& op, int stages) {
  if (op.kind != ir::OpKind::SEND && op.kind != ir::OpKind::RECV)
    throw Error(fmt::format("transport: {} is not SEND or RECV", ir::to_string(op.kind)));
  if (op.peer < 0 || op.peer >= stages)
    throw Error(fmt::format("{}: peer {} is not a pipeline rank (p = {})", op.label, op.peer, stages));
}

std::pair<std::int64_t, std::int64_t> part_range(std::int64_t n, int index, int count) {
  if (count < 1 || index < 0 || index >= count || n < 0)
    throw Error(fmt::format("part {} of {} of {} elements: out of range", index, count, n));
  return {n * index / count, n * (index + 1) / count};
}

int owned_segment(int member, int members) {
  if (members < 1 || member < 0 || member >= members)
    throw Error(fmt::format("data-parallel member {} of {}: out of range", member, members));
  return (member + 1) % members;
}

std::vector<std::pair<std::int64_t, std::int64_t>> owned_ranges(std::int64_t n, int buckets,
                                                                const OptimizerShard& shard) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  const int seg = owned_segment(shard.member, shard.members);
  for (int k = 0; k < buckets; ++k) {
    const auto [b0, b1] = part_range(n, k, buckets);
    const auto [s0, s1] = part_range(b1 - b0, seg, shard.members);
    if (s1 > s0) out.emplace_back(b0 + s0, b0 + s1);
  }
  return out;
}

}  // namespace tdpipe::exec
