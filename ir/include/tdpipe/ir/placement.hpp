// placement.hpp — which GPU runs what, the one placement every part of tdpipe uses (the
// cost model's GPU per rank, the analytic engine's links, the SimGrid engine, faults):
// tensor-parallel group inside a node, pipeline ranks on consecutive TP groups,
// data-parallel replicas after them (Megatron's order):
//   gpu = replica · (p · t) + stage · t + tp_rank,   node = gpu / gpus_per_node
// so with t = 8 on 8-GPU nodes each pipeline rank is one node, and a DP ring for
// (stage, tp_rank) links the same GPU slot of nodes p apart.
#pragma once

namespace tdpipe::ir {

struct Placement {
  int tensor = 1;    ///< t
  int pipeline = 1;  ///< p
  int data = 1;      ///< d

  int gpus() const { return tensor * pipeline * data; }
  int gpu(int replica, int stage, int tp_rank) const {
    return (replica * pipeline + stage) * tensor + tp_rank;
  }
  int replica_of(int gpu) const { return gpu / (pipeline * tensor); }
  int stage_of(int gpu) const { return (gpu / tensor) % pipeline; }
  int tp_rank_of(int gpu) const { return gpu % tensor; }
  /// The node a GPU is in.
  static long node_of(long gpu, int gpus_per_node) { return gpu / (gpus_per_node > 0 ? gpus_per_node : 1); }
  /// The node (replica, stage)'s TP group is in; −1 when it straddles two nodes.
  long group_node(int replica, int stage, int gpus_per_node) const {
    const long first = (static_cast<long>(replica) * pipeline + stage) * tensor;
    const int per = gpus_per_node > 0 ? gpus_per_node : 1;
    if (first % per + tensor > per) return -1;
    return first / per;
  }
};

}  // namespace tdpipe::ir
