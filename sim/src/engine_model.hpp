// engine_model.hpp — internal to the SimGrid engine: the Model (one simulation of a
// lowered plan) that engine*.cpp define by concept — plan analysis (engine_plan.cpp),
// platform and fabric (engine_platform.cpp), actors and their synchronisation
// (engine_actors.cpp), DP collectives (engine_collectives.cpp), the run (engine.cpp).
//
// The model: platform zones from a PlatformSpec, one actor per (simulated GPU, stream)
// interpreting the lowered plan, SEND/RECV and collectives as flows over the modelled
// links.
//
// Zones. A star zone per node holds its GPUs' compute hosts ("g<gpu>") with an NVLink
// up and down link each (NVSwitch). A star zone per leaf switch holds the GPUs' NIC
// endpoints ("n<gpu>") with their NIC's up and down links; leaves hang off the root star
// zone (the spine) through one aggregated up and down link. A transfer between GPUs of
// one node goes g→g, between nodes n→n. Reduced fidelity adds a mirror host per rank
// ("m<gpu>") standing for its DP ring neighbour: the path to it uses the rank's own up
// links and, by replica symmetry, its own down links.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>
#include <simgrid/plugins/load.h>
#include <simgrid/s4u.hpp>
#include <xbt/log.h>

#include "engine.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/sim/faults.hpp"
#include "tdpipe/ir/placement.hpp"

namespace tdpipe::sim::detail::engine {

namespace sg4 = simgrid::s4u;
using ir::OpKind;

constexpr double kInfiniteBandwidth = 1e18;  // synthetic scenarios: latency only

inline double quantise_ns(double seconds) { return static_cast<double>(std::llround(seconds * 1e9)) * 1e-9; }
inline std::int64_t to_ns(double seconds) { return std::llround(seconds * 1e9); }

/// Per pipeline rank, shared by every GPU that runs it.
struct RankInfo {
  std::vector<int> stream_ops[ir::kStreamCount];
  std::vector<std::vector<int>> local_deps;
  std::vector<std::vector<int>> gates;  ///< compute ops: the LOADs gating their segments (ir::is_weight_gate)
  std::vector<std::vector<ir::OpRef>> remote_deps;
  std::vector<int> match;        ///< SEND/RECV: index of the matching op on the peer rank
  std::vector<double> seconds;   ///< non-comm ops and COMPRESSED_ALLREDUCE kernels: duration, quantised to ns
};

struct OpState {
  double start = -1, end = -1;
  double xfer = -1;  ///< comm ops: when data started to move (both sides posted)
  bool posted = false, done = false;
  int recv_steps = 0;  ///< plain ring collectives: steps received from the predecessor
  bool flowed = false; ///< reduced collectives coupled across replicas: this member's flow ended
  bool arrived = false; ///< plain, t > 1: this TP rank reached the compute op (TP barrier)
  bool ready = false;   ///< reduced collectives coupled across replicas: this member can move data
  int segments = 0;    ///< gated compute ops: segments run so far
};

struct GpuRun {
  int gpu = 0, stage = 0, replica = 0, tp = 0;
  int partial_waiters = 0;  ///< dp actors waiting for a compute op to start (Op::ready_after)
  double slow = 1;          ///< compute takes this many times its planned time (slow faults)
  std::vector<int> coupled; ///< reduced: the same rank in the other simulated replicas
  sg4::Host* compute_host = nullptr;
  sg4::Host* nic_host = nullptr;
  sg4::Host* mirror = nullptr;       ///< reduced: DP ring neighbour stand-in
  sg4::Host* mirror_src = nullptr;   ///< g or n host the mirror is reached from
  double ring_alpha = 0, ring_beta = 0;
  std::vector<OpState> ops;
  sg4::MutexPtr mutex;
  sg4::ConditionVariablePtr cv;
  int waiting[ir::kStreamCount] = {-1, -1, -1, -1};  ///< per stream: op index blocked on (deadlock report)
};

struct PendingComm {
  sg4::CommPtr comm;
  int send_gpu, send_op, recv_gpu, recv_op;
};

class Model {
 public:
  Model(const ir::Plan& plan, const SimOptions& opt, std::function<void(double)> progress)
      : plan_(plan), opt_(opt), progress_(std::move(progress)) {}

  RawResult run();

 private:
  void prepare_ranks();
  void prepare_gpus();
  void build_platform();
  void build_synthetic_platform();
  void build_fabric();
  void spawn_actors();

  int sim_index(int replica, int stage, int tp) const {
    if (reduced_) return slot_of_.at(replica) * plan_.num_ranks() + stage;
    return gpu_index_.at(place_.gpu(replica, stage, tp));
  }
  int peer_index(const GpuRun& g, int stage) const { return sim_index(g.replica, stage, g.tp); }
  bool same_node(int gpu_a, int gpu_b) const {
    return gpu_a / spec_.gpus_per_node == gpu_b / spec_.gpus_per_node;
  }
  int leaf_of(int gpu) const {
    const int node = gpu / spec_.gpus_per_node;
    const int unit = spec_.fat_tree_levels == 1 ? 0 : node / spec_.nodes_per_leaf;
    if (spec_.topology == Topology::FatTree) return unit;
    return unit * spec_.nics_per_node + (gpu % spec_.gpus_per_node) / spec_.gpus_per_nic();
  }

  void wait_op(int gi, int op);
  void wait_posted(int gi, int op);
  void wait_recv_steps(int gi, int op, int steps);
  void wait_flowed(int gi, int op);
  void tp_barrier(int gi, int op);
  void couple_start(int gi, int op);
  void couple_end(int gi, int op);
  void apply_faults();
  double nic_factor(int gpu) const;
  void wait_deps(int gi, int op, int stream);
  void mark_done(int gi, int op, double now);
  void notify(int gi);
  void post(int gi, int op, std::vector<PendingComm>& mine);
  void run_collective(int gi, int op);
  std::string deadlock_report() const;

  void compute_actor(int gi);
  void p2p_actor(int gi);
  void dp_actor(int gi);
  void copy_actor(int gi);

  const ir::Plan& plan_;
  const SimOptions& opt_;
  std::function<void(double)> progress_;
  bool synthetic_ = false;
  bool reduced_ = true;
  PlatformSpec spec_;
  ir::Placement place_;
  double synthetic_latency_ = 0;
  std::vector<RankInfo> ranks_;
  std::vector<GpuRun> gpus_;
  std::unordered_map<int, int> gpu_index_;
  /// Reduced: the replicas simulated (one healthy replica standing for every healthy
  /// one, and each replica a fault touches) and their slot in gpus_.
  std::vector<int> slots_;
  std::unordered_map<int, int> slot_of_;
  /// The pipeline reported: the (replica, TP rank) whose last op ends last — with faults
  /// the one that sets the iteration; without, replica 0, TP rank 0 (all are alike).
  int trace_replica_ = 0, trace_tp_ = 0;
  std::vector<sg4::Link*> links_;
  std::int64_t total_ops_ = 0, done_ops_ = 0, next_progress_ = 0;
  std::int64_t actors_ = 0, flows_ = 0;
  std::string collective_;
  bool deadlocked_ = false;
  std::string deadlock_message_;
};

}  // namespace tdpipe::sim::detail::engine
