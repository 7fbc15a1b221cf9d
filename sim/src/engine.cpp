// engine.cpp — the SimGrid model: platform zones from a PlatformSpec, one actor per
// (simulated GPU, stream) interpreting the lowered plan, SEND/RECV and collectives as
// flows over the modelled links.
//
// Zones. A star zone per node holds its GPUs' compute hosts ("g<gpu>") with an NVLink
// up and down link each (NVSwitch). A star zone per leaf switch holds the GPUs' NIC
// endpoints ("n<gpu>") with their NIC's up and down links; leaves hang off the root star
// zone (the spine) through one aggregated up and down link. A transfer between GPUs of
// one node goes g→g, between nodes n→n. Reduced fidelity adds a mirror host per rank
// ("m<gpu>") standing for its DP ring neighbour: the path to it uses the rank's own up
// links and, by replica symmetry, its own down links.
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
#include "tdpipe/sim/placement.hpp"

namespace tdpipe::sim::detail {
namespace {

namespace sg4 = simgrid::s4u;
using ir::OpKind;

constexpr double kInfiniteBandwidth = 1e18;  // synthetic scenarios: latency only

double quantise_ns(double seconds) { return static_cast<double>(std::llround(seconds * 1e9)) * 1e-9; }
std::int64_t to_ns(double seconds) { return std::llround(seconds * 1e9); }

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
  Placement place_;
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

// ---------------------------------------------------------------------------------
// Plan analysis: streams, implicit dependencies, SEND/RECV matching.

void Model::prepare_ranks() {
  const int p = plan_.num_ranks();
  ranks_.resize(p);
  using MsgKey = std::tuple<int, int, int, int, int, int>;  // src, dst, payload, mb, slice, k
  std::map<MsgKey, std::pair<int, int>> sends;  // → (rank, op)
  std::map<std::tuple<int, int, int, int, int>, int> occurrence;

  for (int r = 0; r < p; ++r) {
    const auto& ops = plan_.ranks[r];
    RankInfo& info = ranks_[r];
    const int n = static_cast<int>(ops.size());
    info.local_deps.assign(n, {});
    info.gates.assign(n, {});
    info.remote_deps.assign(n, {});
    info.match.assign(n, -1);
    info.seconds.assign(n, 0);
    std::vector<int> collectives;
    int last_backward = -1, last_compute = -1;
    for (int i = 0; i < n; ++i) {
      const ir::Op& op = ops[i];
      const int s = static_cast<int>(op.stream);
      if (s < 0 || s >= ir::kStreamCount)
        throw Error(fmt::format("plan rank {} op {} ({}): unknown stream", r, i, ir::op_to_text(op)));
      // Actors know what to do with an op only on its own kind of stream.
      const bool ok = ir::is_p2p(op.kind) ? op.stream == ir::Stream::P2P
                      : ir::is_collective(op.kind) ? op.stream == ir::Stream::DP
                                                   : true;
      if (!ok)
        throw Error(fmt::format("plan rank {} op {} ({}): a {} op cannot run on the {} stream", r, i,
                                ir::op_to_text(op), ir::to_string(op.kind), ir::to_string(op.stream)));
      info.stream_ops[s].push_back(i);
      if (op.kind == OpKind::B || op.kind == OpKind::W || op.kind == OpKind::BW) last_backward = i;
      if (ir::is_compute(op.kind) && op.kind != OpKind::OPT) last_compute = i;
      if (ir::is_collective(op.kind)) collectives.push_back(i);
      // Device time: compute ops', and a compressed all-reduce's kernels before its wire.
      if (!ir::is_p2p(op.kind) && (!ir::is_collective(op.kind) || op.kind == OpKind::COMPRESSED_ALLREDUCE)) {
        std::optional<double> over;
        if (opt_.op_seconds && ir::is_compute(op.kind)) over = opt_.op_seconds(op, r);
        const double sec = over ? *over : op.est_seconds;
        if (!(sec >= 0) || !(sec <= 9e9))  // 9e9 s keeps every time inside int64 ns
          throw Error(fmt::format("plan rank {} op {} ({}): duration {} s; expected a value in [0, 9e9]",
                                  r, i, ir::op_to_text(op), sec));
        info.seconds[i] = quantise_ns(sec);
      }
      for (const ir::OpRef& d : op.deps) {
        if (d.rank < 0 || d.rank >= p || d.index < 0 ||
            d.index >= static_cast<int>(plan_.ranks[d.rank].size()))
          throw Error(fmt::format("plan rank {} op {} ({}): dependency on rank {} op {} does not exist",
                                  r, i, ir::op_to_text(op), d.rank, d.index));
        if (d.rank == r && ir::is_weight_gate(op.kind, ops[static_cast<std::size_t>(d.index)].kind))
          info.gates[i].push_back(d.index);
        else if (d.rank == r) info.local_deps[i].push_back(d.index);
        else info.remote_deps[i].push_back(d);
      }
    }
    for (int i = 0; i < n; ++i) {
      const ir::Op& op = ops[i];
      // Lowering gives compute → RECV and SEND → producer as explicit deps (a RECV
      // carries the sender's chunk, so matching by ids here would be wrong).
      if (ir::is_collective(op.kind)) {
        if (op.deps.empty() && last_backward >= 0) info.local_deps[i].push_back(last_backward);
        if (!opt_.overlap_dp && last_compute >= 0) info.local_deps[i].push_back(last_compute);
      } else if (op.kind == OpKind::OPT) {
        // The reductions before it; a sharded optimizer's ALL_GATHERs come after it.
        for (int j : collectives)
          if (ops[static_cast<std::size_t>(j)].kind != OpKind::ALL_GATHER) info.local_deps[i].push_back(j);
      }
      if (ir::is_p2p(op.kind)) {
        if (op.peer < 0 || op.peer >= p || op.peer == r)
          throw Error(fmt::format("plan rank {} op {} ({}): peer {} is not another rank of 0…{}", r, i,
                                  ir::op_to_text(op), op.peer, p - 1));
        const int src = op.kind == OpKind::SEND ? r : op.peer;
        const int dst = op.kind == OpKind::SEND ? op.peer : r;
        const int k = occurrence[{src * p + dst, op.kind == OpKind::SEND ? 0 : 1,
                                  static_cast<int>(op.payload), op.mb, op.slice}]++;
        if (op.kind == OpKind::SEND)
          sends[{src, dst, static_cast<int>(op.payload), op.mb, op.slice, k}] = {r, i};
      }
    }
  }
  // Match each RECV with the SEND of the same (src, dst, payload, mb, slice, occurrence).
  std::map<std::tuple<int, int, int, int, int>, int> seen;
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < static_cast<int>(plan_.ranks[r].size()); ++i) {
      const ir::Op& op = plan_.ranks[r][i];
      if (op.kind != OpKind::RECV) continue;
      const int k = seen[{op.peer * p + r, static_cast<int>(op.payload), op.mb, op.slice, 0}]++;
      auto it = sends.find({op.peer, r, static_cast<int>(op.payload), op.mb, op.slice, k});
      if (it == sends.end())
        throw Error(fmt::format("plan rank {} op {} ({}): no matching SEND on rank {}", r, i,
                                ir::op_to_text(op), op.peer));
      ranks_[r].match[i] = it->second.second;
      ranks_[it->second.first].match[it->second.second] = i;
      sends.erase(it);
    }
  }
  if (!sends.empty()) {
    const auto& [rank, index] = sends.begin()->second;
    throw Error(fmt::format("plan rank {} op {} ({}): no matching RECV on rank {}", rank, index,
                            ir::op_to_text(plan_.ranks[rank][index]),
                            plan_.ranks[rank][index].peer));
  }
}

