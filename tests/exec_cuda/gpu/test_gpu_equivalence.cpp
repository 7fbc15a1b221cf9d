// test_gpu_equivalence.cpp — the CUDA backend trains like the CPU backend: same
// loss and gradients for 1f1b, zb-h1 and tdpipe S=4 on 4 stages over the loopback
// transport (and 1f1b with 2 data-parallel replicas, and tdpipe S=2 on stages of 3 and
// 1 layers), within bf16 tolerances.
//
// Tolerances. The CPU model is fp64; the GPU rounds every GEMM input to bf16
// (8 significant bits: unit roundoff u = 2⁻⁸ ≈ 3.9e-3, each rounding ≤ u/2) and
// accumulates in fp32 (error ≪ u). Roundings are independent, so a tensor's
// relative L2 error grows like √k·u/2 for k roundings in series: a gradient of the
// first layer passes through ~10 GEMM inputs of the 4-layer model forward and back,
// giving ≈ √10 · 2e-3 ≈ 6e-3; we allow 3e-2 (5×). The loss is a mean over
// 8 × 64 tokens whose per-token errors (~u/2 relative on the logits) average out:
// expected ≈ 1e-3 relative; we allow 1e-2. After Adam steps (lr 1e-3) the weights
// differ by at most lr per element where a tiny gradient flips sign; the loss of
// later steps stays within the same 1e-2.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "../../recovery_test_util.hpp"
#include "gpu_test_util.hpp"
#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/exec/cuda/run.hpp"
#include "tdpipe/planner/build_plan.hpp"

using namespace tdpipe;
using namespace tdpipe::exec;

namespace {
constexpr double kLossTol = 1e-2;
constexpr double kGradTol = 3e-2;

struct Case {
  std::string schedule;
  int slices, p, d, m;
  std::vector<int> layers = {};  // parallel.layers_per_stage; empty: even
  bool bf16_wire = false;        // TrainOptions::bf16_wire on both backends
};

void check_case(const Case& c) {
  ir::Scenario sc = cuda::test::tiny_scenario(c.p, c.d, c.m);
  sc.parallel.layers_per_stage = c.layers;
  const auto built = planner::build_plan(sc, c.schedule, c.slices);
  REQUIRE(built.lowered.lowered);
  if (!c.layers.empty()) REQUIRE(built.lowered.stage_layers == c.layers);

  // Step 0's gradients come from identical weights: a pure precision comparison.
  {
    cpu::CpuRunOptions co;
    co.train = cuda::test::train_options(1);
    co.train.bf16_wire = c.bf16_wire;
    const cpu::RunResult want = cpu::run_cpu(built.lowered, co);
    cuda::CudaRunOptions go;
    go.train = cuda::test::train_options(1);
    go.train.bf16_wire = c.bf16_wire;
    go.transport = cuda::TransportKind::Loopback;
    const cuda::CudaRunResult got = cuda::run_cuda(built.lowered, go);
    REQUIRE(got.run.loss_per_step.size() == 1);
    INFO("loss cuda " << got.run.loss_per_step[0] << " cpu " << want.loss_per_step[0]);
    CHECK(std::abs(got.run.loss_per_step[0] - want.loss_per_step[0]) <= kLossTol * std::abs(want.loss_per_step[0]));
    std::string worst;
    const double err = cuda::test::max_rel_error(got.run.grads, want.grads, &worst);
    INFO("worst gradient " << worst << " relative L2 error " << err);
    CHECK(err <= kGradTol);
    CHECK(got.run.replica_divergence == 0.0);
  }
  // Three Adam steps: the losses stay together.
  {
    cpu::CpuRunOptions co;
    co.train = cuda::test::train_options(3);
    co.train.bf16_wire = c.bf16_wire;
    const cpu::RunResult want = cpu::run_cpu(built.lowered, co);
    cuda::CudaRunOptions go;
    go.train = cuda::test::train_options(3);
    go.train.bf16_wire = c.bf16_wire;
    const cuda::CudaRunResult got = cuda::run_cuda(built.lowered, go);
    REQUIRE(got.run.loss_per_step.size() == 3);
    for (int s = 0; s < 3; ++s) {
      INFO("step " << s << " loss cuda " << got.run.loss_per_step[s] << " cpu " << want.loss_per_step[s]);
      CHECK(std::abs(got.run.loss_per_step[s] - want.loss_per_step[s]) <= kLossTol * std::abs(want.loss_per_step[s]));
    }
    CHECK(got.weights_l2 == Approx(cpu::weights_l2(want.weights)).epsilon(1e-3));
  }
}
}  // namespace

