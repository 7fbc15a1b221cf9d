// test_cost_model.cpp — FLOP counts against Narayanan et al., iteration times against
// Korthikanti et al. 2022 Table 5, GQA / SwiGLU / flash attention closed forms and the
// Llama-2 parameter counts, the slice solver, op costs and memory.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <string>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"
#include "tdpipe/planner/cost_model.hpp"
#include "tdpipe/planner/evaluator.hpp"
#include "tdpipe/planner/stack_fit.hpp"
#include "planner_test_util.hpp"
#include "tdpipe/traces/metrics.hpp"

using namespace tdpipe;
using planner::chunk_cost;
using ir::OpKind;

namespace {

ir::GpuSpec a100() {
  return ir::GpuSpec{"a100-80g", 312e12, 80.0 * (1ull << 30), 2039e9, 300e9};
}

// A Megatron GPT on DGX A100 nodes (HDR InfiniBand, one 200 Gb/s NIC per GPU), with
// Megatron's unfused attention as in its published runs.
ir::Scenario megatron(int hidden, int heads, int layers, int t, int p, int v, int global_batch,
                      int micro_batch, ir::Recompute recompute, bool sp) {
  ir::Scenario sc;
  sc.name = "megatron";
  sc.model = {"gpt", layers, hidden, 4 * hidden, heads, 2048, 51200, "fp16"};
  sc.model.attention = "standard";
  sc.cluster.groups = {{a100(), t * p / 8}};
  sc.cluster.gpus_per_node = 8;
  sc.cluster.ib_bytes_per_second_per_nic = 25e9;
  sc.cluster.nics_per_node = 8;
  sc.cluster.nvlink_latency_seconds = 3.4e-6;  // NCCL's tuner: per NVLink hop
  sc.cluster.ib_latency_seconds = 14e-6;       // and per network hop
  sc.parallel.tensor = t;
  sc.parallel.pipeline = p;
  sc.parallel.chunks = v;
  sc.parallel.global_batch = global_batch;
  sc.parallel.micro_batch = micro_batch;
  sc.parallel.recompute = recompute;
  sc.parallel.sequence_parallel = sp;
  return sc;
}

// Closed form over the cost model: the busiest pipeline rank's per-micro-batch time
// (F + BW of its v chunks plus the two exposed pipeline transfers per chunk over
// InfiniBand) times m + (p−1)/v (the interleaved bubble), plus its optimizer step.
double closed_form_iteration(const ir::Scenario& sc) {
  const int p = sc.parallel.pipeline, v = sc.parallel.chunks, vstages = p * v;
  const int layers = sc.model.layers / vstages, seq = sc.model.seq;
  const int m = sc.parallel.microbatches();
  const ir::GpuSpec gpu = a100();
  const double p2p_bytes = double(sc.parallel.micro_batch) * seq * sc.model.hidden * 2 / sc.parallel.tensor;
  const double p2p = p > 1 ? 2 * (p2p_bytes / sc.cluster.ib_bytes_per_second_per_nic + sc.cluster.ib_latency_seconds) : 0;
  double worst = 0;
  for (int r = 0; r < p; ++r) {
    double per_mb = 0, params = 0;
    for (int c = 0; c < v; ++c) {
      const int vs = c * p + r;  // Megatron's interleaved placement
      per_mb += chunk_cost(sc, gpu, OpKind::F, vs, vstages, layers, seq, 0).seconds +
                chunk_cost(sc, gpu, OpKind::BW, vs, vstages, layers, seq, 0).seconds + p2p;
      params += planner::params_of_chunk(sc, vs, vstages, layers);
    }
    worst = std::max(worst, (m + double(p - 1) / v) * per_mb + planner::optimizer_seconds(sc, gpu, params));
  }
  return worst;
}

// Total FLOPs of one iteration over every GPU of one pipeline (all TP ranks).
double iteration_flops(const ir::Scenario& sc) {
  const int p = sc.parallel.pipeline, v = sc.parallel.chunks, vstages = p * v;
  const int layers = sc.model.layers / vstages;
  double sum = 0;
  for (int vs = 0; vs < vstages; ++vs)
    sum += chunk_cost(sc, a100(), OpKind::F, vs, vstages, layers, sc.model.seq, 0).flops +
           chunk_cost(sc, a100(), OpKind::BW, vs, vstages, layers, sc.model.seq, 0).flops;
  return sum * sc.parallel.microbatches() * sc.parallel.tensor;
}

}  // namespace

