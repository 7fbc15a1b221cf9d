// test_loss_scale.cpp — fp16 training with per-slice dynamic loss scaling (issue 14 §4):
// the binary16 store, the scaler's state machine, an injected overflow skipping exactly
// its step on every rank, and fp16 training close to the fp64 run.
#include <cmath>
#include <limits>

#include <catch2/catch.hpp>

#include "exec_test_util.hpp"
#include "tdpipe/exec/loss_scale.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec {
namespace {

using Catch::Matchers::Contains;

// fp16 keeps 11 significant bits (relative rounding 2⁻¹¹ ≈ 4.9e-4 per store); a gradient
// passes a few dozen stores on its way through 8 layers.
constexpr double kGradTolerance = 5e-3;
constexpr double kLossTolerance = 1e-3;

// The small scenario in fp16, with the scaler's settings.
ir::Scenario fp16_scenario(int p, int d, int slices, double initial = 1024, int window = 1000) {
  ir::Scenario sc = test::small_scenario(p, d, 4, 1);
  sc.model.dtype = "fp16";
  sc.parallel.slices = slices;
  sc.parallel.initial_loss_scale = initial;
  sc.parallel.loss_scale_window = window;
  return sc;
}

cpu::RunResult run(const ir::Scenario& sc, const std::string& schedule, int steps,
                   cpu::TrainOptions::OverflowInjection inject = {},
                   const std::optional<cpu::TrainState>& start = std::nullopt) {
  cpu::CpuRunOptions opt;
  opt.train = test::train_options(steps);
  opt.train.inject_overflow = inject;
  opt.start = start;
  opt.keep_step_traces = true;
  return cpu::run_cpu(planner::build_plan(sc, schedule).lowered, opt);
}

}  // namespace

TEST_CASE("round_fp16 is IEEE binary16's round to nearest even, with overflow to inf", "[exec][fp16]") {
  CHECK(round_fp16(1.0) == 1.0);
  CHECK(round_fp16(65504.0) == 65504.0);             // the largest half
  CHECK(round_fp16(65519.99) == 65504.0);            // still rounds down
  CHECK(std::isinf(round_fp16(65520.0)));            // the halfway point rounds to even: inf
  CHECK(std::isinf(round_fp16(-1e6)));
  CHECK(round_fp16(-1e6) < 0);
  CHECK(round_fp16(1.0 + 0x1p-11) == 1.0);           // a tie between 1 and 1 + 2⁻¹⁰: to even
  CHECK(round_fp16(1.0 + 3 * 0x1p-11) == 1.0 + 0x1p-9);  // a tie to the even 1 + 2·2⁻¹⁰
  CHECK(round_fp16(1.0 + 0x1p-11 + 0x1p-30) == 1.0 + 0x1p-10);  // just past the tie: up
  CHECK(round_fp16(0x1p-14) == 0x1p-14);             // the smallest normal
  CHECK(round_fp16(3 * 0x1p-25) == 0x1p-23);         // subnormal spacing 2⁻²⁴: 1.5 ulp → 2 ulp
  CHECK(round_fp16(0x1p-25) == 0.0);                 // half the smallest subnormal: to even, 0
  CHECK(round_fp16(0x1p-25 + 0x1p-40) == 0x1p-24);
  CHECK(std::isnan(round_fp16(std::numeric_limits<double>::quiet_NaN())));
  double v[3] = {1.0, 7e4, 2.0};
  CHECK(store_fp16(v, 3));
  CHECK(std::isinf(v[1]));
  double w[2] = {1.0 / 3, -2.5};
  CHECK_FALSE(store_fp16(w, 2));
  CHECK(w[0] == 0x1.554p-2);  // 1/3 to 11 significant bits
}

