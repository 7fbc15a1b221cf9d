// test_gpu_faults.cpp — faults on the CUDA backend's loopback transport (on a GPU, and
// on the emulated one in CI): a killed rank, a hung rank, a checkpoint write that dies
// and a straggler, each recovered from the last complete checkpoint with the same
// weights, Adam state and losses, bit for bit, as the run without the fault; a run that
// resumes from a checkpoint after its process ended; faults the GPU path refuses.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "../../recovery_test_util.hpp"
#include "gpu_test_util.hpp"
#include "tdpipe/exec/cuda/run.hpp"
#include "tdpipe/exec/faults.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/planner/build_plan.hpp"

using namespace tdpipe;
using namespace tdpipe::exec;
using Catch::Matchers::Contains;

namespace {

using tdpipe::test::TempDir;

using tdpipe::test::require_identical;

}  // namespace

TEST_CASE("CUDA loopback: a killed rank, a hung rank and a failed checkpoint are recovered bit-identically",
          "[gpu][faults]") {
  const ir::Plan plan = planner::build_plan(cuda::test::tiny_scenario(2, 2, 2), "1f1b").lowered;
  cuda::CudaRunOptions o;
  o.train = cuda::test::train_options(4);
  o.watchdog_seconds = 60;
  const cuda::CudaRunResult clean = cuda::run_cuda(plan, o);

  TempDir dir;
  o.faults.checkpoint_dir = dir.path;
  o.faults.checkpoint_every = 1;
  o.faults.heartbeat_period = 0.05;
  o.faults.heartbeat_timeout = 0.5;
  // World rank 3 (replica 1, rank 1) dies in step 1's F1 (steps count from 0) and the
  // run goes back to the checkpoint after 1 step; the one after 2 steps dies half-way,
  // so rank 0's hang in step 2 goes back to the one after 1 step again.
  for (const char* spec : {"kill:rank=3,step=1,op=F1", "ckpt-fail:step=2,rank=2", "hang:rank=0,step=2",
                           "slow:rank=1,factor=2"})
    o.faults.inject.push_back(parse_fault_spec(spec));
  const cuda::CudaRunResult got = cuda::run_cuda(plan, o);
  require_identical(got.run, clean.run);
  CHECK(got.weights_l2 == clean.weights_l2);
  CHECK(got.run.restarts == 2);
  CHECK(got.run.unfired_faults.empty());
  REQUIRE(got.run.faults.size() == 3);
  CHECK(got.run.faults[0].kind == "rank lost");
  CHECK(got.run.faults[0].rank == 3);
  CHECK(got.run.faults[0].restart_from == 1);
  CHECK(got.run.faults[1].kind == "ckpt-fail");
  CHECK(got.run.faults[2].rank == 0);
  CHECK(got.run.faults[2].restart_from == 1);
  CHECK(got.run.faults[2].redone_steps == 1);
  CHECK(got.run.trace.metadata.at("restarts") == "2");
}

TEST_CASE("CUDA loopback with parameter offload and 2 replicas: a killed rank is recovered from a checkpoint "
          "bit-identically",
          "[gpu][faults][offload]") {
  // The checkpoint holds the blocks' state from pinned host memory and the restore puts
  // it back there (download_flat / upload_flat); the gradient buckets start inside the
  // chunk's last backward (overlap_grad_reduce, several buckets a chunk).
  ir::Scenario sc = cuda::test::tiny_scenario(2, 2, 2);
  sc.model.layers = 8;
  sc.parallel.bucket_mb = 0.004;
  const ir::Plan resident = planner::build_plan(sc, "1f1b").lowered;
  sc.parallel.param_offload = "layers";
  const ir::Plan plan = planner::build_plan(sc, "1f1b").lowered;
  cuda::CudaRunOptions o;
  o.train = cuda::test::train_options(3);
  o.watchdog_seconds = 60;
  const cuda::CudaRunResult clean = cuda::run_cuda(plan, o);
  require_identical(clean.run, cuda::run_cuda(resident, o).run);
  CHECK(clean.run.replica_divergence == 0.0);

  TempDir dir;
  o.faults.checkpoint_dir = dir.path;
  o.faults.checkpoint_every = 1;
  o.faults.heartbeat_period = 0.05;
  o.faults.heartbeat_timeout = 0.5;
  o.faults.inject.push_back(parse_fault_spec("kill:rank=1,step=2,op=BW0"));
  const cuda::CudaRunResult got = cuda::run_cuda(plan, o);
  require_identical(got.run, clean.run);
  CHECK(got.run.restarts == 1);
  REQUIRE(got.run.faults.size() == 1);
  CHECK(got.run.faults[0].restart_from == 2);
}

TEST_CASE("CUDA loopback: a run resumes from its checkpoint after the process ended", "[gpu][faults]") {
  const ir::Plan plan = planner::build_plan(cuda::test::tiny_scenario(2, 1, 4), "zb-h1").lowered;
  cuda::CudaRunOptions o;
  o.train = cuda::test::train_options(4);
  const cuda::CudaRunResult clean = cuda::run_cuda(plan, o);

  TempDir dir;
  o.faults.checkpoint_dir = dir.path;
  o.faults.checkpoint_every = 2;
  o.train.steps = 2;  // the first process stops after 2 steps
  const cuda::CudaRunResult part = cuda::run_cuda(plan, o);
  CHECK(part.run.checkpoints_written == 1);
  o.train.steps = 4;
  o.faults.resume = true;
  const cuda::CudaRunResult resumed = cuda::run_cuda(plan, o);
  CHECK(resumed.run.first_step == 2);
  REQUIRE(resumed.run.loss_per_step.size() == 2);
  CHECK(resumed.run.earlier_loss_per_step == part.run.loss_per_step);
  CHECK(resumed.run.weights == clean.run.weights);
  CHECK(resumed.run.state.m1 == clean.run.state.m1);
  CHECK(resumed.run.state.m2 == clean.run.state.m2);
  CHECK(resumed.run.loss_per_step[1] == clean.run.loss_per_step[3]);
}

TEST_CASE("CUDA backend: faults it cannot inject are refused, naming why", "[gpu][faults]") {
  const ir::Plan plan = planner::build_plan(cuda::test::tiny_scenario(2, 1, 2), "1f1b").lowered;
  cuda::CudaRunOptions o;
  o.train = cuda::test::train_options(2);
  o.faults.inject.push_back(parse_fault_spec("drop:rank=0,peer=1,step=1"));
  CHECK_THROWS_WITH(cuda::run_cuda(plan, o), Contains("lost and corrupt messages are the CPU backend's faults"));
  o.faults.inject = {parse_fault_spec("corrupt:rank=1,peer=0,step=1")};
  o.transport = cuda::TransportKind::Nccl;
  CHECK_THROWS_WITH(cuda::run_cuda(plan, o), Contains("NCCL's transports retransmit below it"));
}