TEST_CASE("FLOPs per iteration equal Narayanan et al.'s formulas", "[cost_model]") {
  for (auto recompute : {ir::Recompute::Full, ir::Recompute::None}) {
    for (int t : {1, 8}) {
      const auto sc = megatron(12288, 96, 96, t, 8, 1, 64, 1, recompute, false);
      const double B = 64, s = 2048, l = 96, h = 12288, V = 51200;
      const double expected = recompute == ir::Recompute::Full
          ? 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
          : 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
      CAPTURE(t, int(recompute));
      REQUIRE(iteration_flops(sc) == Approx(expected).epsilon(1e-12));
    }
  }
  // Selective recompute adds exactly the attention core's forward: 4·b·s²·h per layer.
  const auto sel = megatron(6144, 64, 48, 8, 1, 1, 4, 4, ir::Recompute::Selective, true);
  const auto none = megatron(6144, 64, 48, 8, 1, 1, 4, 4, ir::Recompute::None, true);
  REQUIRE(iteration_flops(sel) - iteration_flops(none) ==
          Approx(4.0 * 4 * 2048.0 * 2048 * 6144 * 48).epsilon(1e-9));
}

TEST_CASE("Per-layer split: B ≈ F plus the attention backward, W = the weight GEMMs", "[cost_model]") {
  const auto sc = megatron(4096, 32, 32, 4, 1, 1, 8, 2, ir::Recompute::None, false);
  const double b = 2, s = 2048, h = 4096, t = 4;
  const auto c = planner::layer_cost(sc, a100(), 2048, 0);
  REQUIRE(c.f.flops == Approx(24 * b * s * h * h / t + 4 * b * s * s * h / t));
  REQUIRE(c.b.flops == Approx(24 * b * s * h * h / t + 8 * b * s * s * h / t));
  REQUIRE(c.w.flops == Approx(24 * b * s * h * h / t));
  // A slice of 512 tokens after 1,536: the attention core sees all 2,048 keys.
  const auto sl = planner::layer_cost(sc, a100(), 512, 1536);
  REQUIRE(sl.f.flops == Approx(24 * b * 512 * h * h / t + 4 * b * 512 * 2048 * h / t));
  REQUIRE(sl.w.flops == Approx(24 * b * 512 * h * h / t));
  // Times are positive and W (weight GEMMs only) is cheaper than B.
  REQUIRE(c.f.seconds > 0);
  REQUIRE(c.w.seconds < c.b.seconds);
}

namespace {

// A Llama-2 shape (Touvron et al. 2023; the released configs) on DGX A100 nodes:
// SwiGLU, flash attention, vocab 32000; t·p GPUs.
ir::Scenario llama2(int layers, int hidden, int heads, int kv_heads, int ffn, int t, int p) {
  ir::Scenario sc = megatron(hidden, heads, layers, t, p, 1, 8, 1, ir::Recompute::None, false);
  sc.name = "llama2";
  sc.model.ffn = ffn;
  sc.model.kv_heads = kv_heads;
  sc.model.mlp = "swiglu";
  sc.model.attention = "flash";
  sc.model.vocab = 32000;
  sc.model.seq = 4096;
  sc.model.dtype = "bf16";
  sc.cluster.groups = {{a100(), std::max(1, t * p / 8)}};
  return sc;
}

// Parameters of the whole model: t = 1, summed over the p stages.
double model_params(const ir::Scenario& sc) {
  const int p = sc.parallel.pipeline, layers = sc.model.layers / p;
  double sum = 0;
  for (int vs = 0; vs < p; ++vs) sum += planner::params_of_chunk(sc, vs, p, layers);
  return sum;
}

}  // namespace

TEST_CASE("GQA and SwiGLU: per-layer FLOPs equal the hand formula", "[cost_model][model_shapes]") {
  // Llama-2 70B: 64 query heads share 8 K/V heads (kv = 8·128 = 1024 wide), SwiGLU 28672.
  auto sc = llama2(80, 8192, 64, 8, 28672, 8, 4);
  sc.parallel.micro_batch = 2;
  const double b = 2, s = 4096, h = 8192, kv = 1024, f = 28672, t = 8;
  // Q and projection h² each, K and V h·kv each, gate, up and down h·ffn each.
  const double gemms = 2 * b * s * (2 * h * h + 2 * h * kv + 3 * h * f) / t;
  const double attn = 4 * b * s * s * h / t;  // model FLOPs: unchanged by GQA and by flash
  for (const char* attention : {"flash", "standard"}) {
    sc.model.attention = attention;
    const auto c = planner::layer_cost(sc, a100(), 4096, 0);
    CAPTURE(attention);
    REQUIRE(c.f.flops == gemms + attn);
    REQUIRE(c.b.flops == gemms + 2 * attn);
    REQUIRE(c.w.flops == gemms);
  }
  // GeLU with GQA: two hidden×ffn matrices; SwiGLU without GQA: 4h² + 3h·ffn.
  auto gelu = sc;
  gelu.model.mlp = "gelu";
  REQUIRE(planner::layer_cost(gelu, a100(), 4096, 0).w.flops == 2 * b * s * (2 * h * h + 2 * h * kv + 2 * h * f) / t);
  auto mha = sc;
  mha.model.kv_heads = 0;  // = heads
  REQUIRE(planner::layer_cost(mha, a100(), 4096, 0).w.flops == 2 * b * s * (4 * h * h + 3 * h * f) / t);
  // A slice of 1024 tokens after 3072: the GEMMs see its tokens, attention all 4096 keys.
  const auto sl = planner::layer_cost(sc, a100(), 1024, 3072);
  REQUIRE(sl.f.flops == 2 * b * 1024 * (2 * h * h + 2 * h * kv + 3 * h * f) / t + 4 * b * 1024 * 4096 * h / t);
}