TEST_CASE("the loss scaler halves an overflowing slice's scale, skips the step, and doubles after a window",
          "[exec][fp16]") {
  LossScaleConfig c;
  c.initial = 8;
  c.window = 2;
  c.min = 2;
  LossScaler s(c, 3);
  CHECK(s.scales() == std::vector<double>{8, 8, 8});
  CHECK_FALSE(s.update({0, 0, 0}));                   // good 1
  CHECK(s.update({0, 1, 0}));                         // slice 1 overflowed: skip, 8 → 4
  CHECK(s.last_step().scales == std::vector<double>{8, 8, 8});  // what the step ran with
  CHECK(s.scales() == std::vector<double>{8, 4, 8});
  CHECK(s.state().good == std::vector<int>{1, 0, 1});  // a skipped step: no evidence for 0 and 2
  CHECK_FALSE(s.update({0, 0, 0}));                   // slices 0, 2 reach the window: 16
  CHECK(s.scales() == std::vector<double>{16, 4, 16});
  CHECK(s.state().good == std::vector<int>{0, 1, 0});
  CHECK(s.update({0, 1, 1}));
  CHECK(s.update({0, 1, 0}));                         // 4 → 2 → 2: not below min
  CHECK(s.scales() == std::vector<double>{16, 2, 8});
  CHECK(s.state().skipped == 3);
  CHECK_THROWS_WITH(s.update({0, 0}), Contains("2 overflow flags for 3 slices"));

  LossScaleConfig fixed;
  fixed.dynamic = false;
  fixed.initial = 128;
  LossScaler st(fixed, 1);
  CHECK(st.update({1}));  // a static scale still skips the overflowing step
  CHECK_FALSE(st.update({0}));
  CHECK(st.scales() == std::vector<double>{128});
  CHECK(st.state().skipped == 1);
  CHECK_THROWS_WITH(st.set_state({{128, 1}, {0, 0}, 0}), Contains("2 scales and 2 counters for a plan of 1 slices"));
}

TEST_CASE("fp16 with dynamic loss scaling trains within fp16 tolerance of the fp64 run, and of one device",
          "[exec][fp16]") {
  for (const auto& [schedule, slices] : std::vector<std::pair<std::string, int>>{{"1f1b", 1}, {"zb-h1", 1},
                                                                                 {"interleaved", 1}, {"tdpipe", 2}}) {
    SECTION(schedule + " S=" + std::to_string(slices)) {
      const ir::Scenario sc = fp16_scenario(2, 1, slices);
      ir::Scenario wide = sc;
      wide.model.dtype = "fp32";  // the executor's fp64
      // One step: the gradients (unscaled). Not the weights: Adam's normalised update
      // (≈ ±lr for any gradient well above eps) turns the fp16 error of a near-zero
      // gradient into a whole step, and the weights after one step differ by 4–6 %
      // (worst tensor; lr 1e-2 against weights of ~0.02).
      const cpu::RunResult half = run(sc, schedule, 1);
      const cpu::RunResult full = run(wide, schedule, 1);
      REQUIRE(half.loss_scale.size() == 1);
      CHECK_FALSE(half.loss_scale[0].skipped);
      CHECK(full.loss_scale.empty());
      std::string worst;
      const double err = test::max_rel_error(half.grads, full.grads, &worst);
      INFO("worst tensor " << worst << ": " << err);
      CHECK(err > 0);  // the stores really round
      CHECK(err < kGradTolerance);
      CHECK(half.loss_per_step[0] == Approx(full.loss_per_step[0]).epsilon(1e-3));

      // The single-device reference in fp16 (full sequences, one scale) agrees as closely.
      const cpu::RunResult ref = cpu::run_reference(sc, 1, 4, test::train_options(1));
      REQUIRE(ref.loss_scale.size() == 1);
      CHECK(test::max_rel_error(half.grads, ref.grads, &worst) < kGradTolerance);
      // Ten steps on: the loss curve stays with fp64's.
      const cpu::RunResult half10 = run(sc, schedule, 10), full10 = run(wide, schedule, 10);
      for (int s = 0; s < 10; ++s) {
        INFO("step " << s);
        CHECK_FALSE(half10.loss_scale[static_cast<std::size_t>(s)].skipped);
        CHECK(half10.loss_per_step[s] == Approx(full10.loss_per_step[s]).epsilon(kLossTolerance));
      }
    }
  }
}

