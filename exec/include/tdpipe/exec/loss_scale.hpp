// loss_scale.hpp — fp16 training's loss scaling, per temporal slice (TD-Pipe's TDScaler):
// the emulated half-precision store and the scaler's state machine. Host code, shared by
// the CPU backend, its single-device reference and the tests.
//
// Mixed precision (Micikevicius et al. 2018; PyTorch's GradScaler; Megatron's
// --loss-scale family) keeps activations and gradients in fp16, whose range ends at
// 65504 and whose normal numbers start at 2⁻¹⁴: the loss is multiplied by a scale so
// that small gradients do not flush to zero, gradients are divided by it before the
// optimizer, and a step whose gradients overflowed (inf / NaN) is skipped and the scale
// halved; after `window` steps without overflow it doubles. With temporal slices each
// slice's backward runs with its own scale (its gradients' range differs: a later slice
// attends to more keys), its overflow is detected in its own stores, and its scale moves
// alone; the skip is one decision for the whole step, on every rank.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tdpipe/ir/plan.hpp"
#include "tdpipe/ir/scenario.hpp"

namespace tdpipe::exec {

/// x stored in IEEE binary16 and read back: round to nearest even, subnormals below 2⁻¹⁴,
/// ±inf from 65520 on (the first value that does not round to 65504), NaN kept.
double round_fp16(double x);

/// Rounds `n` values in place through fp16; true when any of them is (or became) inf or
/// NaN.
bool store_fp16(double* values, std::int64_t n);

struct LossScaleConfig {
  bool dynamic = true;
  double initial = 65536;  ///< the dynamic scale to start from; the static scale
  int window = 1000;       ///< steps without overflow before a slice's scale doubles
  double min = 1;          ///< a dynamic scale is never halved below this
  /// From parallel.loss_scale (0: dynamic), initial_loss_scale, loss_scale_window and
  /// min_loss_scale.
  static LossScaleConfig from_scenario(const ir::ParallelConfig& parallel);
};

/// What the scaler carries from step to step (and a run's TrainState to the next run).
struct LossScaleState {
  std::vector<double> scales;  ///< per slice, for the next step
  std::vector<int> good;       ///< per slice: steps in a row without its overflow
  int skipped = 0;             ///< steps skipped so far (the optimizer did not step)
  friend bool operator==(const LossScaleState&, const LossScaleState&) = default;
};

/// One step as the scaler saw it.
struct LossScaleStep {
  std::vector<double> scales;           ///< the per-slice scales the step ran with
  std::vector<std::uint8_t> overflow;   ///< per slice, agreed over every rank
  bool skipped = false;
  friend bool operator==(const LossScaleStep&, const LossScaleStep&) = default;
};

class LossScaler {
 public:
  LossScaler(const LossScaleConfig& config, int slices);
  int slices() const { return static_cast<int>(state_.scales.size()); }
  double scale(int slice) const;
  const std::vector<double>& scales() const { return state_.scales; }
  /// After a step, with the overflow flags every rank agreed on (one per slice): records
  /// the step, moves the scales, and returns true when the step is to be skipped.
  bool update(const std::vector<std::uint8_t>& overflow);
  const LossScaleStep& last_step() const { return last_; }
  /// update() calls since construction (one per step on every rank).
  int updates() const { return updates_; }
  const LossScaleState& state() const { return state_; }
  /// Continues from `state` (a run's TrainState); throws tdpipe::Error when it holds
  /// another number of slices or a scale that is not positive.
  void set_state(const LossScaleState& state);

 private:
  LossScaleConfig config_;
  LossScaleState state_;
  LossScaleStep last_;
  int updates_ = 0;
};

/// A rank's scaler for `plan` (one scale per temporal slice): none unless model.dtype is
/// fp16. Throws tdpipe::Error for fp16 with 1-bit Adam over replicas, which is not built.
std::optional<LossScaler> make_loss_scaler(const ir::Plan& plan, int slices);

/// "65536,32768" — per-slice values as trace metadata and CLI output print them.
std::string scales_text(const std::vector<double>& scales);

}  // namespace tdpipe::exec