TEST_CASE("Llama-2 parameter counts: 7B 6.74e9 and 70B 68.98e9 within 0.5 %", "[cost_model][model_shapes]") {
  // t = 1, p = 2: the last stage's copy of the word embedding stands for Llama's untied
  // output layer (same size); the learned position table (seq·h) Llama does not have is
  // 0.25 % of 7B at seq 4096.
  const auto l7 = llama2(32, 4096, 32, 32, 11008, 1, 2);
  const auto l70 = llama2(80, 8192, 64, 8, 28672, 1, 2);
  CHECK(model_params(l7) == Approx(6.74e9).epsilon(0.005));
  CHECK(model_params(l70) == Approx(68.98e9).epsilon(0.005));
  // Without GQA the 70B would have 2·(h + 1)·(h − kv) more per layer (K and V weights and
  // biases): 9.4e9 in all.
  auto l70_mha = l70;
  l70_mha.model.kv_heads = 64;
  CHECK(model_params(l70_mha) - model_params(l70) == 80 * 2.0 * (8192 + 1) * (8192 - 1024));
  // Per TP rank, exactly: matrices and column-parallel biases ÷ t, 6h replicated.
  const auto t8 = llama2(80, 8192, 64, 8, 28672, 8, 4);
  const double h = 8192, kv = 1024, f = 28672;
  const double layer = (2 * h * h + 2 * h * kv + 3 * h * f + (h + 2 * kv) + 2 * f) / 8 + 6 * h;
  REQUIRE(planner::params_of_chunk(t8, 1, 4, 20) == 20 * layer);
  REQUIRE(planner::params_of_chunk(t8, 0, 4, 20) == 20 * layer + 32000 * h / 8 + 4096 * h);
  // The shipped scenario is the real Llama-2 70B.
  auto shipped = ir::load_scenario(TDPIPE_SOURCE_DIR "/scenarios/llama2-70b-a100-4x8.yaml");
  REQUIRE(shipped.model.kv_heads == 8);
  REQUIRE(shipped.model.mlp == "swiglu");
  REQUIRE(shipped.model.attention == "flash");
  shipped.parallel.tensor = 1;
  shipped.parallel.pipeline = 2;
  CHECK(model_params(shipped) == Approx(68.98e9).epsilon(0.005));
}

TEST_CASE("Flash vs standard attention: activations differ by exactly the seq-squared terms",
          "[cost_model][model_shapes]") {
  auto flash = llama2(80, 8192, 64, 8, 28672, 8, 4);
  flash.parallel.micro_batch = 2;
  auto standard = flash;
  standard.model.attention = "standard";
  const double b = 2, h = 8192, a = 64, kv = 1024, f = 28672, t = 8, e = 2;
  for (auto [len, prefix] : {std::pair{4096, 0}, std::pair{1024, 3072}}) {
    CAPTURE(len, prefix);
    const double T = b * len, K = double(prefix) + len;
    const double std_bytes = planner::activation_bytes(standard, 1, 4, 20, len, prefix);
    const double flash_bytes = planner::activation_bytes(flash, 1, 4, 20, len, prefix);
    // Softmax output and dropout output (e bytes each) and the dropout mask (1 byte).
    REQUIRE(std_bytes - flash_bytes == Approx(20 * (2 * e + 1) * a * T * K / t).epsilon(1e-12));
    // Flash: Korthikanti's linear terms generalised, per token in 2-byte units: 10h
    // replicated; Q 2h, K and V 2·kv each, projection input 2h, SwiGLU 4·ffn + 2·ffn, ÷ t.
    REQUIRE(flash_bytes == Approx(20 * T * (10 * h + (4 * h + 4 * kv + 6 * f) / t)).epsilon(1e-12));
    auto sp = flash;
    sp.parallel.sequence_parallel = true;
    REQUIRE(planner::activation_bytes(sp, 1, 4, 20, len, prefix) ==
            Approx(20 * T * (14 * h + 4 * kv + 6 * f) / t).epsilon(1e-12));
  }
  // Selective recompute drops exactly what flash never keeps, and costs flash nothing.
  auto std_sel = standard, flash_sel = flash;
  std_sel.parallel.recompute = flash_sel.parallel.recompute = ir::Recompute::Selective;
  REQUIRE(planner::activation_bytes(std_sel, 1, 4, 20, 4096, 0) ==
          Approx(planner::activation_bytes(flash, 1, 4, 20, 4096, 0)).epsilon(1e-12));
  REQUIRE(planner::activation_bytes(flash_sel, 1, 4, 20, 4096, 0) ==
          planner::activation_bytes(flash, 1, 4, 20, 4096, 0));
  const auto c = planner::layer_cost(flash, a100(), 4096, 0), cs = planner::layer_cost(flash_sel, a100(), 4096, 0);
  REQUIRE(cs.b.flops == c.b.flops);
  REQUIRE(cs.b.seconds == c.b.seconds);
}