TEST_CASE("CUDA loopback matches the CPU backend: 1f1b, 4 stages", "[gpu][equivalence]") {
  check_case({"1f1b", 1, 4, 1, 8});
}
TEST_CASE("CUDA loopback matches the CPU backend: zb-h1, 4 stages, bf16 activations and gradients between "
          "stages (the CPU rounding them likewise)",
          "[gpu][equivalence][wire]") {
  check_case({"zb-h1", 1, 4, 1, 8, {}, true});
}
TEST_CASE("CUDA loopback matches the CPU backend: tdpipe S=4, 4 stages", "[gpu][equivalence]") {
  check_case({"tdpipe", 4, 4, 1, 8});
}
TEST_CASE("CUDA loopback matches the CPU backend: 1f1b, 2 stages x 2 replicas", "[gpu][equivalence]") {
  check_case({"1f1b", 1, 2, 2, 4});
}
TEST_CASE("CUDA loopback matches the CPU backend: tdpipe S=2, uneven stages of 3 and 1 layers", "[gpu][equivalence]") {
  check_case({"tdpipe", 2, 2, 1, 4, {3, 1}});
}

TEST_CASE("CUDA loopback with a distributed optimizer trains bit-identically to all-reduce: 2 stages x 2 replicas",
          "[gpu][zero1]") {
  // The loopback reduce-scatter sums like its all-reduce (replica order) and the sharded
  // Adam is the same elementwise kernel over parts: every bit equal, weights gathered,
  // gradients and moments assembled from their owners at the end.
  for (const std::string schedule : {"1f1b", "interleaved"}) {
    INFO(schedule);
    ir::Scenario sc = cuda::test::tiny_scenario(2, 2, 4);
    sc.parallel.bucket_mb = 0.004;  // several buckets per chunk
    const ir::Plan plain = planner::build_plan(sc, schedule, 1).lowered;
    sc.parallel.distributed_optimizer = true;
    const ir::Plan sharded = planner::build_plan(sc, schedule, 1).lowered;
    cuda::CudaRunOptions go;
    go.train = cuda::test::train_options(3);
    go.transport = cuda::TransportKind::Loopback;
    const cuda::CudaRunResult want = cuda::run_cuda(plain, go);
    const cuda::CudaRunResult got = cuda::run_cuda(sharded, go);
    REQUIRE(got.run.loss_per_step.size() == 3);
    test::require_identical(got.run, want.run);
    CHECK(got.run.grads == want.run.grads);
    CHECK(got.run.replica_divergence == 0.0);
    int gathers = 0;
    for (const auto& e : got.run.trace.events) gathers += e.kind == ir::OpKind::ALL_GATHER;
    CHECK(gathers > 4);
  }
}

