// placement.hpp — which GPU runs what: tensor-parallel group inside a node, pipeline
// ranks on consecutive TP groups, data-parallel replicas after them (Megatron's order,
// and the one planner's analytic evaluator assumes):
//   gpu = replica · (p · t) + stage · t + tp_rank
// so with t = 8 on 8-GPU nodes each pipeline rank is one node, and a DP ring for
// (stage, tp_rank) links the same GPU slot of nodes p apart.
#pragma once

namespace tdpipe::sim {

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
};

}  // namespace tdpipe::sim