TEST_CASE("Flash attention time: the causal half at flash_attention of peak - backward 2.5x",
          "[cost_model][model_shapes]") {
  // Everything but the attention core depends on the slice's own tokens only, so moving a
  // slice's prefix isolates the kernel: Δ forward = 4·b·len·Δprefix·h/t / (peak · eff).
  const auto sc = llama2(32, 4096, 32, 32, 11008, 8, 4);
  const double h = 4096, t = 8, len = 4096, eff = planner::default_efficiencies().flash_attention;
  const auto near = planner::layer_cost(sc, a100(), 4096, 8192), far = planner::layer_cost(sc, a100(), 4096, 28672);
  const double df = 4 * len * (28672 - 8192) * h / t / (312e12 * eff);
  REQUIRE(far.f.seconds - near.f.seconds == Approx(df).epsilon(1e-9));
  REQUIRE(far.b.seconds - near.b.seconds == Approx(2.5 * df).epsilon(1e-9));
  REQUIRE(far.w.seconds == Approx(near.w.seconds).epsilon(1e-12));
  // At 32k tokens flash beats Megatron's unfused path (which also streams the scores).
  auto standard = sc;
  standard.model.attention = "standard";
  const auto fl = planner::layer_cost(sc, a100(), 32768, 0), st = planner::layer_cost(standard, a100(), 32768, 0);
  REQUIRE(fl.f.flops == st.f.flops);
  REQUIRE(fl.f.seconds < st.f.seconds);
  REQUIRE(fl.b.seconds < st.b.seconds);
  REQUIRE(eff > 0.5);
  REQUIRE(eff < 0.73);  // FlashAttention-2's range on A100
}

TEST_CASE("GEMM efficiency saturates with size and respects the HBM roofline", "[cost_model]") {
  const double big = planner::gemm_efficiency(8192, 8192, 8192);
  const double mid = planner::gemm_efficiency(2048, 2048, 2048);
  const double small = planner::gemm_efficiency(256, 256, 256);
  REQUIRE(big <= planner::default_efficiencies().gemm_max);
  REQUIRE(big > 0.95 * planner::default_efficiencies().gemm_max);
  REQUIRE(mid < big);
  REQUIRE(small < mid);
  REQUIRE(small < 0.1);
  // A skinny GEMM (k = 16) is memory-bound: its efficiency is the roofline's.
  const double skinny = planner::gemm_efficiency(16384, 16384, 16);
  const double roof = 2.0 * 16384 * 16384 * 16 * 2039e9 * 0.9 / (2.0 * (2 * 16384 * 16 + 16384.0 * 16384) * 312e12);
  REQUIRE(skinny == Approx(roof));
}

TEST_CASE("Korthikanti et al. 2022 Table 5 iteration times within 5%", "[cost_model][published]") {
  struct Run {
    const char* name;
    ir::Scenario sc;
    double measured;
  };
  using R = ir::Recompute;
  // The shipped scenarios (what both engines run) and their SP + selective variants.
  const auto m22 = ir::load_scenario(TDPIPE_SOURCE_DIR "/scenarios/megatron-22b-a100-1x8.yaml");
  const auto m530 = ir::load_scenario(TDPIPE_SOURCE_DIR "/scenarios/turing-530b-a100-35x8.yaml");
  auto sp_selective = [](ir::Scenario sc) {
    sc.parallel.recompute = R::Selective;
    sc.parallel.sequence_parallel = true;
    return sc;
  };
  REQUIRE(m22.parallel.recompute == R::Full);
  REQUIRE(m530.parallel.recompute == R::Full);
  const Run runs[] = {
      {"22B full", m22, 1.42},
      {"22B sp+selective", sp_selective(m22), 1.10},
      {"530B full", m530, 49.05},
      {"530B sp+selective", sp_selective(m530), 37.83},
      // Not required by the issue; same constants (Calculon's validation configs).
      {"175B full", megatron(12288, 96, 96, 8, 8, 3, 64, 1, R::Full, false), 18.13},
      {"175B sp+selective", megatron(12288, 96, 96, 8, 8, 3, 64, 1, R::Selective, true), 13.75},
      {"1T full", megatron(25600, 160, 128, 8, 64, 1, 512, 1, R::Full, false), 94.42},
      {"1T sp+selective", megatron(25600, 160, 128, 8, 64, 1, 512, 1, R::Selective, true), 71.49},
  };
  for (const Run& run : runs) {
    const double predicted = closed_form_iteration(run.sc);
    const double error = predicted / run.measured - 1;
    CAPTURE(run.name, predicted, run.measured, error);
    WARN(run.name << ": predicted " << predicted << " s, measured " << run.measured << " s, error "
                  << 100 * error << " %");
    REQUIRE(std::abs(error) < 0.05);
  }
}