TEST_CASE("CUDA loopback 1-bit Adam: the warm-up is Adam to the bit, then replicas stay identical and train like "
          "the CPU backend's 1-bit run",
          "[gpu][onebit]") {
  ir::Scenario sc = cuda::test::tiny_scenario(2, 2, 4);
  sc.parallel.bucket_mb = 0.004;  // several buckets per chunk
  const ir::Plan adam = planner::build_plan(sc, "1f1b", 1).lowered;
  sc.parallel.optimizer = "onebit-adam";
  sc.parallel.onebit_warmup_steps = 2;
  const ir::Plan onebit = planner::build_plan(sc, "1f1b", 1).lowered;
  cuda::CudaRunOptions go;
  go.transport = cuda::TransportKind::Loopback;
  go.train = cuda::test::train_options(2);
  const cuda::CudaRunResult a = cuda::run_cuda(adam, go);
  const cuda::CudaRunResult w = cuda::run_cuda(onebit, go);
  CHECK(w.run.weights == a.run.weights);
  CHECK(w.run.state.m1 == a.run.state.m1);
  CHECK(w.run.state.m2 == a.run.state.m2);
  go.train = cuda::test::train_options(4);
  const cuda::CudaRunResult got = cuda::run_cuda(onebit, go);
  cpu::CpuRunOptions co;
  co.train = cuda::test::train_options(4);
  const cpu::RunResult want = cpu::run_cpu(onebit, co);
  CHECK(got.run.replica_divergence == 0.0);  // the same decoded momentum everywhere
  CHECK(got.run.state.m2 == w.run.state.m2);  // the variance froze after the warm-up
  REQUIRE(got.run.loss_per_step.size() == 4);
  for (int s = 0; s < 4; ++s) {
    INFO("step " << s << " loss cuda " << got.run.loss_per_step[s] << " cpu " << want.loss_per_step[s]);
    CHECK(std::abs(got.run.loss_per_step[s] - want.loss_per_step[s]) <= kLossTol * std::abs(want.loss_per_step[s]));
  }
  // Sign compression amplifies rounding only where a momentum is near zero (its sign
  // may flip: a difference of one scale there); the weights' norm stays with the CPU's.
  CHECK(got.weights_l2 == Approx(cpu::weights_l2(want.weights)).epsilon(1e-3));
  int compressed = 0;
  for (const auto& e : got.run.trace.events) compressed += e.kind == ir::OpKind::COMPRESSED_ALLREDUCE;
  CHECK(compressed > 4);
}

TEST_CASE("CUDA loopback: a bucket starts while its chunk's last backward still runs, and trains bit-identically "
          "to reducing after it",
          "[gpu][overlap]") {
  // overlap_grad_reduce lets each bucket but a chunk's first parameters start part-way
  // through the chunk's last W/BW (Op::ready_after < 1): CudaCompute marks each part's
  // gradients with an event as it issues them, and the bucket waits for its part's. The
  // loopback sums in replica order either way, so every bit is the same; a bucket that
  // did not wait would reduce unfinished gradients (the emulated GPU's streams run
  // with random delays). Slower devices (rank_speed) widen the window it starts in.
  ir::Scenario sc = cuda::test::tiny_scenario(2, 2, 4);
  sc.parallel.bucket_mb = 0.004;  // several buckets per chunk
  sc.parallel.overlap_grad_reduce = false;
  const ir::Plan after = planner::build_plan(sc, "1f1b", 1).lowered;
  sc.parallel.overlap_grad_reduce = true;
  const ir::Plan overlapped = planner::build_plan(sc, "1f1b", 1).lowered;
  int partial = 0;
  for (const ir::Op& op : overlapped.ranks[0]) partial += op.kind == ir::OpKind::ALLREDUCE && op.ready_after < 1.0f;
  REQUIRE(partial >= 2);
  cuda::CudaRunOptions go;
  go.transport = cuda::TransportKind::Loopback;
  go.train = cuda::test::train_options(2);
  go.train.rank_speed = {0.25, 0.25};
  const cuda::CudaRunResult want = cuda::run_cuda(after, go);
  const cuda::CudaRunResult got = cuda::run_cuda(overlapped, go);
  REQUIRE(got.run.loss_per_step.size() == 2);
  test::require_identical(got.run, want.run);
  CHECK(got.run.grads == want.run.grads);
  CHECK(got.run.replica_divergence == 0.0);
  // ALLREDUCEs that started before their chunk's last gradient op on their rank ended:
  // some in the overlapped run, none in the other. (Stream order: a bucket that waits for
  // the whole op waits for the event CudaCompute::issued records behind the op's end mark;
  // one that waited for its part's mark instead would start on the device while the op
  // still ran — which this caught.)
  std::string seen;  // the early ones, for the report
  auto early = [&seen](const traces::Trace& t) {
    std::map<std::pair<int, int>, std::int64_t> last_grad_end;
    for (const auto& e : t.events)
      if (e.kind == ir::OpKind::W || e.kind == ir::OpKind::BW)
        last_grad_end[{e.rank, e.chunk}] = std::max(last_grad_end[{e.rank, e.chunk}], e.end_ns());
    int n = 0;
    for (const auto& e : t.events)
      if (e.kind == ir::OpKind::ALLREDUCE && e.start_ns < last_grad_end.at({e.rank, e.chunk})) {
        ++n;
        seen += e.name + " on rank " + std::to_string(e.rank) + " starts at " + std::to_string(e.start_ns) +
                " ns, its chunk's last gradient op ends at " + std::to_string(last_grad_end.at({e.rank, e.chunk})) +
                " ns\n";
      }
    return n;
  };
  const int want_early = early(want.run.trace);
  INFO(seen);
  CHECK(want_early == 0);
  CHECK(early(got.run.trace) > 0);
}

