// checkpoint.hpp — a run's state on disk, rank by rank, so that a run survives a lost
// rank (restart in-process) and a killed process (`tdpipe exec --resume DIR`).
//
// DIR/step-NNNNNNNN/ holds the checkpoint taken after NNNNNNNN steps: one file per world
// rank (rank-WWWW.ckpt: its weights, Adam moments, 1-bit Adam's error feedback and the
// loss scaler, exactly as the rank holds them), each written atomically (temporary file,
// fsync, rename), then MANIFEST.json naming every file with its size and CRC-32, written
// last and atomically. A folder without a manifest, or whose files do not match it, is
// not a checkpoint. The data loader needs no state of its own: micro-batch (step,
// replica, mb) is drawn from the data seed (cpu/corpus.hpp), so the step count is its
// position; the manifest records the seeds and refuses a run with others.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tdpipe/exec/loss_scale.hpp"

namespace tdpipe::exec {

/// One world rank's state after a step.
struct RankCheckpoint {
  int world_rank = 0;
  /// Named flat arrays ("c0.params", "c0.m1", …) in the rank's order.
  std::vector<std::pair<std::string, std::vector<double>>> arrays;
  LossScaleState loss_scale;  ///< fp16 training's scaler (empty scales: none)
  friend bool operator==(const RankCheckpoint&, const RankCheckpoint&) = default;
};

struct CheckpointManifest {
  int steps_done = 0;
  /// What a run must match to continue from this checkpoint (schedule, layout, model,
  /// seeds, …), field by field.
  std::map<std::string, std::string> run;
  /// Steps first_step … steps_done − 1, as the run measured them: a resumed run reports them too.
  int first_step = 0;
  std::vector<double> loss_per_step, iteration_seconds;
  struct File {
    std::string name;
    std::int64_t bytes = 0;
    std::uint32_t crc = 0;
  };
  std::vector<File> files;  ///< per world rank, in rank order
};

/// DIR/step-NNNNNNNN.
std::string checkpoint_folder(const std::string& dir, int steps_done);

/// What writing a checkpoint cost.
struct CheckpointWrite {
  std::int64_t bytes = 0;
  double seconds = 0;
};

/// Writes the checkpoint `manifest` describes (its files are filled in here) from `ranks`
/// (one per world rank, in order). `fail_rank` ≥ 0 injects a write that dies half-way:
/// that rank's temporary file is left holding half its bytes, no manifest is written, and
/// tdpipe::Error is thrown, as when the process dies or the disk fills mid-write.
CheckpointWrite write_checkpoint(const std::string& dir, CheckpointManifest manifest,
                                 const std::vector<RankCheckpoint>& ranks, int fail_rank = -1);

/// Multi-process runs (NCCL): each process writes its world rank's part and returns its
/// name, size and CRC-32; once every part is written (a barrier that also gathers them),
/// one process finishes the checkpoint: the manifest naming every part
/// (manifest.files, in world-rank order), last. `fail`: as write_checkpoint's fail_rank,
/// for this part.
CheckpointManifest::File write_checkpoint_part(const std::string& dir, int steps_done, const RankCheckpoint& rank,
                                               bool fail = false);
void finish_checkpoint(const std::string& dir, const CheckpointManifest& manifest);

/// The complete (CRC-verified) checkpoint after `steps_done` steps, or nullopt; throws
/// tdpipe::Error when it belongs to another run.
std::optional<CheckpointManifest> checkpoint_at(const std::string& dir, int steps_done,
                                                const std::map<std::string, std::string>& run);

/// The newest complete checkpoint in `dir` (manifest readable, every file present with its
/// size and CRC), or none. Incomplete or damaged ones are skipped, each described in
/// `skipped`. Throws tdpipe::Error when that checkpoint belongs to another run (a field of
/// `run` differs or is missing), naming the field and both values.
std::optional<CheckpointManifest> latest_checkpoint(const std::string& dir, const std::map<std::string, std::string>& run,
                                                    std::vector<std::string>* skipped = nullptr);

/// World rank `rank`'s state from the checkpoint `manifest` (of `dir`); throws
/// tdpipe::Error naming the file when it is missing, cut short or corrupt.
RankCheckpoint read_rank_checkpoint(const std::string& dir, const CheckpointManifest& manifest, int rank);

/// Keeps the newest `keep` complete checkpoints of `dir` and removes older folders
/// (complete or not); folders newer than the newest complete one are left alone.
void prune_checkpoints(const std::string& dir, int keep);

/// Whether `dir` holds any step-* folder (a run that would mix with another's).
bool has_checkpoints(const std::string& dir);

}  // namespace tdpipe::exec
