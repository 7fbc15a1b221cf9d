// sim_test_util.hpp — small scenarios and hand-lowered plans for the simulator tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/ir/scenario.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::sim::testing {

/// DGX A100 nodes, HDR NIC per GPU, NCCL-like latencies; t, p, d as given.
inline ir::Scenario a100_cluster(int nodes, int tensor, int pipeline, int data) {
  ir::Scenario sc;
  sc.name = "test-a100";
  sc.model = {"tiny", 8, 1024, 4096, 16, 1024, 32000, "bf16"};
  sc.cluster.groups = {{ir::gpu_preset("a100-80g"), nodes}};
  sc.cluster.gpus_per_node = 8;
  sc.cluster.nvlink_bytes_per_second = 300e9;
  sc.cluster.ib_bytes_per_second_per_nic = 25e9;
  sc.cluster.nics_per_node = 8;
  sc.cluster.topology = "fat-tree";
  sc.cluster.nvlink_latency_seconds = 3.4e-6;
  sc.cluster.ib_latency_seconds = 14e-6;
  sc.parallel.tensor = tensor;
  sc.parallel.pipeline = pipeline;
  sc.parallel.data = data;
  sc.parallel.micro_batch = 1;
  sc.parallel.global_batch = data;
  return sc;
}

/// GPT-3 175B on DGX A100s (scenarios/gpt3-175b-a100-8x8.yaml), t=8 p=8, d replicas, m=16.
inline ir::Scenario gpt3_dp(int data) {
  auto sc = ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/gpt3-175b-a100-8x8.yaml");
  sc.cluster.groups.front().nodes = 8 * data;
  sc.parallel.data = data;
  sc.parallel.global_batch = 16 * data;  // m = 16
  return sc;
}

inline ir::Plan empty_plan(const ir::Scenario& sc, int stages, int data) {
  ir::Plan plan;
  plan.schedule = "hand";
  plan.stages = stages;
  plan.microbatches = 1;
  plan.data = data;
  plan.lowered = true;
  plan.scenario = sc;
  plan.ranks.resize(stages);
  for (int r = 0; r < stages; ++r) plan.stage_of.push_back({r});
  return plan;
}

inline ir::Op send_op(int peer, std::int64_t bytes, int mb = 0, int batch = -1) {
  ir::Op op;
  op.kind = ir::OpKind::SEND;
  op.payload = ir::OpKind::F;
  op.peer = peer;
  op.mb = mb;
  op.bytes = bytes;
  op.batch = batch;
  op.stream = ir::Stream::P2P;
  return op;
}

inline ir::Op recv_op(int peer, std::int64_t bytes, int mb = 0, int batch = -1) {
  ir::Op op = send_op(peer, bytes, mb, batch);
  op.kind = ir::OpKind::RECV;
  return op;
}

inline ir::Op allreduce_op(std::int64_t bytes, int tag = 0) {
  ir::Op op;
  op.kind = ir::OpKind::ALLREDUCE;
  op.bytes = bytes;
  op.tag = tag;
  op.stream = ir::Stream::DP;
  return op;
}

inline ir::Op compute_op(ir::OpKind kind, int mb, double seconds) {
  ir::Op op;
  op.kind = kind;
  op.mb = mb;
  op.est_seconds = seconds;
  return op;
}

/// The event of (rank, op name); throws if absent.
inline const traces::TraceEvent& event(const traces::Trace& t, int rank, const std::string& name) {
  for (const auto& e : t.events)
    if (e.rank == rank && e.name == name) return e;
  throw std::runtime_error("no event " + name + " on rank " + std::to_string(rank));
}

}  // namespace tdpipe::sim::testing