TEST_CASE("CUDA loopback parameter offload trains bit-identically, with a device peak of the resident "
          "parameters and a two-block window",
          "[gpu][offload]") {
  // 8 layers on 2 stages: 4 blocks per rank. A block's weights arrive by LOAD on the copy
  // stream (fp32 + the bf16 cast of the same values the resident copy would hold), OPT
  // steps each block's state copy with the same elementwise Adam, and OFFLOAD writes it
  // back: every bit as without offload. Device bytes per parameter: 14 resident (fp32
  // master and two moments, bf16 copy), 6 in a weight copy, 12 in OPT's state copy.
  for (const std::string schedule : {"1f1b", "zb-h1", "interleaved"}) {
    INFO(schedule);
    ir::Scenario sc = cuda::test::tiny_scenario(2, 1, 4);
    sc.model.layers = 8;
    const ir::Plan resident = planner::build_plan(sc, schedule, 1).lowered;
    sc.parallel.param_offload = "layers";
    const ir::Plan streamed = planner::build_plan(sc, schedule, 1).lowered;
    int copies = 0;
    for (const auto& rank : streamed.ranks)
      for (const ir::Op& op : rank) copies += op.kind == ir::OpKind::LOAD || op.kind == ir::OpKind::OFFLOAD;
    REQUIRE(copies > 0);
    cuda::CudaRunOptions go;
    go.transport = cuda::TransportKind::Loopback;
    go.train = cuda::test::train_options(3);
    const cuda::CudaRunResult want = cuda::run_cuda(resident, go);
    const cuda::CudaRunResult got = cuda::run_cuda(streamed, go);
    REQUIRE(got.run.loss_per_step.size() == 3);
    test::require_identical(got.run, want.run);
    CHECK(got.run.grads == want.run.grads);
    // The copies are on the copy stream in the measured trace.
    int traced = 0;
    for (const auto& e : got.run.trace.events)
      if (e.kind == ir::OpKind::LOAD || e.kind == ir::OpKind::OFFLOAD) {
        CHECK(e.stream == static_cast<int>(ir::Stream::Copy));
        ++traced;
      }
    CHECK(traced > 0);
    const cpu::GptConfig cfg = cpu::GptConfig::from_scenario(sc);
    const std::int64_t block = 4LL * cfg.hidden * cfg.hidden + 2LL * cfg.hidden * cfg.ffn + 6LL * cfg.hidden + cfg.ffn;
    REQUIRE(want.run.param_state_peak_bytes.size() == 2);
    REQUIRE(got.run.param_state_peak_bytes.size() == 2);
    for (int r = 0; r < 2; ++r) {
      std::int64_t params = 0;
      for (int stage : resident.stage_of[static_cast<std::size_t>(r)])
        params += cpu::stage_parameter_count(cfg, stage, resident.virtual_stages());
      INFO("rank " << r << " peak " << got.run.param_state_peak_bytes[r] << " of " << want.run.param_state_peak_bytes[r]);
      CHECK(want.run.param_state_peak_bytes[r] == 14 * params);
      const std::int64_t stays = 14 * (params - 4 * block);
      CHECK(got.run.param_state_peak_bytes[r] > stays);
      CHECK(got.run.param_state_peak_bytes[r] <= stays + 2 * 12 * block);
    }
  }
}

