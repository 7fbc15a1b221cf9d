// recovery.cpp — the parts of the shared recovery loop (recovery.hpp) that are not
// templates: checking a faulted or resumed run up front, the run's fingerprint, writing
// a step's checkpoint, giving up.
#include "tdpipe/exec/recovery.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace tdpipe::exec::cpu {
namespace {

// What a checkpoint must share with the run that continues from it.
std::map<std::string, std::string> run_fingerprint(const ir::Plan& plan, const GptConfig& c, const TrainOptions& t,
                                                   const Corpus& corpus) {
  std::string layout;
  for (std::size_t r = 0; r < plan.stage_of.size(); ++r)
    for (int stage : plan.stage_of[r]) {
      const auto [a, b] = stage_layers(c, stage, plan.virtual_stages());
      layout += fmt::format("{}r{}:s{}[{},{})", layout.empty() ? "" : " ", r, stage, a, b);
    }
  const auto& ids = corpus.ids();
  const auto corpus_crc = crc32_of(ids.data(), ids.size() * sizeof(int));
  const auto& par = plan.scenario.parallel;
  return {{"scenario", plan.scenario.name},
          {"schedule", plan.schedule},
          {"layout", fmt::format("p={} d={} m={} v={} S={}", plan.num_ranks(), std::max(1, plan.data),
                                 plan.microbatches, plan.chunks, plan.slices)},
          {"stages", layout},
          {"model", fmt::format("layers={} hidden={} heads={} ffn={} seq={} vocab={} b={} dtype={}", c.layers, c.hidden,
                                c.heads, c.ffn, c.seq, c.vocab, c.micro_batch, plan.scenario.model.dtype)},
          {"optimizer", fmt::format("{} lr={} beta1={} beta2={} eps={} warmup={} distributed={} bucket_mb={}",
                                    par.optimizer, t.adam.lr, t.adam.beta1, t.adam.beta2, t.adam.eps,
                                    par.onebit_warmup_steps, par.distributed_optimizer, par.bucket_mb)},
          {"loss_scale", fmt::format("{} initial={} window={} min={}", par.loss_scale, par.initial_loss_scale,
                                     par.loss_scale_window, par.min_loss_scale)},
          {"seeds", fmt::format("data={} init={}", t.data_seed, t.init_seed)},
          {"corpus", fmt::format("{} tokens, CRC-32 {:08x}", ids.size(), corpus_crc)}};
}

}  // namespace

namespace detail {

// The fp16 loss scaler of one step, as trace metadata.
void add_loss_scale_metadata(traces::Trace& trace, const LossScaleStep& step, const LossScaleState& after) {
  auto& md = trace.metadata;
  md["precision"] = "fp16 (emulated: fp64 arithmetic, activations and gradients stored through binary16)";
  md["loss_scale"] = scales_text(step.scales);
  std::string flags;
  for (auto f : step.overflow) flags += fmt::format("{}{}", flags.empty() ? "" : ",", int(f));
  md["loss_scale_overflow"] = flags;
  md["loss_scale_skipped"] = step.skipped ? "true" : "false";
  md["loss_scale_next"] = scales_text(after.scales);
  md["skipped_steps"] = std::to_string(after.skipped);
}


void write_step_checkpoint(const std::string& dir, CheckpointManifest manifest, std::vector<RankCheckpoint> ranks,
                           int fail_rank, int step, const FaultOptions& fo,
                           const std::map<std::string, std::string>& fingerprint, RunResult& result) {
  try {
    const CheckpointWrite written = write_checkpoint(dir, std::move(manifest), ranks, fail_rank);
    ++result.checkpoints_written;
    result.checkpoint_bytes += written.bytes;
    result.checkpoint_seconds += written.seconds;
    prune_checkpoints(dir, fo.checkpoint_keep);
  } catch (const Error& e) {  // training goes on; the last complete checkpoint stays the one to restart from
    FaultRecord rec{"ckpt-fail", step, fail_rank, e.what()};
    const auto last = latest_checkpoint(dir, fingerprint);
    rec.detail += last ? fmt::format("; the last complete checkpoint is the one after step {}", last->steps_done - 1)
                       : std::string("; there is no complete checkpoint yet");
    result.faults.push_back(std::move(rec));
  }
}

void give_up(const FaultRecord& lost, const RunResult& result, int max_restarts) {
  std::string history;
  for (const auto& f : result.faults)
    if (f.restart_from >= 0) history += fmt::format("\n  step {}: {}", f.step, f.detail);
  throw Error(fmt::format("{}\ngave up after {} restart{} (--max-restarts {}){}", lost.detail, result.restarts,
                          result.restarts == 1 ? "" : "s", max_restarts,
                          history.empty() ? "" : "; earlier faults:" + history));
}

}  // namespace detail