TEST_CASE("Analytic engine on the shipped 22B and 530B scenarios: Table 5 within 5%",
          "[cost_model][published][analytic]") {
  using R = ir::Recompute;
  struct Run {
    const char* file;
    bool sp_selective;
    double measured;
  };
  const Run runs[] = {{"megatron-22b-a100-1x8", false, 1.42}, {"megatron-22b-a100-1x8", true, 1.10},
                      {"turing-530b-a100-35x8", false, 49.05}, {"turing-530b-a100-35x8", true, 37.83}};
  for (const Run& run : runs) {
    auto sc = ir::load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/" + run.file + ".yaml");
    if (run.sp_selective) {
      sc.parallel.recompute = R::Selective;
      sc.parallel.sequence_parallel = true;
    }
    const auto built = planner::build_plan(sc, sc.schedule);
    const auto metrics = traces::compute_metrics(planner::evaluate(built.lowered));
    const double predicted = double(metrics.iteration_ns) * 1e-9;
    const double error = predicted / run.measured - 1;
    CAPTURE(run.file, run.sp_selective, predicted, run.measured);
    WARN(run.file << (run.sp_selective ? " sp+selective" : " full") << " (analytic engine): predicted "
                  << predicted << " s, measured " << run.measured << " s, error " << 100 * error << " %");
    REQUIRE(std::abs(error) < 0.05);
  }
}

TEST_CASE("Slice solver: equal cost given the prefix, exact for a quadratic cost", "[cost_model][slices]") {
  // cost(len, prefix) = c1·len + c2·len·(prefix + len): for S = 2 the cut x solves
  // c2·x² + (2·c1 + c2·s)·x − (c1 + c2·s)·s = 0.
  const double c1 = 3.0, c2 = 0.01;
  const int s = 1000;
  auto cost = [&](double len, double prefix) { return c1 * len + c2 * len * (prefix + len); };
  const double qb = 2 * c1 + c2 * s, qc = -(c1 + c2 * s) * s;
  const double x = (-qb + std::sqrt(qb * qb - 4 * c2 * qc)) / (2 * c2);
  const int cut = int(std::lround(x));
  REQUIRE(planner::solve_slices_by(s, 2, cost) == std::vector<int>{cut, s - cut});
  REQUIRE(cut > s / 2);  // later tokens are dearer, so the later slice is shorter

  // Linear cost: equal lengths.
  REQUIRE(planner::solve_slices_by(12, 4, [](double len, double) { return len; }) ==
          std::vector<int>{3, 3, 3, 3});
  REQUIRE(planner::solve_slices_by(7, 1, cost) == std::vector<int>{7});
  REQUIRE_THROWS_AS(planner::solve_slices_by(3, 4, cost), Error);

  // On a real scenario: sums to seq, non-increasing, costs equal to within one token.
  const auto sc = megatron(12288, 96, 96, 8, 8, 1, 64, 1, ir::Recompute::None, false);
  for (int S : {2, 4, 8}) {
    const auto lens = planner::solve_slices(sc, S);
    REQUIRE(int(lens.size()) == S);
    REQUIRE(std::accumulate(lens.begin(), lens.end(), 0) == 2048);
    for (int j = 1; j < S; ++j) REQUIRE(lens[j] <= lens[j - 1]);
    REQUIRE(lens.front() > lens.back());
    std::vector<double> costs;
    int prefix = 0;
    for (int len : lens) {
      const auto c = planner::layer_cost(sc, a100(), len, prefix);
      costs.push_back(c.f.seconds + c.b.seconds + c.w.seconds);
      prefix += len;
    }
    const auto one_token = planner::layer_cost(sc, a100(), 1, 2047);
    const double tol = 2 * (one_token.f.seconds + one_token.b.seconds + one_token.w.seconds);
    for (double c : costs) REQUIRE(std::abs(c - costs[0]) <= tol + 0.02 * costs[0]);
  }
  REQUIRE(planner::solve_slices(sc, 1) == std::vector<int>{2048});
}

namespace {

// 1F1B compute-only plan for p = 2, m = 2 by hand (no generator needed).
ir::Plan hand_plan(const ir::Scenario& sc, int slices) {
  ir::Plan plan;
  plan.schedule = "1f1b";
  plan.stages = 2;
  plan.microbatches = 2;
  plan.slices = slices;
  plan.stage_of = {{0}, {1}};
  plan.ranks.resize(2);
  auto op = [](OpKind k, int mb, int slice) {
    ir::Op o;
    o.kind = k;
    o.mb = mb;
    o.slice = slice;
    return o;
  };
  for (int r = 0; r < 2; ++r) {
    for (int mb = 0; mb < 2; ++mb)
      for (int j = 0; j < slices; ++j) plan.ranks[r].push_back(op(OpKind::F, mb, j));
    for (int mb = 0; mb < 2; ++mb)
      for (int j = slices - 1; j >= 0; --j) {
        plan.ranks[r].push_back(op(OpKind::B, mb, j));
        plan.ranks[r].push_back(op(OpKind::W, mb, j));
      }
    plan.ranks[r].push_back(op(OpKind::OPT, -1, 0));
  }
  plan.scenario = sc;
  return plan;
}

}  // namespace