// ---------------------------------------------------------------------------------
// Which GPUs are simulated, and the platform.

void Model::prepare_gpus() {
  const int p = plan_.num_ranks();
  place_.pipeline = p;
  place_.data = std::max(plan_.data, 1);
  place_.tensor = synthetic_ ? 1 : std::max(plan_.scenario.parallel.tensor, 1);
  if (!synthetic_ && place_.gpus() > spec_.gpus())
    throw Error(fmt::format("plan needs t·p·d = {}·{}·{} = {} GPUs but cluster '{}' has {} ({} nodes × {})",
                            place_.tensor, p, place_.data, place_.gpus(), spec_.name, spec_.gpus(),
                            spec_.nodes, spec_.gpus_per_node));
  if (!synthetic_ && place_.tensor > spec_.gpus_per_node)
    throw Error(fmt::format("tensor parallel size {} exceeds {} GPUs per node; the simulator keeps a TP "
                            "group inside a node",
                            place_.tensor, spec_.gpus_per_node));
  for (const SimFault& f : opt_.faults)
    if (synthetic_ && f.kind == SimFault::Kind::Link)
      throw Error(fmt::format("--inject \"{}\": a synthetic scenario has no network fabric (only a p2p latency)",
                              f.text));
  check_sim_faults(opt_.faults, place_, spec_);
  const std::vector<int> affected = affected_replicas(opt_.faults, place_, spec_);
  trace_replica_ = affected.empty() ? 0 : affected.front();
  std::vector<int> gpu_ids;
  if (reduced_) {
    // Replica symmetry where the faults leave it: one healthy replica stands for all.
    int healthy = 0;
    while (healthy < place_.data && std::binary_search(affected.begin(), affected.end(), healthy)) ++healthy;
    if (healthy < place_.data) slots_.push_back(healthy);
    slots_.insert(slots_.end(), affected.begin(), affected.end());
    std::sort(slots_.begin(), slots_.end());
    for (std::size_t k = 0; k < slots_.size(); ++k) {
      slot_of_[slots_[k]] = static_cast<int>(k);
      for (int r = 0; r < p; ++r) gpu_ids.push_back(place_.gpu(slots_[k], r, 0));
    }
  } else {
    for (int g = 0; g < place_.gpus(); ++g) gpu_ids.push_back(g);
  }
  gpus_.resize(gpu_ids.size());
  for (std::size_t i = 0; i < gpu_ids.size(); ++i) {
    GpuRun& g = gpus_[i];
    g.gpu = gpu_ids[i];
    g.stage = place_.stage_of(g.gpu);
    g.replica = place_.replica_of(g.gpu);
    g.tp = place_.tp_rank_of(g.gpu);
    g.ops.resize(plan_.ranks[g.stage].size());
    gpu_index_[g.gpu] = static_cast<int>(i);
    total_ops_ += static_cast<std::int64_t>(g.ops.size());
  }
  apply_faults();
}

void Model::apply_faults() {
  for (GpuRun& g : gpus_) {
    // TP collectives in every layer hold the whole group to its slowest member.
    for (const SimFault& f : opt_.faults)
      if (f.kind == SimFault::Kind::Slow && place_.replica_of(f.rank) == g.replica &&
          place_.stage_of(f.rank) == g.stage)
        g.slow = std::max(g.slow, f.factor);
    if (reduced_ && slots_.size() > 1)
      for (int other : slots_)
        if (other != g.replica) g.coupled.push_back(sim_index(other, g.stage, 0));
  }
}

