// engine_collectives.cpp — the SimGrid engine's data-parallel collectives: ring and tree all-reduce, reduce-scatter, all-gather and 1-bit Adam's exchange, full or reduced (one replica and its mirror) (the Model: engine_model.hpp).
#include "engine_model.hpp"

namespace tdpipe::sim::detail::engine {

void Model::run_collective(int gi, int op) {
  GpuRun& g = gpus_[gi];
  const ir::Op& o = plan_.ranks[g.stage][op];
  const int n = place_.data;
  if (n <= 1) return;
  const double bytes = synthetic_ ? 0.0 : static_cast<double>(o.bytes);
  // 1-bit Adam: the compression kernels first (the op's est_seconds), then the all-to-all
  // of the packed message's segments — one round: (n − 1)/n of it leaves through this
  // member's link at once — and their ring all-gather, n − 1 steps of 1/n: a ring
  // all-reduce's volume in n latencies instead of 2(n − 1).
  const bool compressed = o.kind == OpKind::COMPRESSED_ALLREDUCE;
  const double kernels = ranks_[g.stage].seconds[static_cast<std::size_t>(op)];
  if (compressed && kernels > 0 && !synthetic_) sg4::this_actor::sleep_for(kernels * g.slow);
  const int steps = compressed ? n : o.kind == OpKind::ALLREDUCE ? 2 * (n - 1) : n - 1;
  // Bytes of ring step s (every step 1/n of the buffer, but the all-to-all's).
  auto step_bytes = [&](int s) { return compressed && s == 0 ? (n - 1) * bytes / n : bytes / n; };
  const double volume = compressed ? 2.0 * (n - 1) * bytes / n : steps * bytes / n;
  const double alpha = g.ring_alpha, beta = g.ring_beta;
  bool tree = false;
  if (o.kind == OpKind::ALLREDUCE) {
    if (opt_.collective == CollectiveAlgorithm::Tree) tree = true;
    else if (opt_.collective == CollectiveAlgorithm::Auto)
      tree = tree_allreduce_seconds(bytes, n, alpha, beta) < ring_allreduce_seconds(bytes, n, alpha, beta);
  }
  if (collective_.empty()) collective_ = tree ? "tree" : "ring";
  if (synthetic_) {  // latency only, as the analytic engine charges it
    couple_start(gi, op);
    const int hops = tree ? 2 * static_cast<int>(std::ceil(std::log2(n))) : steps;
    if (hops > 0 && alpha > 0) sg4::this_actor::sleep_for(hops * alpha);
    couple_end(gi, op);
    return;
  }
  if (tree) {
    // Double binary tree: 2·⌈log2 n⌉ latency-bound hops, 2·S through the NIC (reduce + broadcast).
    const int depth = static_cast<int>(std::ceil(std::log2(n)));
    sg4::Host *from, *to;
    if (reduced_) {
      from = g.mirror_src;
      to = g.mirror;
    } else {
      const GpuRun& next = gpus_[sim_index((g.replica + 1) % n, g.stage, g.tp)];
      const bool local = synthetic_ || same_node(g.gpu, next.gpu);
      from = local ? g.compute_host : g.nic_host;
      to = local ? next.compute_host : next.nic_host;
    }
    couple_start(gi, op);
    if (2 * depth > 1) sg4::this_actor::sleep_for((2 * depth - 1) * alpha);
    ++flows_;
    sg4::Comm::sendto_async(from, to, 2 * bytes)->wait();
    couple_end(gi, op);
    return;
  }
  if (reduced_) {
    // Replica symmetry: every member's step is the same flow; one flow stands for all
    // (a replica a fault touches has its own, coupled to the others').
    couple_start(gi, op);
    if (opt_.collapse_ring_steps) {
      if (steps > 1) sg4::this_actor::sleep_for((steps - 1) * alpha);
      ++flows_;
      sg4::Comm::sendto_async(g.mirror_src, g.mirror, volume)->wait();
    } else {
      for (int s = 0; s < steps; ++s) {
        ++flows_;
        sg4::Comm::sendto_async(g.mirror_src, g.mirror, step_bytes(s))->wait();
      }
    }
    couple_end(gi, op);
    return;
  }
  // Plain: the real ring. Step s sends to the successor once this member received step s−1.
  const int next_i = sim_index((g.replica + 1) % n, g.stage, g.tp);
  GpuRun& next = gpus_[next_i];
  const bool local = synthetic_ || same_node(g.gpu, next.gpu);
  sg4::Host* from = local ? g.compute_host : g.nic_host;
  sg4::Host* to = local ? next.compute_host : next.nic_host;
  wait_posted(next_i, op);
  for (int s = 0; s < steps; ++s) {
    if (s > 0) wait_recv_steps(gi, op, s);
    ++flows_;
    sg4::Comm::sendto_async(from, to, step_bytes(s))->wait();
    ++next.ops[op].recv_steps;
    notify(next_i);
  }
  wait_recv_steps(gi, op, steps);
}

}  // namespace tdpipe::sim::detail::engine