TEST_CASE("slices with different loss scales still give fp64's gradients: key/value gradients change scale",
          "[exec][fp16]") {
  // Slice 1's backward pushes key/value gradients back to slice 0's rows at its own scale;
  // slice 0 reads them at its own. With 256 against 4096 a mix-up of the two would be off
  // by 16× in every gradient of slice 0's keys and values.
  for (const auto& all : {std::vector<std::vector<double>>{{256, 4096}, {4096, 256}},
                          std::vector<std::vector<double>>{{256, 4096, 1024, 16384}, {16384, 64, 4096, 256}}}) {
    const int slices = static_cast<int>(all[0].size());
    SECTION("S=" + std::to_string(slices)) {
      const std::string schedule = "tdpipe";
      const ir::Scenario sc = fp16_scenario(2, 1, slices);
      ir::Scenario wide = sc;
      wide.model.dtype = "fp32";
      const cpu::RunResult full = run(wide, schedule, 1);
      const cpu::RunResult start = run(sc, schedule, 0);  // the initial weights, the scaler at 1024
      REQUIRE(start.state.loss_scale.scales.size() == static_cast<std::size_t>(slices));
      for (const std::vector<double>& scales : all) {
        cpu::TrainState from = start.state;
        from.loss_scale.scales = scales;
        const cpu::RunResult got = run(sc, schedule, 1, {}, from);
        REQUIRE(got.loss_scale.size() == 1);
        CHECK(got.loss_scale[0].scales == scales);
        CHECK_FALSE(got.loss_scale[0].skipped);
        std::string worst;
        const double err = test::max_rel_error(got.grads, full.grads, &worst);
        INFO("scales " << scales_text(scales) << ": worst " << worst << " " << err);
        CHECK(err < kGradTolerance);
      }
    }
  }
}

TEST_CASE("without a loss scale fp16 gradients underflow: what the scaler is for", "[exec][fp16]") {
  // Static scale 1: many of the tiny model's gradients fall below fp16's normal range
  // (2⁻¹⁴ ≈ 6.1e-5; the loss gradient alone is ~1/(64·32) per logit) and lose digits;
  // scale 1024 keeps them (measured: 9.5e-3 vs 9.9e-4, the worst tensor's relative error).
  ir::Scenario plain = fp16_scenario(2, 1, 1);
  plain.parallel.loss_scale = 1;
  ir::Scenario wide = plain;
  wide.model.dtype = "fp32";
  const cpu::RunResult full = run(wide, "1f1b", 1);
  std::string worst;
  const double unscaled = test::max_rel_error(run(plain, "1f1b", 1).grads, full.grads, &worst);
  const double scaled = test::max_rel_error(run(fp16_scenario(2, 1, 1), "1f1b", 1).grads, full.grads, &worst);
  INFO("unscaled " << unscaled << ", scaled " << scaled);
  CHECK(scaled < kGradTolerance);
  CHECK(unscaled > 5 * scaled);
}

TEST_CASE("an injected overflow in one slice skips exactly that step on every rank and halves that slice's scale",
          "[exec][fp16]") {
  // p = 2, d = 2, S = 2: world rank 2 (replica 1, pipeline rank 0) overflows in slice 1
  // at step 1. No activation or gradient it stores reaches another pipeline rank, and the
  // data-parallel all-reduce carries its inf to replica 0's rank 0 as a gradient, not as
  // a flag: only the world agreement tells the others, the last stage included.
  for (const std::string schedule : {"tdpipe", "1f1b"}) {
    SECTION(schedule) {
      const ir::Scenario sc = fp16_scenario(2, 2, 2);  // (1F1B runs whole sequences: S = 1)
      const int s = schedule == "tdpipe" ? 1 : 0;
      const cpu::RunResult a = run(sc, schedule, 3, {1, 2, s});
      const bool sliced = schedule == "tdpipe";
      const std::vector<std::uint8_t> flags = sliced ? std::vector<std::uint8_t>{0, 1} : std::vector<std::uint8_t>{1};
      const std::vector<double> before = sliced ? std::vector<double>{1024, 1024} : std::vector<double>{1024};
      const std::vector<double> after = sliced ? std::vector<double>{1024, 512} : std::vector<double>{512};
      REQUIRE(a.loss_scale.size() == 3);
      CHECK_FALSE(a.loss_scale[0].skipped);
      CHECK(a.loss_scale[1].skipped);
      CHECK(a.loss_scale[1].overflow == flags);  // slice 0 only carried slice 1's inf: not charged
      CHECK(a.loss_scale[1].scales == before);
      CHECK(a.loss_scale[2].scales == after);
      CHECK_FALSE(a.loss_scale[2].skipped);
      CHECK(a.state.loss_scale.skipped == 1);
      CHECK(a.replica_divergence == 0.0);
      // The scaler's state is in every step's trace metadata.
      REQUIRE(a.step_traces.size() == 3);
      CHECK(a.step_traces[1].metadata.at("loss_scale") == scales_text(before));
      CHECK(a.step_traces[1].metadata.at("loss_scale_overflow") == (sliced ? "0,1" : "1"));
      CHECK(a.step_traces[1].metadata.at("loss_scale_skipped") == "true");
      CHECK(a.step_traces[1].metadata.at("loss_scale_next") == scales_text(after));
      CHECK(a.step_traces[2].metadata.at("loss_scale_skipped") == "false");
      CHECK(a.trace.metadata.at("loss_scale") == scales_text(after));  // the traced (last) step
      CHECK(a.trace.metadata.at("skipped_steps") == "1");

      // Skipping means no change at all: step 0, then step 2's data and Adam's second
      // step with the halved scale, gives the same weights bit for bit.
      const cpu::RunResult b = run(sc, schedule, 1);
      cpu::TrainState from = b.state;
      from.steps_done = 2;
      from.loss_scale.scales = after;
      // A good step 0 stands for a slice that did not overflow; the overflowing one starts again.
      from.loss_scale.good = sliced ? std::vector<int>{1, 0} : std::vector<int>{0};
      from.loss_scale.skipped = 1;
      const cpu::RunResult c = run(sc, schedule, 1, {}, from);
      CHECK(c.loss_per_step[0] == a.loss_per_step[2]);
      CHECK(c.weights == a.weights);
      CHECK(c.state.m1 == a.state.m1);
      CHECK(c.state.m2 == a.state.m2);
      CHECK(c.state.loss_scale == a.state.loss_scale);
      // Without the skip (no injection), step 1 moves the weights: the check has teeth.
      CHECK_FALSE(run(sc, schedule, 3).weights == a.weights);
    }
  }
}