double Model::nic_factor(int gpu) const {
  double factor = 1;
  const int node = gpu / spec_.gpus_per_node, nic = (gpu % spec_.gpus_per_node) / spec_.gpus_per_nic();
  for (const SimFault& f : opt_.faults)
    if (f.kind == SimFault::Kind::Link && f.node == node && (f.nic < 0 || f.nic == nic)) factor *= f.factor;
  return factor;
}

void Model::build_synthetic_platform() {
  auto* zone = sg4::create_star_zone("synthetic");
  for (auto& g : gpus_) {
    g.compute_host = zone->create_host(fmt::format("g{}", g.gpu), 1e9);
    auto* up = zone->create_link(fmt::format("up{}", g.gpu), kInfiniteBandwidth)
                   ->set_latency(synthetic_latency_ / 2);
    auto* down = zone->create_link(fmt::format("down{}", g.gpu), kInfiniteBandwidth)
                     ->set_latency(synthetic_latency_ / 2);
    zone->add_route(g.compute_host->get_netpoint(), nullptr, nullptr, nullptr, {sg4::LinkInRoute(up)}, false);
    zone->add_route(nullptr, g.compute_host->get_netpoint(), nullptr, nullptr, {sg4::LinkInRoute(down)}, false);
    g.ring_alpha = synthetic_latency_;
    g.ring_beta = kInfiniteBandwidth;
    g.mirror_src = g.compute_host;
    g.mirror = g.compute_host;  // unused: synthetic collectives are latency only
  }
  zone->seal();
}

