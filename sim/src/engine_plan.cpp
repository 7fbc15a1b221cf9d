// engine_plan.cpp — the SimGrid engine's plan analysis: per-rank streams, implicit dependencies, SEND/RECV matching (the Model: engine_model.hpp).
#include "engine_model.hpp"

namespace tdpipe::sim::detail::engine {

// ---------------------------------------------------------------------------------
// Plan analysis: streams, implicit dependencies, SEND/RECV matching.

void Model::prepare_ranks() {
  const int p = plan_.num_ranks();
  ranks_.resize(p);
  using MsgKey = std::tuple<int, int, int, int, int, int>;  // src, dst, payload, mb, slice, k
  std::map<MsgKey, std::pair<int, int>> sends;  // → (rank, op)
  std::map<std::tuple<int, int, int, int, int>, int> occurrence;

  for (int r = 0; r < p; ++r) {
    const auto& ops = plan_.ranks[r];
    RankInfo& info = ranks_[r];
    const int n = static_cast<int>(ops.size());
    info.local_deps.assign(n, {});
    info.gates.assign(n, {});
    info.remote_deps.assign(n, {});
    info.match.assign(n, -1);
    info.seconds.assign(n, 0);
    std::vector<int> collectives;
    int last_backward = -1, last_compute = -1;
    for (int i = 0; i < n; ++i) {
      const ir::Op& op = ops[i];
      const int s = static_cast<int>(op.stream);
      if (s < 0 || s >= ir::kStreamCount)
        throw Error(fmt::format("plan rank {} op {} ({}): unknown stream", r, i, ir::op_to_text(op)));
      // Actors know what to do with an op only on its own kind of stream.
      const bool ok = ir::is_p2p(op.kind) ? op.stream == ir::Stream::P2P
                      : ir::is_collective(op.kind) ? op.stream == ir::Stream::DP
                                                   : true;
      if (!ok)
        throw Error(fmt::format("plan rank {} op {} ({}): a {} op cannot run on the {} stream", r, i,
                                ir::op_to_text(op), ir::to_string(op.kind), ir::to_string(op.stream)));
      info.stream_ops[s].push_back(i);
      if (op.kind == OpKind::B || op.kind == OpKind::W || op.kind == OpKind::BW) last_backward = i;
      if (ir::is_compute(op.kind) && op.kind != OpKind::OPT) last_compute = i;
      if (ir::is_collective(op.kind)) collectives.push_back(i);
      // Device time: compute ops', and a compressed all-reduce's kernels before its wire.
      if (!ir::is_p2p(op.kind) && (!ir::is_collective(op.kind) || op.kind == OpKind::COMPRESSED_ALLREDUCE)) {
        std::optional<double> over;
        if (opt_.op_seconds && ir::is_compute(op.kind)) over = opt_.op_seconds(op, r);
        const double sec = over ? *over : op.est_seconds;
        if (!(sec >= 0) || !(sec <= 9e9))  // 9e9 s keeps every time inside int64 ns
          throw Error(fmt::format("plan rank {} op {} ({}): duration {} s; expected a value in [0, 9e9]",
                                  r, i, ir::op_to_text(op), sec));
        info.seconds[i] = quantise_ns(sec);
      }
      for (const ir::OpRef& d : op.deps) {
        if (d.rank < 0 || d.rank >= p || d.index < 0 ||
            d.index >= static_cast<int>(plan_.ranks[d.rank].size()))
          throw Error(fmt::format("plan rank {} op {} ({}): dependency on rank {} op {} does not exist",
                                  r, i, ir::op_to_text(op), d.rank, d.index));
        if (d.rank == r && ir::is_weight_gate(op.kind, ops[static_cast<std::size_t>(d.index)].kind))
          info.gates[i].push_back(d.index);
        else if (d.rank == r) info.local_deps[i].push_back(d.index);
        else info.remote_deps[i].push_back(d);
      }
    }
    for (int i = 0; i < n; ++i) {
      const ir::Op& op = ops[i];
      // Lowering gives compute → RECV and SEND → producer as explicit deps (a RECV
      // carries the sender's chunk, so matching by ids here would be wrong).
      if (ir::is_collective(op.kind)) {
        if (op.deps.empty() && last_backward >= 0) info.local_deps[i].push_back(last_backward);
        if (!opt_.overlap_dp && last_compute >= 0) info.local_deps[i].push_back(last_compute);
      } else if (op.kind == OpKind::OPT) {
        // The reductions before it; a sharded optimizer's ALL_GATHERs come after it.
        for (int j : collectives)
          if (ops[static_cast<std::size_t>(j)].kind != OpKind::ALL_GATHER) info.local_deps[i].push_back(j);
      }
      if (ir::is_p2p(op.kind)) {
        if (op.peer < 0 || op.peer >= p || op.peer == r)
          throw Error(fmt::format("plan rank {} op {} ({}): peer {} is not another rank of 0…{}", r, i,
                                  ir::op_to_text(op), op.peer, p - 1));
        const int src = op.kind == OpKind::SEND ? r : op.peer;
        const int dst = op.kind == OpKind::SEND ? op.peer : r;
        const int k = occurrence[{src * p + dst, op.kind == OpKind::SEND ? 0 : 1,
                                  static_cast<int>(op.payload), op.mb, op.slice}]++;
        if (op.kind == OpKind::SEND)
          sends[{src, dst, static_cast<int>(op.payload), op.mb, op.slice, k}] = {r, i};
      }
    }
  }
  // Match each RECV with the SEND of the same (src, dst, payload, mb, slice, occurrence).
  std::map<std::tuple<int, int, int, int, int>, int> seen;
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < static_cast<int>(plan_.ranks[r].size()); ++i) {
      const ir::Op& op = plan_.ranks[r][i];
      if (op.kind != OpKind::RECV) continue;
      const int k = seen[{op.peer * p + r, static_cast<int>(op.payload), op.mb, op.slice, 0}]++;
      auto it = sends.find({op.peer, r, static_cast<int>(op.payload), op.mb, op.slice, k});
      if (it == sends.end())
        throw Error(fmt::format("plan rank {} op {} ({}): no matching SEND on rank {}", r, i,
                                ir::op_to_text(op), op.peer));
      ranks_[r].match[i] = it->second.second;
      ranks_[it->second.first].match[it->second.second] = i;
      sends.erase(it);
    }
  }
  if (!sends.empty()) {
    const auto& [rank, index] = sends.begin()->second;
    throw Error(fmt::format("plan rank {} op {} ({}): no matching RECV on rank {}", rank, index,
                            ir::op_to_text(plan_.ranks[rank][index]),
                            plan_.ranks[rank][index].peer));
  }
}

}  // namespace tdpipe::sim::detail::engine
