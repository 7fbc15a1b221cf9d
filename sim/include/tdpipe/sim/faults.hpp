// faults.hpp — faults in the simulator: `tdpipe sim … --inject SPEC`.
//
//   slow:rank=G,factor=F        GPU G computes F× slower (a straggler: thermal throttling,
//                               a bad HBM stack). TP collectives inside every layer make
//                               its whole TP group run at its pace, so the engine slows
//                               the group's compute (the wire is not slowed).
//   link:node=N,factor=F[,nic=J] node N's NICs (or NIC J alone) run at F × their
//                               bandwidth, both directions (a degraded port: a link
//                               trained down, FEC errors). F in (0, 1].
//   fail:rank=G,at=T            GPU G is lost T (10s, 5min, 2h) after the run started:
//                               the run stops, the loss is detected, the job restarts
//                               from its last complete checkpoint on a spare and redoes
//                               the iterations since (failure_timeline).
//
// G is a GPU index in Megatron's placement (placement.hpp):
// (replica · p + stage) · t + tp rank.
//
// The engine keeps replica symmetry where the faults leave it: in Reduced fidelity it
// simulates one healthy replica standing for all healthy ones plus every replica a
// fault touches, each exactly, with their DP collectives coupled (a ring starts when
// its last member posts and ends when its slowest member's flow ends).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tdpipe/ir/scenario.hpp"
#include "tdpipe/ir/placement.hpp"
#include "tdpipe/sim/platform.hpp"

namespace tdpipe::sim {

struct SimFault {
  enum class Kind { Slow, Link, Fail };
  Kind kind = Kind::Slow;
  std::string text;       ///< the spec as given
  int rank = -1;          ///< slow, fail: GPU index
  int node = -1;          ///< link
  int nic = -1;           ///< link: one NIC of the node; −1: all of them
  double factor = 1;      ///< slow: times slower (> 1); link: bandwidth multiplier (0, 1]
  double at_seconds = 0;  ///< fail: wall time since the run started
};

const char* to_string(SimFault::Kind kind);

/// Parses one spec; throws tdpipe::Error naming the spec and the key.
SimFault parse_sim_fault(std::string_view text);

/// Checks faults against the layout and the platform: a GPU, node or NIC outside the
/// cluster the plan uses is an Error naming the spec and the valid range.
void check_sim_faults(const std::vector<SimFault>& faults, const ir::Placement& placement,
                      const PlatformSpec& platform);

/// Replicas the slow and link faults touch (sorted): their symmetry is broken.
std::vector<int> affected_replicas(const std::vector<SimFault>& faults, const ir::Placement& placement,
                                   const PlatformSpec& platform);

/// One line per fault saying what it is in this layout ("GPU 3 = replica 0, stage 0,
/// TP rank 3: its TP group computes 1.5× slower").
std::string describe_sim_fault(const SimFault& fault, const ir::Placement& placement, const PlatformSpec& platform);

/// Checkpoint-restart accounting for fail faults.
struct FailureOptions {
  int checkpoint_every = 0;        ///< iterations between checkpoints (> 0)
  double checkpoint_seconds = 0;   ///< writing one checkpoint (blocks the run)
  double detect_seconds = 0;       ///< failure → the job knows (heartbeat / NCCL timeout)
  double restart_seconds = 0;      ///< relaunch, re-init communicators, load the checkpoint
  int steps = 0;                   ///< iterations in the run; 0: up to the last failed iteration, redone
};

struct FailureEvent {
  std::string text;                ///< the spec
  double at_seconds = 0;
  bool fired = false;              ///< false: the run is over (or not started) by then
  std::int64_t iteration = 0;      ///< the iteration it interrupts (1-based), in the run's progress
  std::int64_t restart_from = 0;   ///< iterations kept: the last complete checkpoint
  double lost_seconds = 0;         ///< work since that checkpoint, thrown away
  double resume_at_seconds = 0;    ///< the run goes on: at + detect + restart
};

struct FailureTimeline {
  std::int64_t steps = 0;
  double iteration_seconds = 0;
  double no_failure_seconds = 0;   ///< steps iterations and their checkpoint writes
  double total_seconds = 0;        ///< with the failures
  double lost_seconds = 0;         ///< total − fault-free
  double mean_iteration_seconds = 0;  ///< total / steps
  double goodput = 0;              ///< steps · iteration / total
  std::int64_t checkpoints = 0;    ///< written in the fault-free run
  std::vector<FailureEvent> events;   ///< in time order
};

/// The run of `steps` iterations of `iteration_seconds` each, a checkpoint written
/// after every `checkpoint_every`-th (taking checkpoint_seconds), with the fail faults
/// in `faults` happening at their times. A failure throws away the work since the last
/// complete checkpoint (a checkpoint cut short by it is not complete); the run goes on
/// detect + restart seconds later from that checkpoint. A failure during a restart
/// starts the restart over. Throws tdpipe::Error for checkpoint_every < 1 or negative
/// times.
FailureTimeline failure_timeline(double iteration_seconds, const std::vector<SimFault>& faults,
                                 const FailureOptions& options);

}  // namespace tdpipe::sim