void Model::build_fabric() {
  const PlatformSpec& s = spec_;
  auto* root = sg4::create_star_zone("spine");
  auto link = [&](sg4::NetZone* zone, const std::string& name, double bw, double lat) {
    auto* l = zone->create_link(name, bw)->set_latency(lat);
    links_.push_back(l);
    return l;
  };
  auto up = [](sg4::NetZone* z, sg4::Host* h, sg4::Link* l) {
    z->add_route(h->get_netpoint(), nullptr, nullptr, nullptr, {sg4::LinkInRoute(l)}, false);
  };
  auto down = [](sg4::NetZone* z, sg4::Host* h, sg4::Link* l) {
    z->add_route(nullptr, h->get_netpoint(), nullptr, nullptr, {sg4::LinkInRoute(l)}, false);
  };
  const double nic_bw = reduced_ ? s.nic_bytes_per_second / s.gpus_per_nic() : s.nic_bytes_per_second;

  struct Leaf {
    sg4::NetZone* zone = nullptr;
    sg4::NetZone* mirror_zone = nullptr;
    sg4::Link* up = nullptr;
    sg4::Link* down = nullptr;
  };
  std::map<int, sg4::NetZone*> nodes;
  std::map<int, Leaf> leaves;
  std::map<int, std::pair<sg4::Link*, sg4::Link*>> nics;     // (node·nics + nic) → up, down
  std::vector<sg4::Link*> nvl_down(gpus_.size(), nullptr);
  std::map<int, int> gpus_in_leaf;
  for (const auto& g : gpus_) ++gpus_in_leaf[leaf_of(g.gpu)];

  auto leaf_zone = [&](int id) -> Leaf& {
    Leaf& leaf = leaves[id];
    if (leaf.zone) return leaf;
    leaf.zone = sg4::create_star_zone(fmt::format("leaf{}", id))->set_parent(root);
    auto* gw = leaf.zone->create_router(fmt::format("leaf{}-gw", id));
    if (s.fat_tree_levels >= 2) {
      const int nics_under = s.nodes_per_leaf * (s.topology == Topology::FatTree ? s.nics_per_node : 1);
      const double cap = reduced_ ? gpus_in_leaf[id] * nic_bw / s.oversubscription
                                  : nics_under * s.nic_bytes_per_second / s.oversubscription;
      leaf.up = link(root, fmt::format("leaf{}-up", id), cap, s.ib_switch_hop_latency_seconds);
      leaf.down = link(root, fmt::format("leaf{}-down", id), cap, s.ib_switch_hop_latency_seconds);
      root->add_route(leaf.zone->get_netpoint(), nullptr, gw, nullptr, {sg4::LinkInRoute(leaf.up)}, false);
      root->add_route(nullptr, leaf.zone->get_netpoint(), nullptr, gw, {sg4::LinkInRoute(leaf.down)}, false);
    }
    return leaf;
  };

  for (std::size_t i = 0; i < gpus_.size(); ++i) {
    GpuRun& g = gpus_[i];
    const int node = g.gpu / s.gpus_per_node;
    auto*& nz = nodes[node];
    if (!nz) nz = sg4::create_star_zone(fmt::format("node{}", node))->set_parent(root);
    g.compute_host = nz->create_host(fmt::format("g{}", g.gpu), s.node_gpu[node].peak_flops);
    up(nz, g.compute_host,
       link(nz, fmt::format("nvl{}-up", g.gpu), s.nvlink_bytes_per_second, s.nvlink_latency_seconds / 2));
    nvl_down[i] = link(nz, fmt::format("nvl{}-down", g.gpu), s.nvlink_bytes_per_second, s.nvlink_latency_seconds / 2);
    down(nz, g.compute_host, nvl_down[i]);
    if (s.nodes > 1) {
      Leaf& leaf = leaf_zone(leaf_of(g.gpu));
      const int nic = node * s.nics_per_node + (g.gpu % s.gpus_per_node) / s.gpus_per_nic();
      auto& nl = nics[nic];
      if (!nl.first) {
        // Degraded NICs (link faults). Reduced: the GPU stands for its TP group, whose
        // transfers end with the slowest member's NIC.
        double factor = nic_factor(g.gpu);
        if (reduced_)
          for (int tp = 1; tp < place_.tensor; ++tp)
            factor = std::min(factor, nic_factor(place_.gpu(g.replica, g.stage, tp)));
        nl.first = link(leaf.zone, fmt::format("nic{}-up", nic), factor * nic_bw, s.ib_latency_seconds / 2);
        nl.second = link(leaf.zone, fmt::format("nic{}-down", nic), factor * nic_bw, s.ib_latency_seconds / 2);
      }
      g.nic_host = leaf.zone->create_host(fmt::format("n{}", g.gpu), 1);
      up(leaf.zone, g.nic_host, nl.first);
      down(leaf.zone, g.nic_host, nl.second);
    }
  }

  // Mirrors for reduced DP collectives: placed where the rank's worst ring hop goes.
  if (reduced_ && place_.data > 1) {
    for (std::size_t i = 0; i < gpus_.size(); ++i) {
      GpuRun& g = gpus_[i];
      int cls = 0;  // 0 node-local, 1 same leaf, 2 across the spine
      Route worst;
      for (int k = 0; k < place_.data; ++k) {
        const int a = place_.gpu(k, g.stage, 0), b = place_.gpu((k + 1) % place_.data, g.stage, 0);
        const Route rt = route_between(s, a, b);
        const int c = !rt.inter_node ? 0 : (s.fat_tree_levels >= 2 && leaf_of(a) != leaf_of(b) ? 2 : 1);
        if (c > cls || k == 0) worst = rt;
        cls = std::max(cls, c);
      }
      const int node = g.gpu / s.gpus_per_node;
      const std::string name = fmt::format("m{}", g.gpu);
      if (cls == 0) {
        g.mirror = nodes[node]->create_host(name, 1);
        down(nodes[node], g.mirror, nvl_down[i]);
        g.mirror_src = g.compute_host;
        g.ring_alpha = s.nvlink_latency_seconds;
        g.ring_beta = s.nvlink_bytes_per_second;
      } else {
        const int lid = leaf_of(g.gpu);
        Leaf& leaf = leaf_zone(lid);
        const int nic = node * s.nics_per_node + (g.gpu % s.gpus_per_node) / s.gpus_per_nic();
        sg4::NetZone* zone = leaf.zone;
        g.ring_alpha = s.ib_latency_seconds;
        g.ring_beta = nic_bw;
        if (cls == 2) {
          if (!leaf.mirror_zone) {
            leaf.mirror_zone = sg4::create_star_zone(fmt::format("mleaf{}", lid))->set_parent(root);
            auto* gw = leaf.mirror_zone->create_router(fmt::format("mleaf{}-gw", lid));
            root->add_route(nullptr, leaf.mirror_zone->get_netpoint(), nullptr, gw,
                            {sg4::LinkInRoute(leaf.down)}, false);
          }
          zone = leaf.mirror_zone;
          g.ring_alpha += 2 * s.ib_switch_hop_latency_seconds;
          g.ring_beta = std::min(nic_bw, leaf.up->get_bandwidth());
        }
        g.mirror = zone->create_host(name, 1);
        down(zone, g.mirror, nics[nic].second);
        g.mirror_src = g.nic_host;
      }
    }
  } else if (!reduced_ && place_.data > 1) {
    for (auto& g : gpus_) {
      const Route rt = route_between(s, g.gpu, place_.gpu((g.replica + 1) % place_.data, g.stage, g.tp));
      g.ring_alpha = rt.latency_seconds;
      g.ring_beta = rt.bottleneck_bytes_per_second;
    }
  }
  for (auto& [id, leaf] : leaves) {
    leaf.zone->seal();
    if (leaf.mirror_zone) leaf.mirror_zone->seal();
  }
  for (auto& [id, nz] : nodes) nz->seal();
  root->seal();
}

void Model::build_platform() {
  if (synthetic_) build_synthetic_platform();
  else build_fabric();
}

// ---------------------------------------------------------------------------------
// Synchronisation between actors: per-GPU done flags under one condition variable.

void Model::notify(int gi) {
  GpuRun& g = gpus_[gi];
  std::unique_lock<sg4::Mutex> lock(*g.mutex);
  g.cv->notify_all();
}

void Model::wait_op(int gi, int op) {
  GpuRun& g = gpus_[gi];
  if (g.ops[op].done) return;
  std::unique_lock<sg4::Mutex> lock(*g.mutex);
  while (!g.ops[op].done) g.cv->wait(lock);
}

void Model::wait_posted(int gi, int op) {
  GpuRun& g = gpus_[gi];
  if (g.ops[op].posted) return;
  std::unique_lock<sg4::Mutex> lock(*g.mutex);
  while (!g.ops[op].posted) g.cv->wait(lock);
}

void Model::wait_recv_steps(int gi, int op, int steps) {
  GpuRun& g = gpus_[gi];
  if (g.ops[op].recv_steps >= steps) return;
  std::unique_lock<sg4::Mutex> lock(*g.mutex);
  while (g.ops[op].recv_steps < steps) g.cv->wait(lock);
}

void Model::wait_flowed(int gi, int op) {
  GpuRun& g = gpus_[gi];
  if (g.ops[op].flowed) return;
  std::unique_lock<sg4::Mutex> lock(*g.mutex);
  while (!g.ops[op].flowed) g.cv->wait(lock);
}

