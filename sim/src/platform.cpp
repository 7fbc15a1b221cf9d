// platform.cpp — DGX presets, the platform of a scenario, fabric checks and routes.
#include "tdpipe/sim/platform.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"

namespace tdpipe::sim {
namespace {

// Switch-to-switch hop: a few hundred ns of switch latency plus cable; NCCL's 14 µs
// network latency is mostly endpoint software and sits on the NIC hops.
constexpr double kSwitchHopLatencySeconds = 0.5e-6;

struct PresetRow {
  const char* name;
  const char* gpu;
  double nic_bytes_per_second;
};
constexpr PresetRow kPresets[] = {
    {"dgx-a100-hdr", "a100-80g", 200e9 / 8},  // 8× ConnectX-6 HDR 200 Gb/s
    {"dgx-h100-ndr", "h100-80g", 400e9 / 8},  // 8× ConnectX-7 NDR 400 Gb/s
    {"dgx-h200-ndr", "h200", 400e9 / 8},
};

// Leaf (switch) index of a GPU's NIC; rail-optimised leaves are (unit, rail).
int leaf_of(const PlatformSpec& s, int gpu) {
  const int node = gpu / s.gpus_per_node;
  const int unit = node / s.nodes_per_leaf;
  if (s.topology == Topology::FatTree) return unit;
  const int nic = (gpu % s.gpus_per_node) / s.gpus_per_nic();
  return unit * s.nics_per_node + nic;
}
int unit_of(const PlatformSpec& s, int gpu) { return gpu / s.gpus_per_node / s.nodes_per_leaf; }

}  // namespace

std::vector<std::string> platform_preset_names() {
  std::vector<std::string> names;
  for (const auto& row : kPresets) names.emplace_back(row.name);
  return names;
}

PlatformSpec platform_preset(std::string_view name, int nodes) {
  for (const auto& row : kPresets) {
    if (name != row.name) continue;
    PlatformSpec s;
    s.name = row.name;
    s.nodes = nodes;
    const ir::GpuSpec gpu = ir::gpu_preset(row.gpu);
    s.node_gpu.assign(static_cast<std::size_t>(std::max(nodes, 0)), gpu);
    s.nvlink_bytes_per_second = gpu.nvlink_bytes_per_second;
    s.nic_bytes_per_second = row.nic_bytes_per_second;
    s.nvlink_latency_seconds = 3.4e-6;  // NCCL tuner's NVLink hop
    s.ib_latency_seconds = 14e-6;       // NCCL tuner's network hop
    s.ib_switch_hop_latency_seconds = kSwitchHopLatencySeconds;
    return s;
  }
  throw Error(fmt::format("unknown platform preset '{}'; expected one of {}", name,
                          fmt::join(platform_preset_names(), ", ")));
}

PlatformSpec platform_for(const ir::Scenario& scenario, const FabricOptions& fabric) {
  const ir::ClusterConfig& c = scenario.cluster;
  if (c.groups.empty())
    throw Error(fmt::format("scenario '{}': cluster has no node groups; the simulator needs "
                            "cluster.gpu and cluster.nodes",
                            scenario.name));
  // Default NIC speed by generation: HDR for A100-class, NDR for Hopper.
  const bool hopper = c.groups.front().gpu.peak_flops > 500e12;
  PlatformSpec s = platform_preset(hopper ? "dgx-h100-ndr" : "dgx-a100-hdr", c.nodes());
  s.name = scenario.name.empty() ? s.name : scenario.name;
  s.gpus_per_node = c.gpus_per_node;
  // More NICs than GPUs (the scenario default of 8 on small nodes): one NIC per GPU is
  // all the compute traffic can use.
  s.nics_per_node = c.nics_per_node > c.gpus_per_node && c.gpus_per_node > 0 ? c.gpus_per_node : c.nics_per_node;
  s.node_gpu.clear();
  for (const auto& g : c.groups)
    for (int i = 0; i < g.nodes; ++i) s.node_gpu.push_back(g.gpu);
  s.nvlink_bytes_per_second = c.nvlink_bytes_per_second > 0
                                  ? c.nvlink_bytes_per_second
                                  : c.groups.front().gpu.nvlink_bytes_per_second;
  if (c.ib_bytes_per_second_per_nic > 0) s.nic_bytes_per_second = c.ib_bytes_per_second_per_nic;
  if (c.nvlink_latency_seconds > 0) s.nvlink_latency_seconds = c.nvlink_latency_seconds;
  if (c.ib_latency_seconds > 0) s.ib_latency_seconds = c.ib_latency_seconds;
  std::string topo = fabric.topology.empty() ? c.topology : fabric.topology;
  if (topo == "fat-tree") s.topology = Topology::FatTree;
  else if (topo == "rail-optimized") s.topology = Topology::RailOptimized;
  else
    throw Error(fmt::format("scenario '{}': cluster.topology '{}' unknown; expected fat-tree or "
                            "rail-optimized",
                            scenario.name, topo));
  if (fabric.levels > 0) s.fat_tree_levels = fabric.levels;
  if (fabric.nodes_per_leaf > 0) s.nodes_per_leaf = fabric.nodes_per_leaf;
  if (fabric.leaves_per_pod > 0) s.leaves_per_pod = fabric.leaves_per_pod;
  if (fabric.oversubscription > 0) s.oversubscription = fabric.oversubscription;
  // A small cluster fits under fewer levels: one switch when every node hangs off one leaf.
  if (s.nodes <= s.nodes_per_leaf && fabric.levels == 0) s.fat_tree_levels = 1;
  check_platform(s);
  return s;
}

void check_platform(const PlatformSpec& s) {
  auto bad = [&](const std::string& what) {
    throw Error(fmt::format("platform '{}': impossible fabric: {}", s.name, what));
  };
  if (s.nodes <= 0) bad(fmt::format("{} nodes; expected at least 1", s.nodes));
  if (s.gpus_per_node <= 0) bad(fmt::format("gpus_per_node {}; expected ≥ 1", s.gpus_per_node));
  if (s.nics_per_node <= 0 || s.gpus_per_node % s.nics_per_node != 0)
    bad(fmt::format("nics_per_node {} must divide gpus_per_node {}", s.nics_per_node,
                    s.gpus_per_node));
  if (static_cast<int>(s.node_gpu.size()) != s.nodes)
    bad(fmt::format("{} GPU specs for {} nodes", s.node_gpu.size(), s.nodes));
  for (const auto& g : s.node_gpu)
    if (!(g.peak_flops > 0)) bad(fmt::format("GPU '{}' has peak {} FLOP/s; expected > 0", g.name, g.peak_flops));
  if (!(s.nvlink_bytes_per_second > 0))
    bad(fmt::format("NVLink bandwidth {} B/s; expected > 0", s.nvlink_bytes_per_second));
  if (!(s.nic_bytes_per_second > 0))
    bad(fmt::format("NIC bandwidth {} B/s; expected > 0", s.nic_bytes_per_second));
  if (s.nvlink_latency_seconds < 0 || s.ib_latency_seconds < 0 || s.ib_switch_hop_latency_seconds < 0)
    bad("negative latency");
  if (s.fat_tree_levels < 1 || s.fat_tree_levels > 2)
    bad(fmt::format("{} fat-tree levels; expected 1 (one switch) or 2 (leaf + spine); 3-level "
                    "trees are not modelled",
                    s.fat_tree_levels));
  if (s.nodes_per_leaf <= 0) bad(fmt::format("nodes_per_leaf {}; expected ≥ 1", s.nodes_per_leaf));
  if (s.leaves_per_pod <= 0) bad(fmt::format("leaves_per_pod {}; expected ≥ 1", s.leaves_per_pod));
  if (!(s.oversubscription >= 1))
    bad(fmt::format("oversubscription {}; expected ≥ 1 (down:up capacity)", s.oversubscription));
  if (s.fat_tree_levels == 1 && s.nodes > s.nodes_per_leaf)
    bad(fmt::format("{} nodes under a 1-level fabric of {} nodes per switch; use 2 or 3 levels",
                    s.nodes, s.nodes_per_leaf));
}

Route route_between(const PlatformSpec& s, int a, int b) {
  Route r;
  if (a == b) return r;
  const int node_a = a / s.gpus_per_node, node_b = b / s.gpus_per_node;
  if (node_a == node_b) {
    r.latency_seconds = s.nvlink_latency_seconds;
    r.bottleneck_bytes_per_second = s.nvlink_bytes_per_second;
    r.hops = 2;
    return r;
  }
  r.inter_node = true;
  r.hops = 2;
  r.latency_seconds = s.ib_latency_seconds;
  r.bottleneck_bytes_per_second = s.nic_bytes_per_second;
  if (s.fat_tree_levels >= 2 && leaf_of(s, a) != leaf_of(s, b)) {
    // Rail-optimised: a different rail is reached through the spine as well.
    r.hops += 2;
    const int pod_a = unit_of(s, a) / s.leaves_per_pod, pod_b = unit_of(s, b) / s.leaves_per_pod;
    if (s.fat_tree_levels == 3 && pod_a != pod_b) r.hops += 2;
    r.latency_seconds += (r.hops - 2) * s.ib_switch_hop_latency_seconds;
    const int nics_under_leaf =
        s.nodes_per_leaf * (s.topology == Topology::FatTree ? s.nics_per_node : 1);
    const double leaf_up = nics_under_leaf * s.nic_bytes_per_second / s.oversubscription;
    r.bottleneck_bytes_per_second = std::min(r.bottleneck_bytes_per_second, leaf_up);
  }
  return r;
}

}  // namespace tdpipe::sim
