// test_gpu_graphs.cpp — CUDA graphs per op (--cuda-graphs on, exec/cuda/op_graphs.hpp)
// train bit-identically to issuing each kernel, and every op after the first step is a
// replay: the same kernels on the same data, launched from a graph captured once.
//
// Bit-identity is the right bar: a replay runs the kernels the capture recorded, in the
// same order, with the same arguments, on memory at the addresses the capture got. An
// op whose graph read a stale address (a RECV buffer, a micro-batch's ids, another op's
// saved activations) would read NaN on the emulated GPU, or last step's numbers.
#include <catch2/catch.hpp>

#include <string>

#include "../../recovery_test_util.hpp"
#include "gpu_test_util.hpp"
#include "tdpipe/exec/cuda/run.hpp"
#include "tdpipe/planner/build_plan.hpp"

using namespace tdpipe;
using namespace tdpipe::exec;

namespace {

// F, B, BW and W ops of one step over every rank of the plan.
std::int64_t graph_ops(const ir::Plan& plan) {
  std::int64_t n = 0;
  for (const auto& rank : plan.ranks)
    for (const ir::Op& op : rank) n += ir::is_chunk_work(op.kind);
  return n * plan.data;
}

struct Run {
  cuda::CudaRunResult eager, graphed;
};
Run both(const ir::Plan& plan, cuda::CudaRunOptions go) {
  go.transport = cuda::TransportKind::Loopback;
  Run r;
  go.train.cuda_graphs = false;
  r.eager = cuda::run_cuda(plan, go);
  go.train.cuda_graphs = true;
  r.graphed = cuda::run_cuda(plan, go);
  return r;
}

}  // namespace

TEST_CASE("CUDA graphs train bit-identically to issuing each kernel, every op replayed after the first step",
          "[gpu][graphs]") {
  struct Case {
    std::string schedule;
    int slices, p, d, m;
    bool bf16_wire = false;
  };
  for (const Case& c : {Case{"1f1b", 1, 4, 1, 8}, Case{"zb-h1", 1, 4, 1, 8, true}, Case{"tdpipe", 4, 4, 1, 4, true},
                        Case{"interleaved", 1, 2, 2, 4}}) {
    INFO(c.schedule << " S=" << c.slices << " p=" << c.p << " d=" << c.d << " m=" << c.m
                    << (c.bf16_wire ? ", bf16 between stages" : ""));
    ir::Scenario sc = cuda::test::tiny_scenario(c.p, c.d, c.m);
    const ir::Plan plan = planner::build_plan(sc, c.schedule, c.slices).lowered;
    cuda::CudaRunOptions go;
    go.train = cuda::test::train_options(3);
    go.train.bf16_wire = c.bf16_wire;
    const Run r = both(plan, go);
    REQUIRE(r.graphed.run.loss_per_step.size() == 3);
    test::require_identical(r.graphed.run, r.eager.run);
    CHECK(r.graphed.run.grads == r.eager.run.grads);
    CHECK(r.graphed.weights_l2 == r.eager.weights_l2);
    const std::int64_t ops = graph_ops(plan);
    CHECK(r.graphed.graph_captures == ops);
    CHECK(r.graphed.graph_replays == 2 * ops);
    CHECK(r.eager.graph_captures == 0);
  }
}

TEST_CASE("CUDA graphs: a bucket that starts inside the chunk's last backward waits for its part's record node",
          "[gpu][graphs][overlap][simt]") {
  // overlap_grad_reduce on 2 replicas: the chunk's last W marks each part's gradients
  // final with an event; in a graph that is a record node, and the dp thread hears of
  // the part only once the graph is launched. Slower devices widen the window.
  ir::Scenario sc = cuda::test::tiny_scenario(2, 2, 4);
  sc.parallel.bucket_mb = 0.004;  // several buckets per chunk
  sc.parallel.overlap_grad_reduce = true;
  const ir::Plan plan = planner::build_plan(sc, "1f1b", 1).lowered;
  cuda::CudaRunOptions go;
  go.train = cuda::test::train_options(3);
  go.train.rank_speed = {0.25, 0.25};
  const Run r = both(plan, go);
  test::require_identical(r.graphed.run, r.eager.run);
  CHECK(r.graphed.run.grads == r.eager.run.grads);
  CHECK(r.graphed.run.replica_divergence == 0.0);
  CHECK(r.graphed.graph_replays == 2 * graph_ops(plan));
}

TEST_CASE("CUDA graphs with fp16 loss scaling: a step with an injected overflow runs without graphs, a changed "
          "scale is captured again, and training is bit-identical",
          "[gpu][graphs][fp16]") {
  ir::Scenario sc = cuda::test::tiny_scenario(2, 1, 4);
  sc.model.dtype = "fp16";
  const ir::Plan plan = planner::build_plan(sc, "tdpipe", 2).lowered;
  cuda::CudaRunOptions go;
  go.train = cuda::test::train_options(4);
  go.train.inject_overflow = {1, 1, 0};  // step 1, rank 1, slice 0: that step is skipped, its scale halved
  const Run r = both(plan, go);
  REQUIRE(r.graphed.run.loss_per_step.size() == 4);
  test::require_identical(r.graphed.run, r.eager.run);
  CHECK(r.graphed.run.grads == r.eager.run.grads);
  const std::int64_t ops = graph_ops(plan), rank1 = ops / 2;
  // Step 0 captures all; step 1: rank 1 eager, rank 0 replays; step 2: slice 0's scale
  // changed, so every op is captured again (each reads it or follows one that did);
  // step 3 replays all.
  CHECK(r.graphed.graph_captures == 2 * ops);
  CHECK(r.graphed.graph_replays == (ops - rank1) + ops);
}

TEST_CASE("CUDA graphs with parameter offload are refused, saying why", "[gpu][graphs][errors]") {
  ir::Scenario sc = cuda::test::tiny_scenario(2, 1, 4);
  sc.parallel.param_offload = "layers";
  const ir::Plan plan = planner::build_plan(sc, "1f1b", 1).lowered;
  cuda::CudaRunOptions go;
  go.train = cuda::test::train_options(1);
  go.train.cuda_graphs = true;
  go.transport = cuda::TransportKind::Loopback;
  CHECK_THROWS_WITH(cuda::run_cuda(plan, go), Catch::Contains("--cuda-graphs on with parallel.param_offload"));
}