// Plain fidelity: the TP collectives inside every layer let no TP rank run an op before
// all of its group reached it (a degraded NIC holds one TP rank's activations back).
void Model::tp_barrier(int gi, int op) {
  GpuRun& g = gpus_[gi];
  if (reduced_ || place_.tensor <= 1 || opt_.faults.empty()) return;  // lanes alike without faults
  g.ops[op].arrived = true;
  notify(gi);
  for (int tp = 0; tp < place_.tensor; ++tp) {
    if (tp == g.tp) continue;
    GpuRun& peer = gpus_[sim_index(g.replica, g.stage, tp)];
    if (peer.ops[op].arrived) continue;
    std::unique_lock<sg4::Mutex> lock(*peer.mutex);
    while (!peer.ops[op].arrived) peer.cv->wait(lock);
  }
}

// A ring's members move in lockstep: the collective starts when its last member posts
// and every member finishes with the slowest one.
void Model::couple_start(int gi, int op) {
  GpuRun& g = gpus_[gi];
  if (g.coupled.empty()) return;
  g.ops[op].ready = true;  // (after a compressed all-reduce's kernels)
  notify(gi);
  for (int c : g.coupled) {
    GpuRun& peer = gpus_[c];
    if (peer.ops[op].ready) continue;
    std::unique_lock<sg4::Mutex> lock(*peer.mutex);
    while (!peer.ops[op].ready) peer.cv->wait(lock);
  }
}

void Model::couple_end(int gi, int op) {
  if (gpus_[gi].coupled.empty()) return;
  gpus_[gi].ops[op].flowed = true;
  notify(gi);
  for (int c : gpus_[gi].coupled) wait_flowed(c, op);
}

void Model::wait_deps(int gi, int op, int stream) {
  GpuRun& g = gpus_[gi];
  g.waiting[stream] = op;
  const RankInfo& info = ranks_[g.stage];
  const ir::Op& o = plan_.ranks[g.stage][op];
  const bool copy = o.stream == ir::Stream::Copy;
  const bool partial = (opt_.overlap_dp || copy) && o.ready_after < 1.0f && !o.deps.empty() &&
                       o.deps.front().rank == g.stage;
  const int first_gates = partial ? static_cast<int>(info.gates[o.deps.front().index].size()) : 0;
  if (partial && first_gates > 0) {
    // A block's release: the end of the gated op's segment ready_after names.
    const int first = o.deps.front().index;
    const int k = ir::gate_segment(o.ready_after, first_gates);
    if (g.ops[first].segments <= k && !g.ops[first].done) {
      std::unique_lock<sg4::Mutex> lock(*g.mutex);
      while (g.ops[first].segments <= k && !g.ops[first].done) g.cv->wait(lock);
    }
  } else if (partial) {
    // A gradient bucket, final part-way through the chunk's last backward op: that far
    // into its planned duration (the compute host runs one op at a time).
    const int first = o.deps.front().index;
    if (!g.ops[first].done) {
      std::unique_lock<sg4::Mutex> lock(*g.mutex);
      ++g.partial_waiters;
      while (g.ops[first].start < 0 && !g.ops[first].done) g.cv->wait(lock);
      --g.partial_waiters;
    }
    const double at = g.ops[first].start + static_cast<double>(o.ready_after) * info.seconds[first] * g.slow;
    if (!g.ops[first].done && at > sg4::Engine::get_clock()) sg4::this_actor::sleep_until(at);
  }
  for (int d : info.local_deps[op]) {
    if (partial && d == o.deps.front().index) continue;  // waited for above
    wait_op(gi, d);
  }
  for (const ir::OpRef& d : info.remote_deps[op]) wait_op(peer_index(g, d.rank), d.index);
}

void Model::mark_done(int gi, int op, double now) {
  GpuRun& g = gpus_[gi];
  g.ops[op].end = now;
  g.ops[op].done = true;
  ++done_ops_;
  if (progress_ && done_ops_ * 100 >= next_progress_ * total_ops_) {
    progress_(static_cast<double>(done_ops_) / static_cast<double>(total_ops_));
    next_progress_ = done_ops_ * 100 / std::max<std::int64_t>(total_ops_, 1) + 1;
  }
  notify(gi);
}

// ---------------------------------------------------------------------------------
// Actors.

void Model::compute_actor(int gi) {
  GpuRun& g = gpus_[gi];
  const RankInfo& info = ranks_[g.stage];
  const double speed = g.compute_host->get_speed() * g.slow;
  for (int op : info.stream_ops[0]) {
    wait_deps(gi, op, 0);
    tp_barrier(gi, op);
    const std::vector<int>& gates = info.gates[op];
    if (gates.empty()) {
      g.ops[op].start = sg4::Engine::get_clock();
      if (g.partial_waiters > 0) notify(gi);  // a bucket may wait for part of this op
      if (info.seconds[op] > 0) sg4::this_actor::execute(info.seconds[op] * speed);
    } else {
      // Parameter offload: segment k runs once its layer block's LOAD is done.
      const int n = static_cast<int>(gates.size());
      for (int k = 0; k < n; ++k) {
        wait_op(gi, gates[static_cast<std::size_t>(k)]);
        if (k == 0) {
          g.ops[op].start = sg4::Engine::get_clock();
          if (g.partial_waiters > 0) notify(gi);
        }
        const double part = info.seconds[op] / n;
        if (part > 0) sg4::this_actor::execute(part * speed);
        ++g.ops[op].segments;
        notify(gi);  // the block used in segment k is released
      }
    }
    mark_done(gi, op, sg4::Engine::get_clock());
  }
  g.waiting[0] = -1;
}

