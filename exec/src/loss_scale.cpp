// loss_scale.cpp — the fp16 store and the per-slice loss scaler.
#include "tdpipe/exec/loss_scale.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec {

double round_fp16(double x) {
  // GCC and Clang convert double → _Float16 in one correctly rounded step (no double
  // rounding through float); the test pins the boundary cases.
  return static_cast<double>(static_cast<_Float16>(x));
}

bool store_fp16(double* values, std::int64_t n) {
  bool bad = false;
  for (std::int64_t i = 0; i < n; ++i) {
    values[i] = round_fp16(values[i]);
    bad |= !std::isfinite(values[i]);
  }
  return bad;
}

LossScaleConfig LossScaleConfig::from_scenario(const ir::ParallelConfig& p) {
  LossScaleConfig c;
  c.dynamic = p.loss_scale <= 0;
  c.initial = c.dynamic ? p.initial_loss_scale : p.loss_scale;
  c.window = p.loss_scale_window;
  c.min = std::min(p.min_loss_scale, c.initial);
  return c;
}

LossScaler::LossScaler(const LossScaleConfig& config, int slices) : config_(config) {
  if (slices < 1) throw Error(fmt::format("loss scaler: {} slices; expected ≥ 1", slices));
  if (!(config.initial > 0) || !(config.min > 0) || config.window < 1)
    throw Error(fmt::format("loss scaler: scale {}, min {}, window {}; expected positive values", config.initial,
                            config.min, config.window));
  state_.scales.assign(static_cast<std::size_t>(slices), config.initial);
  state_.good.assign(static_cast<std::size_t>(slices), 0);
}

double LossScaler::scale(int slice) const {
  if (slice < 0 || slice >= slices())
    throw Error(fmt::format("loss scale of slice {}: the scaler has {} slices", slice, slices()));
  return state_.scales[static_cast<std::size_t>(slice)];
}

bool LossScaler::update(const std::vector<std::uint8_t>& overflow) {
  if (static_cast<int>(overflow.size()) != slices())
    throw Error(fmt::format("loss scaler: {} overflow flags for {} slices", overflow.size(), slices()));
  ++updates_;
  last_ = {state_.scales, overflow, std::any_of(overflow.begin(), overflow.end(), [](auto f) { return f != 0; })};
  if (last_.skipped) ++state_.skipped;
  if (!config_.dynamic) return last_.skipped;
  for (std::size_t j = 0; j < overflow.size(); ++j) {
    double& s = state_.scales[j];
    int& good = state_.good[j];
    if (overflow[j]) {
      s = std::max(config_.min, s / 2);
      good = 0;
    } else if (!last_.skipped && ++good >= config_.window) {
      // A skipped step is no evidence for the slices that did not overflow: their run
      // of good steps neither grows nor ends.
      s *= 2;
      good = 0;
    }
  }
  return last_.skipped;
}

void LossScaler::set_state(const LossScaleState& state) {
  if (state.scales.size() != state_.scales.size() || state.good.size() != state_.good.size())
    throw Error(fmt::format("loss scaler state: {} scales and {} counters for a plan of {} slices",
                            state.scales.size(), state.good.size(), slices()));
  for (double s : state.scales)
    if (!(s > 0) || !std::isfinite(s)) throw Error(fmt::format("loss scaler state: a scale of {}", s));
  if (state.skipped < 0) throw Error(fmt::format("loss scaler state: {} skipped steps", state.skipped));
  state_ = state;
}

std::optional<LossScaler> make_loss_scaler(const ir::Plan& plan, int slices) {
  if (plan.scenario.model.dtype != "fp16") return std::nullopt;
  // 1-bit Adam folds the gradients into the momentum on the dp stream, before OPT knows
  // whether the step overflowed: a skipped step would have moved it already.
  if (plan.scenario.parallel.onebit() && plan.data > 1)
    throw Error("model.dtype: fp16 (loss scaling) with parallel.optimizer: onebit-adam is not built: the "
                "compressed all-reduce updates the momentum before the overflow check could skip the step; "
                "use optimizer: adam, or model.dtype: bf16");
  return LossScaler(LossScaleConfig::from_scenario(plan.scenario.parallel), slices);
}

std::string scales_text(const std::vector<double>& scales) {
  std::string out;
  for (double s : scales) out += fmt::format("{}{}", out.empty() ? "" : ",", s);
  return out;
}

}  // namespace tdpipe::exec