RecoveryStart prepare_recovery(const ir::Plan& plan, const GptConfig& config, const TrainOptions& train,
                               const std::optional<TrainState>& start, const FaultOptions& fo,
                               double watchdog_seconds, const Corpus& corpus) {
  check_fault_options(fo);
  RecoveryStart rs;
  const std::string& dir = fo.checkpoint_dir;
  rs.fingerprint = run_fingerprint(plan, config, train, corpus);
  // Where the run starts: a checkpoint (resume), a given state, or a fresh model.
  if (fo.resume) {
    if (start) throw Error("resume from a checkpoint and a start state: give one of them");
    std::vector<std::string> skipped;
    rs.resumed = latest_checkpoint(dir, rs.fingerprint, &skipped);
    if (!rs.resumed) {
      std::string why;
      for (const auto& s : skipped) why += "\n  " + s;
      throw Error(fmt::format("resume: {} holds no complete checkpoint{}", dir, why.empty() ? "" : ":" + why));
    }
  } else if (!dir.empty() && has_checkpoints(dir)) {
    throw Error(fmt::format("checkpoint folder {} holds another run's checkpoints (step-* folders): resume that run "
                            "(--resume {}) or give an empty folder", dir, dir));
  }
  rs.first = rs.resumed ? rs.resumed->steps_done : start ? start->steps_done : 0;
  // A resumed run goes on to the step count of the run that wrote the checkpoint.
  rs.end = rs.resumed ? train.steps : rs.first + train.steps;
  if (rs.resumed && rs.end < rs.first)
    throw Error(fmt::format("resume: the checkpoint in {} is at step {}, past the {} steps asked for", dir, rs.first,
                            rs.end));
  for (const FaultSpec& f : fo.inject) {
    check_fault_spec(f, plan, rs.first, rs.end);
    if (f.kind == FaultSpec::Kind::CheckpointFail && (fo.checkpoint_every <= 0 || f.step % fo.checkpoint_every != 0))
      throw Error(fmt::format("--inject \"{}\": no checkpoint is written after {} steps (checkpoints every {} steps)",
                              f.text, f.step, fo.checkpoint_every));
  }
  rs.stops_ranks = std::any_of(fo.inject.begin(), fo.inject.end(), [](const FaultSpec& f) {
    return f.kind == FaultSpec::Kind::Kill || f.kind == FaultSpec::Kind::Hang;
  });
  if (rs.stops_ranks && fo.heartbeat_timeout >= watchdog_seconds)
    throw Error(fmt::format("heartbeat timeout {} s is not below the watchdog's {} s: a lost rank would end the run "
                            "as a stall instead of being restarted", fo.heartbeat_timeout, watchdog_seconds));
  if (const double backoffs = fo.retry_timeout * (std::ldexp(1.0, fo.max_retries) - 1);  // (the last failure escalates at once)
      backoffs >= watchdog_seconds)
    throw Error(fmt::format("retry timeout {} s: {} retries wait {:.1f} s in all, not below the watchdog's {} s",
                            fo.retry_timeout, fo.max_retries, backoffs, watchdog_seconds));
  return rs;
}

}  // namespace tdpipe::exec::cpu