void Model::copy_actor(int gi) {
  // Host ↔ device copies, one at a time on the rank's copy engine, at est_seconds (the
  // cost model's PCIe time: a dedicated link per GPU; shared host uplinks not modelled).
  GpuRun& g = gpus_[gi];
  const RankInfo& info = ranks_[g.stage];
  for (int op : info.stream_ops[3]) {
    wait_deps(gi, op, 3);
    g.ops[op].start = sg4::Engine::get_clock();
    if (info.seconds[op] > 0) sg4::this_actor::sleep_for(info.seconds[op]);
    mark_done(gi, op, sg4::Engine::get_clock());
  }
  g.waiting[3] = -1;
}

void Model::post(int gi, int op, std::vector<PendingComm>& mine) {
  GpuRun& g = gpus_[gi];
  const ir::Op& o = plan_.ranks[g.stage][op];
  g.ops[op].posted = true;
  const int pi = peer_index(g, o.peer);
  const int pj = ranks_[g.stage].match[op];
  // No simcall between the check and the start: actors interleave only at simcalls,
  // so exactly one of the two sides starts the transfer.
  if (!gpus_[pi].ops[pj].posted) return;  // the peer's post starts the transfer
  const bool send = o.kind == OpKind::SEND;
  const int sg = send ? gi : pi, so = send ? op : pj, rg = send ? pi : gi, ro = send ? pj : op;
  const ir::Op& s_op = plan_.ranks[gpus_[sg].stage][so];
  double bytes = synthetic_ ? 0.0 : static_cast<double>(s_op.bytes);
  if (opt_.p2p_split_across_tp) bytes /= place_.tensor;
  const GpuRun& a = gpus_[sg];
  const GpuRun& b = gpus_[rg];
  const bool local = synthetic_ || same_node(a.gpu, b.gpu);
  sg4::Host* from = local ? a.compute_host : a.nic_host;
  sg4::Host* to = local ? b.compute_host : b.nic_host;
  ++flows_;
  // SimGrid 3.32's wait_any never completes a 0-byte sendto; one byte costs < 0.1 ns.
  mine.push_back({sg4::Comm::sendto_async(from, to, std::max(bytes, 1.0)), sg, so, rg, ro});
  gpus_[sg].ops[so].xfer = gpus_[rg].ops[ro].xfer = sg4::Engine::get_clock();
}

void Model::p2p_actor(int gi) {
  GpuRun& g = gpus_[gi];
  const std::vector<int>& ops = ranks_[g.stage].stream_ops[1];
  const auto& plan_ops = plan_.ranks[g.stage];
  std::vector<PendingComm> mine;
  for (std::size_t i = 0; i < ops.size();) {
    std::size_t j = i + 1;
    const int batch = plan_ops[ops[i]].batch;
    while (batch >= 0 && j < ops.size() && plan_ops[ops[j]].batch == batch) ++j;
    for (std::size_t k = i; k < j; ++k) wait_deps(gi, ops[k], 1);
    const double now = sg4::Engine::get_clock();
    for (std::size_t k = i; k < j; ++k) {
      const ir::Op& o = plan_ops[ops[k]];
      g.ops[ops[k]].start = now;
      if (ir::is_p2p(o.kind)) {
        post(gi, ops[k], mine);
      } else {
        if (ranks_[g.stage].seconds[ops[k]] > 0) sg4::this_actor::sleep_for(ranks_[g.stage].seconds[ops[k]]);
        mark_done(gi, ops[k], sg4::Engine::get_clock());
      }
    }
    while (!mine.empty()) {
      std::vector<sg4::CommPtr> comms;
      for (auto& pc : mine) comms.push_back(pc.comm);
      const auto idx = static_cast<std::size_t>(sg4::Comm::wait_any(comms));
      const PendingComm pc = mine[idx];
      mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(idx));
      const double t = sg4::Engine::get_clock();
      mark_done(pc.send_gpu, pc.send_op, t);
      mark_done(pc.recv_gpu, pc.recv_op, t);
    }
    for (std::size_t k = i; k < j; ++k) wait_op(gi, ops[k]);
    i = j;
  }
  g.waiting[1] = -1;
}

