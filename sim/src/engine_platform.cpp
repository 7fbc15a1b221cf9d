// engine_platform.cpp — the SimGrid engine's platform: which GPUs are simulated, faults on them, zones and links of the fabric (the Model: engine_model.hpp).
#include "engine_model.hpp"

namespace tdpipe::sim::detail::engine {

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

}  // namespace tdpipe::sim::detail::engine