TEST_CASE("apply_costs fills op costs, memory balance and slice tokens", "[cost_model]") {
  auto sc = megatron(4096, 32, 8, 2, 2, 1, 4, 2, ir::Recompute::None, false);
  sc.cluster.groups = {{a100(), 1}};
  ir::Plan plan = hand_plan(sc, 1);
  planner::apply_costs(plan, sc);
  REQUIRE(plan.slice_tokens.empty());
  for (int r = 0; r < 2; ++r) {
    double balance = 0;
    for (const auto& op : plan.ranks[r]) {
      balance += op.mem_bytes;
      if (op.kind == OpKind::OPT) {
        REQUIRE(op.est_seconds > 0);
        continue;
      }
      const auto want = chunk_cost(sc, a100(), op.kind, r, 2, 4, 2048, 0);
      REQUIRE(op.est_seconds == Approx(want.seconds));
      REQUIRE(op.flops == Approx(want.flops));
      if (op.kind == OpKind::F) REQUIRE(op.mem_bytes > 0);
      else REQUIRE(op.mem_bytes <= 0);
    }
    REQUIRE(balance == Approx(0).margin(1e-3));
  }
  // Korthikanti: s·b·h·(10 + 24/t + 5·a·s/(h·t)) per layer, plus the last stage's logits.
  const double per_layer = 2048.0 * 2 * 4096 * (10 + 24.0 / 2 + 5.0 * 32 * 2048 / (4096 * 2));
  REQUIRE(plan.ranks[0][0].mem_bytes == Approx(4 * per_layer));
  REQUIRE(plan.ranks[1][0].mem_bytes == Approx(4 * per_layer + 4.0 * 2 * 2048 * (4096 + 51200) / 2));

  // Slices: tokens set by the solver, slice 1 attends to slice 0's keys.
  ir::Plan sliced = hand_plan(sc, 2);
  planner::apply_costs(sliced, sc);
  REQUIRE(sliced.slice_tokens == planner::solve_slices(sc, 2));
  const int len1 = sliced.slice_tokens[1], len0 = sliced.slice_tokens[0];
  REQUIRE(sliced.ranks[0][1].est_seconds ==
          Approx(chunk_cost(sc, a100(), OpKind::F, 0, 2, 4, len1, len0).seconds));

  // Lowering options: activation of a slice ÷ t; gradients of a chunk's parameters.
  const auto lo = planner::lowering_options(sliced, sc);
  REQUIRE(lo.p2p_bytes(sliced.ranks[0][1]) == std::int64_t(2) * len1 * 4096 * 2 / 2);
  REQUIRE(lo.grad_bytes(1, 0) == std::llround(planner::params_of_chunk(sc, 1, 2, 4) * 2));
}

TEST_CASE("Synthetic scenarios take the given times, split by slices", "[cost_model]") {
  ir::Scenario sc;
  sc.synthetic = ir::Synthetic{2, 2, 1, 4e-3, 3e-3, 2e-3, 0, 100};
  ir::Plan plan = hand_plan(sc, 2);
  planner::apply_costs(plan, sc);
  REQUIRE(plan.ranks[0][0].est_seconds == Approx(2e-3));
  REQUIRE(plan.ranks[0][0].mem_bytes == Approx(50));
  REQUIRE(plan.ranks[0][4].kind == OpKind::B);
  REQUIRE(plan.ranks[0][4].est_seconds == Approx(1.5e-3));
  REQUIRE(plan.ranks[0][5].est_seconds == Approx(1e-3));
  const auto mem = planner::memory_per_rank(plan, sc);
  REQUIRE(mem[0].activation_bytes == Approx(200));
  REQUIRE(mem[0].weights_bytes == 0);
  REQUIRE_FALSE(planner::check_fits(mem, sc));
  const auto lo = planner::lowering_options(plan, sc);
  REQUIRE(lo.p2p_bytes(plan.ranks[0][0]) == 0);
}