void Model::run_collective(int gi, int op) {
  GpuRun& g = gpus_[gi];
  const ir::Op& o = plan_.ranks[g.stage][op];
  const int n = place_.data;
  if (n <= 1) return;
  const double bytes = synthetic_ ? 0.0 : static_cast<double>(o.bytes);
  // 1-bit Adam: the compression kernels first (the op's est_seconds), then the all-to-all
  // of the packed message's segments — one round: (n − 1)/n of it leaves through this
  // member's link at once — and their ring all-gather, n − 1 steps of 1/n: a ring
  // all-reduce's volume in n latencies instead of 2(n − 1).
  const bool compressed = o.kind == OpKind::COMPRESSED_ALLREDUCE;
  const double kernels = ranks_[g.stage].seconds[static_cast<std::size_t>(op)];
  if (compressed && kernels > 0 && !synthetic_) sg4::this_actor::sleep_for(kernels * g.slow);
  const int steps = compressed ? n : o.kind == OpKind::ALLREDUCE ? 2 * (n - 1) : n - 1;
  // Bytes of ring step s (every step 1/n of the buffer, but the all-to-all's).
  auto step_bytes = [&](int s) { return compressed && s == 0 ? (n - 1) * bytes / n : bytes / n; };
  const double volume = compressed ? 2.0 * (n - 1) * bytes / n : steps * bytes / n;
  const double alpha = g.ring_alpha, beta = g.ring_beta;
  bool tree = false;
  if (o.kind == OpKind::ALLREDUCE) {
    if (opt_.collective == CollectiveAlgorithm::Tree) tree = true;
    else if (opt_.collective == CollectiveAlgorithm::Auto)
      tree = tree_allreduce_seconds(bytes, n, alpha, beta) < ring_allreduce_seconds(bytes, n, alpha, beta);
  }
  if (collective_.empty()) collective_ = tree ? "tree" : "ring";
  if (synthetic_) {  // latency only, as the analytic engine charges it
    couple_start(gi, op);
    const int hops = tree ? 2 * static_cast<int>(std::ceil(std::log2(n))) : steps;
    if (hops > 0 && alpha > 0) sg4::this_actor::sleep_for(hops * alpha);
    couple_end(gi, op);
    return;
  }
  if (tree) {
    // Double binary tree: 2·⌈log2 n⌉ latency-bound hops, 2·S through the NIC (reduce + broadcast).
    const int depth = static_cast<int>(std::ceil(std::log2(n)));
    sg4::Host *from, *to;
    if (reduced_) {
      from = g.mirror_src;
      to = g.mirror;
    } else {
      const GpuRun& next = gpus_[sim_index((g.replica + 1) % n, g.stage, g.tp)];
      const bool local = synthetic_ || same_node(g.gpu, next.gpu);
      from = local ? g.compute_host : g.nic_host;
      to = local ? next.compute_host : next.nic_host;
    }
    couple_start(gi, op);
    if (2 * depth > 1) sg4::this_actor::sleep_for((2 * depth - 1) * alpha);
    ++flows_;
    sg4::Comm::sendto_async(from, to, 2 * bytes)->wait();
    couple_end(gi, op);
    return;
  }
  if (reduced_) {
    // Replica symmetry: every member's step is the same flow; one flow stands for all
    // (a replica a fault touches has its own, coupled to the others').
    couple_start(gi, op);
    if (opt_.collapse_ring_steps) {
      if (steps > 1) sg4::this_actor::sleep_for((steps - 1) * alpha);
      ++flows_;
      sg4::Comm::sendto_async(g.mirror_src, g.mirror, volume)->wait();
    } else {
      for (int s = 0; s < steps; ++s) {
        ++flows_;
        sg4::Comm::sendto_async(g.mirror_src, g.mirror, step_bytes(s))->wait();
      }
    }
    couple_end(gi, op);
    return;
  }
  // Plain: the real ring. Step s sends to the successor once this member received step s−1.
  const int next_i = sim_index((g.replica + 1) % n, g.stage, g.tp);
  GpuRun& next = gpus_[next_i];
  const bool local = synthetic_ || same_node(g.gpu, next.gpu);
  sg4::Host* from = local ? g.compute_host : g.nic_host;
  sg4::Host* to = local ? next.compute_host : next.nic_host;
  wait_posted(next_i, op);
  for (int s = 0; s < steps; ++s) {
    if (s > 0) wait_recv_steps(gi, op, s);
    ++flows_;
    sg4::Comm::sendto_async(from, to, step_bytes(s))->wait();
    ++next.ops[op].recv_steps;
    notify(next_i);
  }
  wait_recv_steps(gi, op, steps);
}

void Model::dp_actor(int gi) {
  GpuRun& g = gpus_[gi];
  const RankInfo& info = ranks_[g.stage];
  for (int op : info.stream_ops[2]) {
    wait_deps(gi, op, 2);
    const ir::Op& o = plan_.ranks[g.stage][op];
    g.ops[op].start = g.ops[op].xfer = sg4::Engine::get_clock();
    g.ops[op].posted = true;
    notify(gi);
    if (ir::is_collective(o.kind)) run_collective(gi, op);
    else if (info.seconds[op] > 0) sg4::this_actor::sleep_for(info.seconds[op]);
    mark_done(gi, op, sg4::Engine::get_clock());
  }
  g.waiting[2] = -1;
}

void Model::spawn_actors() {
  for (std::size_t i = 0; i < gpus_.size(); ++i) {
    GpuRun& g = gpus_[i];
    g.mutex = sg4::Mutex::create();
    g.cv = sg4::ConditionVariable::create();
    const int gi = static_cast<int>(i);
    const RankInfo& info = ranks_[g.stage];
    const std::string base = fmt::format("g{}", g.gpu);
    if (!info.stream_ops[0].empty()) {
      sg4::Actor::create(base + "-compute", g.compute_host, [this, gi] { compute_actor(gi); });
      ++actors_;
    }
    if (!info.stream_ops[1].empty()) {
      sg4::Actor::create(base + "-p2p", g.compute_host, [this, gi] { p2p_actor(gi); });
      ++actors_;
    }
    if (!info.stream_ops[2].empty()) {
      sg4::Actor::create(base + "-dp", g.compute_host, [this, gi] { dp_actor(gi); });
      ++actors_;
    }
    if (!info.stream_ops[3].empty()) {
      sg4::Actor::create(base + "-copy", g.compute_host, [this, gi] { copy_actor(gi); });
      ++actors_;
    }
  }
}

std::string Model::deadlock_report() const {
  std::string msg = "simulation deadlocked: the plan's blocking order cannot complete;";
  int shown = 0;
  for (const auto& g : gpus_) {
    if (g.replica != trace_replica_ || g.tp != trace_tp_) continue;
    for (int s = 0; s < ir::kStreamCount; ++s) {
      const int op = g.waiting[s];
      if (op < 0 || g.ops[op].done) continue;
      const ir::Op& o = plan_.ranks[g.stage][op];
      msg += fmt::format(" rank {} {} stream blocked at op {} ({}{});", g.stage,
                         ir::to_string(static_cast<ir::Stream>(s)), op, ir::op_to_text(o),
                         ir::is_p2p(o.kind) ? fmt::format(", peer rank {}", o.peer) : "");
      if (++shown >= 16) return msg + " …";
    }
  }
  return msg;
}