TEST_CASE("CUDA re-partitioning mid-training carries weights and Adam state - 2+2 steps equal 4", "[gpu][balance]") {
  // What `tdpipe exec --backend cuda --balance-every` does between segments. Each layer
  // computes the same bf16 GEMMs on the same inputs whichever stage holds it, so the
  // carried run matches the uninterrupted one to fp32 rounding of the loss sum only.
  ir::Scenario sc = cuda::test::tiny_scenario(2, 1, 4);
  const ir::Plan even = planner::build_plan(sc, "1f1b").lowered;
  cuda::CudaRunOptions go;
  go.train = cuda::test::train_options(4);
  const cuda::CudaRunResult whole = cuda::run_cuda(even, go);
  go.train = cuda::test::train_options(2);
  const cuda::CudaRunResult first = cuda::run_cuda(even, go);
  REQUIRE(first.run.state.steps_done == 2);
  REQUIRE(first.run.state.m1.size() == first.run.weights.size());
  REQUIRE(first.run.state.m2.size() == first.run.weights.size());
  sc.parallel.layers_per_stage = {3, 1};
  const ir::Plan moved = planner::build_plan(sc, "zb-h1").lowered;
  REQUIRE(moved.stage_layers == std::vector<int>{3, 1});
  go.start = first.run.state;
  const cuda::CudaRunResult second = cuda::run_cuda(moved, go);
  REQUIRE(second.run.loss_per_step.size() == 2);
  CHECK(second.run.state.steps_done == 4);
  for (int s = 0; s < 4; ++s) {
    const double got = s < 2 ? first.run.loss_per_step[s] : second.run.loss_per_step[s - 2];
    INFO("step " << s << " carried " << got << " whole " << whole.run.loss_per_step[s]);
    CHECK(got == Approx(whole.run.loss_per_step[s]).epsilon(1e-6));
  }
  std::string worst;
  const double err = cuda::test::max_rel_error(second.run.weights, whole.run.weights, &worst);
  INFO("worst weight " << worst << " relative L2 error " << err);
  CHECK(err <= 1e-6);
  // Without the moments (a fresh Adam) the weights would differ: the carry is needed.
  cpu::TrainState no_moments = first.run.state;
  for (auto& [name, v] : no_moments.m1) std::fill(v.begin(), v.end(), 0.0);
  go.start = no_moments;
  CHECK(cuda::test::max_rel_error(cuda::run_cuda(moved, go).run.weights, whole.run.weights, &worst) > 1e-4);
  // A state missing a tensor is refused by name; NCCL processes take no state.
  cpu::TrainState broken = first.run.state;
  broken.m2.erase("block1.wq");
  go.start = broken;
  CHECK_THROWS_WITH(cuda::run_cuda(moved, go), Catch::Contains("block1.wq"));
  go.start = first.run.state;
  go.transport = cuda::TransportKind::Nccl;
  CHECK_THROWS_WITH(cuda::run_cuda(moved, go), Catch::Contains("needs the loopback transport"));
}