TEST_CASE("Memory per rank: 16 bytes per parameter plus peak activations - fit message", "[cost_model]") {
  auto sc = megatron(12288, 96, 96, 8, 2, 1, 16, 1, ir::Recompute::Full, false);
  ir::Plan plan = hand_plan(sc, 1);
  plan.stages = 2;
  planner::apply_costs(plan, sc);
  const auto mem = planner::memory_per_rank(plan, sc);
  const double h = 12288;
  const double layer = (4 * h * h + 8 * h * h + 3 * h + 4 * h) / 8 + 6 * h;
  const double p0 = 48 * layer + 51200 * h / 8 + 2048 * h;
  REQUIRE(mem[0].weights_bytes == Approx(2 * p0));
  REQUIRE(mem[0].grads_bytes == Approx(2 * p0));
  REQUIRE(mem[0].optimizer_bytes == Approx(12 * p0));
  // Full recompute keeps the layer inputs of two micro-batches: 2 · 48 · 2·s·b·h.
  REQUIRE(mem[0].activation_bytes == Approx(2 * 48 * 2 * 2048.0 * h));
  // 175B over 16 GPUs needs ~170 GiB each: does not fit an 80 GB A100.
  const auto msg = planner::check_fits(mem, sc);
  REQUIRE(msg);
  CAPTURE(*msg);
  REQUIRE(msg->rfind("does not fit: needs ", 0) == 0);
  REQUIRE(msg->find("GiB of 80.0 GiB on rank") != std::string::npos);
}