RawResult Model::run() {
  synthetic_ = plan_.scenario.synthetic.has_value();
  reduced_ = synthetic_ || opt_.fidelity == Fidelity::Reduced;
  if (!plan_.lowered)
    throw Error(fmt::format("plan '{}' is not lowered: the simulator needs SEND/RECV and collectives "
                            "(run ir::lower first)",
                            plan_.schedule));
  if (plan_.num_ranks() < 1) throw Error("plan has no ranks");
  if (synthetic_) synthetic_latency_ = quantise_ns(plan_.scenario.synthetic->p2p_latency_seconds);
  else spec_ = opt_.platform ? *opt_.platform : platform_for(plan_.scenario, opt_.fabric);
  if (!synthetic_) check_platform(spec_);
  prepare_ranks();
  prepare_gpus();

  int argc = 1;
  char arg0[] = "tdpipe-sim";
  char* argv[] = {arg0, nullptr};
  xbt_log_control_set("root.thresh:critical");
  sg4::Engine engine(&argc, argv);
  // CM02 without corrections: the latencies and bandwidths we give are the ones used
  // (LV08, the default, scales latency ×13.01 and bandwidth ×0.97).
  engine.set_config("network/model:CM02");
  engine.set_config("network/latency-factor:1");
  engine.set_config("network/bandwidth-factor:1");
  engine.set_config("network/weight-S:0");
  engine.set_config("network/TCP-gamma:0");
  engine.set_config("network/crosstraffic:0");
  engine.set_config("contexts/stack-size:128");
  const bool track = opt_.top_links > 0 && !synthetic_;
  if (track) sg_link_load_plugin_init();
  build_platform();
  if (track)
    for (auto* l : links_) sg_link_load_track(l);
  spawn_actors();
  sg4::Engine::on_deadlock_cb([this] {
    deadlocked_ = true;
    deadlock_message_ = deadlock_report();
  });
  engine.run();
  if (deadlocked_ || done_ops_ < total_ops_)
    throw Error(deadlocked_ ? deadlock_message_ : deadlock_report());

  RawResult out;
  double makespan = 0;
  for (const auto& g : gpus_)
    for (const auto& s : g.ops) makespan = std::max(makespan, s.end);
  out.makespan_ns = to_ns(makespan);
  out.timing.resize(plan_.num_ranks());
  out.xfer_ns.resize(plan_.num_ranks());
  // Report the pipeline that ends last (ties: the first fault-touched replica, else 0).
  {
    std::map<std::pair<int, int>, double> last;
    for (const auto& g : gpus_)
      for (const auto& st : g.ops) last[{g.replica, g.tp}] = std::max(last[{g.replica, g.tp}], st.end);
    double best = last[{trace_replica_, 0}];
    for (const auto& [key, end] : last)
      if (end > best + 1e-9) {  // by more than the ns times are kept in
        best = end;
        trace_replica_ = key.first;
        trace_tp_ = key.second;
      }
  }
  out.trace_replica = trace_replica_;
  out.trace_tp = trace_tp_;
  out.replicas = reduced_ ? slots_ : std::vector<int>();
  for (const auto& g : gpus_) {
    if (g.replica != trace_replica_ || g.tp != trace_tp_) continue;
    auto& t = out.timing[g.stage];
    auto& x = out.xfer_ns[g.stage];
    for (const auto& s : g.ops) {
      t.emplace_back(to_ns(s.start), to_ns(s.end));
      x.push_back(s.xfer < 0 ? -1 : to_ns(s.xfer));
    }
  }
  if (track) {
    for (auto* l : links_) {
      const double bw = l->get_bandwidth();
      LinkUsage u;
      u.name = l->get_name();
      u.bytes_per_second = bw;
      u.peak_utilisation = sg_link_get_max_instantaneous_load(l) / bw;
      u.mean_utilisation = makespan > 0 ? sg_link_get_cum_load(l) / (makespan * bw) : 0;
      out.links.push_back(u);
    }
    std::stable_sort(out.links.begin(), out.links.end(), [](const LinkUsage& a, const LinkUsage& b) {
      return a.peak_utilisation > b.peak_utilisation;
    });
    if (static_cast<int>(out.links.size()) > opt_.top_links) out.links.resize(opt_.top_links);
  }
  out.gpus = reduced_ ? static_cast<std::int64_t>(place_.gpus()) : static_cast<std::int64_t>(gpus_.size());
  out.actors = actors_;
  out.flows = flows_;
  out.collective = collective_;
  return out;
}

}  // namespace

RawResult run_engine(const ir::Plan& plan, const SimOptions& options,
                     const std::function<void(double)>& progress) {
  Model model(plan, options, progress);
  return model.run();
}

}  // namespace tdpipe::sim::detail

// The engine plugin's entry point (engine.hpp: kEngineEntry), looked up by name.
extern "C" __attribute__((visibility("default"))) void tdpipe_sim_run_engine(
    const tdpipe::ir::Plan& plan, const tdpipe::sim::SimOptions& options,
    const std::function<void(double)>& progress, tdpipe::sim::detail::RawResult& out) {
  out = tdpipe::sim::detail::run_engine(plan, options, progress);
}