TEST_CASE("dynamic loss scaling backs off from an overflowing scale and grows after its window", "[exec][fp16]") {
  SECTION("backs off") {
    // 2⁴⁰ overflows the loss gradient at once: each overflowing step halves the slices
    // that overflowed, until the scale fits and training goes on.
    const cpu::RunResult r = run(fp16_scenario(2, 1, 2, 0x1p40), "tdpipe", 40);
    int skipped = 0;
    for (std::size_t k = 0; k < r.loss_scale.size(); ++k) {
      const auto& st = r.loss_scale[k];
      skipped += st.skipped;
      const std::vector<double>& next = k + 1 < r.loss_scale.size() ? r.loss_scale[k + 1].scales : r.state.loss_scale.scales;
      for (std::size_t j = 0; j < 2; ++j) CHECK(next[j] == (st.overflow[j] ? st.scales[j] / 2 : st.scales[j]));
    }
    CHECK(skipped >= 20);  // at least 2⁴⁰ → 2²⁰ for some slice: the loss gradient alone is ~1/64
    CHECK(skipped < 40);
    CHECK_FALSE(r.loss_scale.back().skipped);
    CHECK(r.state.loss_scale.skipped == skipped);
    for (double l : r.loss_per_step) CHECK(std::isfinite(l));
  }
  SECTION("grows") {
    const cpu::RunResult r = run(fp16_scenario(2, 1, 1, 1, 2), "1f1b", 6);
    std::vector<double> used;
    for (const auto& st : r.loss_scale) used.push_back(st.scales.at(0));
    CHECK(used == std::vector<double>{1, 1, 2, 2, 4, 4});
    CHECK(r.state.loss_scale.scales == std::vector<double>{8});
  }
}

TEST_CASE("fp16 loss scaling refuses what it cannot do, naming it", "[exec][fp16]") {
  ir::Scenario sc = fp16_scenario(2, 2, 1);
  sc.parallel.optimizer = "onebit-adam";
  CHECK_THROWS_WITH(run(sc, "1f1b", 1), Contains("onebit-adam is not built"));
  CHECK_THROWS_WITH(run(fp16_scenario(2, 1, 2), "tdpipe", 1, {0, 0, 2}), Contains("injected overflow in slice 2"));
  CHECK_THROWS_WITH(run(fp16_scenario(2, 1, 2), "tdpipe", 2, {5, 0, 0}),
                    Contains("injected overflow at step 5: this run takes steps 0 to 1"));
  CHECK_THROWS_WITH(run(fp16_scenario(2, 1, 2), "tdpipe", 2, {1, 2, 0}),
                    Contains("injected overflow on rank 2: the run has world ranks 0 to 1"));
  ir::Scenario single = fp16_scenario(2, 1, 1);  // 1-bit Adam at d = 1 is Adam: fine in fp16
  single.parallel.optimizer = "onebit-adam";
  CHECK(run(single, "1f1b", 1).loss_scale.size() == 1);
  ir::Scenario wide = fp16_scenario(2, 1, 1);
  wide.model.dtype = "bf16";
  CHECK_THROWS_WITH(run(wide, "1f1b", 1, {0, 0, 0}), Contains("needs fp16 training"));
}

}  // namespace tdpipe::exec