TEST_CASE("Memory per rank with parameter offload: the layers' weights and Adam state count two layers",
          "[cost_model][offload]") {
  auto sc = megatron(12288, 96, 96, 8, 2, 1, 16, 1, ir::Recompute::Full, false);
  sc.parallel.param_offload = "layers";
  ir::Plan plan = hand_plan(sc, 1);
  plan.stages = 2;
  planner::apply_costs(plan, sc);
  const auto mem = planner::memory_per_rank(plan, sc);
  const double h = 12288;
  const double layer = (4 * h * h + 8 * h * h + 3 * h + 4 * h) / 8 + 6 * h;
  const double ends = 51200 * h / 8 + 2048 * h;  // embedding + positions: never offloaded
  const double p0 = 48 * layer + ends;
  REQUIRE(mem[0].grads_bytes == Approx(2 * p0));                  // gradients stay whole
  REQUIRE(mem[0].weights_bytes == Approx(2 * (ends + 2 * layer)));  // a window of two layers
  REQUIRE(mem[0].optimizer_bytes == Approx(12 * (ends + 2 * layer)));
  // Lowering streams each layer's bf16 weights: 2 bytes per parameter, over PCIe Gen4.
  const auto lo = planner::lowering_options(plan, sc);
  REQUIRE(lo.offload_blocks);
  const auto blocks = lo.offload_blocks(0, 0);
  REQUIRE(blocks.size() == 48);
  REQUIRE(blocks[0] == std::llround(2 * layer));
  REQUIRE(lo.offload_state_ratio == 6);
  REQUIRE(lo.copy_seconds(0, 25'000'000'000) == Approx(1.0 + planner::kHostCopyLatencySeconds));
  sc.cluster.host_bytes_per_second = 50e9;  // a Gen5 host
  REQUIRE(planner::lowering_options(plan, sc).copy_seconds(0, 25'000'000'000) ==
          Approx(0.5 + planner::kHostCopyLatencySeconds));
}

TEST_CASE("cluster.compute_efficiency divides every compute kernel's time and leaves communication alone",
          "[planner][cost][from-run]") {
  // t = 1: no tensor-parallel collective inside the ops, so F, B, W and OPT scale exactly.
  ir::Scenario sc = megatron(4096, 32, 8, 1, 2, 1, 16, 1, ir::Recompute::None, false);
  sc.cluster.groups = {{a100(), 1}};
  sc.parallel.data = 4;
  const auto one = planner::build_plan(sc, "1f1b").lowered;
  sc.cluster.compute_efficiency = 0.8;
  const auto slow = planner::build_plan(sc, "1f1b").lowered;
  REQUIRE(one.ranks.size() == slow.ranks.size());
  int compute = 0, comm = 0;
  for (std::size_t r = 0; r < one.ranks.size(); ++r)
    for (std::size_t i = 0; i < one.ranks[r].size(); ++i) {
      const ir::Op& a = one.ranks[r][i];
      const ir::Op& b = slow.ranks[r][i];
      if (ir::is_compute(a.kind)) {
        CHECK(b.est_seconds == Approx(a.est_seconds / 0.8).epsilon(1e-12));
        ++compute;
      } else if (a.est_seconds > 0 || a.bytes > 0) {
        CHECK(b.est_seconds == a.est_seconds);  // SEND/RECV, ALLREDUCE
        CHECK(b.bytes == a.bytes);
        ++comm;
      }
    }
  CHECK(compute > 0);
  CHECK(comm > 0);
  // With t = 8 the layer's all-reduces keep their time: less than 1/e slower overall.
  ir::Scenario tp = megatron(8192, 64, 8, 8, 2, 1, 16, 1, ir::Recompute::None, false);
  const double f1 = chunk_cost(tp, a100(), OpKind::F, 0, 2, 4, 2048, 0).seconds;
  tp.cluster.compute_efficiency = 0.5;
  const double f2 = chunk_cost(tp, a100(), OpKind::F, 0, 2, 4, 2048, 0).seconds;
  CHECK(f2 > 1.5 * f1);
  CHECK(f2 < 2 * f1);
}

TEST_CASE("a compute efficiency fitted to one observed iteration reproduces it, and impossible ones are refused",
          "[planner][cost][from-run]") {
  const ir::Scenario sc = megatron(12288, 96, 96, 8, 12, 1, 1536, 1, ir::Recompute::Full, false);
  const planner::StackFit modelled = planner::predict_with_efficiency(sc, "1f1b", 0, 1);
  for (double factor : {0.9, 1.0, 1.25}) {
    const double observed = factor * modelled.fitted_seconds;
    const planner::StackFit fit = planner::fit_compute_efficiency(sc, "1f1b", 0, observed);
    INFO("observed " << observed << " efficiency " << fit.efficiency);
    CHECK(fit.fitted_seconds == Approx(observed).epsilon(1e-5));
    CHECK(fit.modelled_seconds == modelled.fitted_seconds);
    // Communication keeps its time, so compute must change by more than the iteration.
    if (factor > 1) CHECK(fit.efficiency < 1 / factor);
    if (factor == 1.0) CHECK(fit.efficiency == Approx(1).epsilon(1e-5));
    if (factor < 1) CHECK(fit.efficiency > 1 / factor);
    CHECK(fit.fitted_mfu == Approx(modelled.fitted_mfu / factor).epsilon(1e-5));
  }
  CHECK_THROWS_WITH(planner::fit_compute_efficiency(sc, "1f1b", 0, 0.01 * modelled.fitted_seconds),
                    Catch::Contains("communication and bubbles alone take longer"));
  CHECK_THROWS_WITH(planner::fit_compute_efficiency(sc, "1f1b", 0, 1000 * modelled.fitted_seconds),
                    Catch::Contains("longer than tdpipe predicts with compute at 0.01"));
  CHECK_THROWS_WITH(planner::fit_compute_efficiency(sc, "1f1b", 0, -1), Catch::Contains("expected a positive"));
  const ir::Scenario synthetic = ir::load_scenario(planner::test::scenario_path("synthetic-uniform-p4-m8.yaml"));
  CHECK_THROWS_WITH(planner::fit_compute_efficiency(synthetic, "1f1b", 0, 1.0), Catch::Contains("synthetic scenario"));
}

TEST_CASE("tp_comm_overlap: each sequence-parallel collective hides behind its GEMM but for one of t chunks",
          "[planner][cost]") {
  // GPT-3 175B's layer at t = 8 with sequence parallelism: every GEMM outlasts its 50 MB
  // all-gather / reduce-scatter over NVLink, so each exposes exactly 1/t of itself.
  ir::Scenario sc = megatron(12288, 96, 8, 8, 1, 1, 8, 1, ir::Recompute::None, true);
  const double bytes = 2048.0 * 12288 * 2;
  const double ag = planner::tp_collective_seconds(sc, a100(), OpKind::ALL_GATHER, bytes, 8);
  const double rs = planner::tp_collective_seconds(sc, a100(), OpKind::REDUCE_SCATTER, bytes, 8);
  auto layer = [&](bool overlap) {
    sc.parallel.tp_comm_overlap = overlap;
    return planner::layer_cost(sc, a100(), 2048, 0);
  };
  const planner::LayerCost plain = layer(false), hidden = layer(true);
  CHECK(hidden.f.seconds == Approx(plain.f.seconds - (2 * ag + 2 * rs) * (1 - 1.0 / 8)).epsilon(1e-12));
  CHECK(hidden.b.seconds == Approx(plain.b.seconds - (2 * ag + 2 * rs) * (1 - 1.0 / 8)).epsilon(1e-12));
  CHECK(hidden.w.seconds == Approx(plain.w.seconds - 2 * ag * (1 - 1.0 / 8)).epsilon(1e-12));
  CHECK(hidden.f.flops == plain.f.flops);
  // A collective longer than its GEMM (a slow link) exposes the difference plus a chunk.
  sc.cluster.nvlink_bytes_per_second = 1e9;
  const double slow_ag = planner::tp_collective_seconds(sc, a100(), OpKind::ALL_GATHER, bytes, 8);
  const double slow_rs = planner::tp_collective_seconds(sc, a100(), OpKind::REDUCE_SCATTER, bytes, 8);
  const planner::LayerCost slow_plain = layer(false), slow_hidden = layer(true);
  CHECK(slow_hidden.f.seconds < slow_plain.f.seconds);
  CHECK(slow_hidden.f.seconds > slow_plain.f.seconds - (2 * slow_ag + 2 * slow_rs) * (1 - 1.0 / 8));
  // Without tensor parallelism there is nothing to overlap.
  ir::Scenario one = megatron(4096, 32, 8, 1, 2, 1, 16, 1, ir::Recompute::None, false);
  one.parallel.tp_comm_overlap = true;
  CHECK(planner::layer_cost(one, a100(), 2048, 0).f.seconds ==
        planner::layer_cost(megatron(4096, 32, 8, 1, 2, 1, 16, 1, ir::Recompute::None, false), a100(), 2048, 0).f.seconds);
}
