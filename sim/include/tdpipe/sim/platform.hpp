// platform.hpp — the modelled cluster: GPUs, NVSwitch, NICs and the InfiniBand fabric,
// as plain data (the SimGrid zones are built from it inside sim/src).
//
// Model. Every GPU has an NVLink link to its node's NVSwitch in each direction (split
// duplex, at the GPU's NVLink bandwidth). A node has `nics_per_node` NICs shared evenly
// by its GPUs; each NIC has an up and a down link to its leaf switch. Fat-tree: a leaf
// switch holds all NICs of `nodes_per_leaf` consecutive nodes; rail-optimised: a leaf
// ("rail switch") holds NIC j of the `nodes_per_leaf` nodes of a scalable unit. Leaves
// reach the spine through one aggregated up and one down link of capacity
// (NICs under the leaf × NIC bandwidth) / oversubscription (ECMP assumed perfect; the
// spine itself is non-blocking). Each link carries one
// hop's latency: NVLink hops nvlink_latency/2 (so GPU→NVSwitch→GPU costs the scenario's
// nvlink latency), NIC hops ib_latency/2 (NIC→leaf→NIC costs the scenario's ib latency),
// and every switch-to-switch hop ib_switch_hop_latency.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tdpipe/ir/scenario.hpp"

namespace tdpipe::sim {

enum class Topology { FatTree, RailOptimized };

struct PlatformSpec {
  std::string name;
  int nodes = 0;
  int gpus_per_node = 8;
  int nics_per_node = 8;
  std::vector<ir::GpuSpec> node_gpu;        ///< per node (heterogeneous clusters)
  double nvlink_bytes_per_second = 0;       ///< per GPU, each direction
  double nic_bytes_per_second = 0;          ///< per NIC, each direction
  double nvlink_latency_seconds = 0;        ///< GPU → NVSwitch → GPU
  double ib_latency_seconds = 0;            ///< NIC → leaf → NIC
  double ib_switch_hop_latency_seconds = 0; ///< each leaf↔spine / spine↔core hop
  Topology topology = Topology::FatTree;
  int fat_tree_levels = 2;     ///< 1: one switch; 2: leaf + spine (3 is rejected)
  int nodes_per_leaf = 16;     ///< fat-tree leaf / rail-optimised scalable unit
  int leaves_per_pod = 16;     ///< reserved for 3-level trees (not modelled)
  double oversubscription = 1; ///< leaf (and pod) down:up capacity ratio, ≥ 1

  int gpus() const { return nodes * gpus_per_node; }
  int gpus_per_nic() const { return gpus_per_node / nics_per_node; }
};

/// Fabric knobs the scenario file does not carry; 0 / empty keeps the preset's value.
struct FabricOptions {
  std::string topology;         ///< "fat-tree" | "rail-optimized" | "" (scenario's)
  int levels = 0;
  int nodes_per_leaf = 0;
  int leaves_per_pod = 0;
  double oversubscription = 0;
};

/// Presets: "dgx-a100-hdr" (A100 80GB, NVLink3 300 GB/s each way, 8× HDR 200 Gb/s),
/// "dgx-h100-ndr" and "dgx-h200-ndr" (NVLink4 450 GB/s each way, 8× NDR 400 Gb/s).
/// Throws tdpipe::Error listing the known names.
PlatformSpec platform_preset(std::string_view name, int nodes);
std::vector<std::string> platform_preset_names();

/// The platform of a scenario's cluster: fields the scenario leaves 0 come from the
/// DGX preset matching its GPU; `fabric` overrides what the scenario cannot say.
/// Throws tdpipe::Error for an impossible fabric (see check_platform).
PlatformSpec platform_for(const ir::Scenario& scenario, const FabricOptions& fabric = {});

/// Rejects impossible fabrics: no nodes, gpus_per_node not a multiple of
/// nics_per_node, non-positive bandwidths, negative latencies, levels outside 1–2,
/// oversubscription < 1, a cluster larger than the tree can hold.
void check_platform(const PlatformSpec& spec);

/// Hop-by-hop description of the path between two GPUs (global GPU indices).
struct Route {
  double latency_seconds = 0;       ///< sum over hops
  double bottleneck_bytes_per_second = 0;  ///< slowest link, when alone on the path
  int hops = 0;
  bool inter_node = false;
};
Route route_between(const PlatformSpec& spec, int gpu_a, int gpu_b);

}  // namespace tdpipe::sim
