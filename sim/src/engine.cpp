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
//
// The Model is split by concept (engine_model.hpp lists the files); this file runs it.
#include "engine_model.hpp"

namespace tdpipe::sim::detail {
namespace engine {

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

}  // namespace engine

RawResult run_engine(const ir::Plan& plan, const SimOptions& options,
                     const std::function<void(double)>& progress) {
  engine::Model model(plan, options, progress);
  return model.run();
}

}  // namespace tdpipe::sim::detail

// The engine plugin's entry points (engine.hpp: kEngineEntry, kEngineAbiEntry), looked up
// by name.
extern "C" __attribute__((visibility("default"))) const char* tdpipe_sim_engine_abi() {
  static const std::string abi = tdpipe::sim::detail::engine_abi();
  return abi.c_str();
}

extern "C" __attribute__((visibility("default"))) void tdpipe_sim_run_engine(
    const tdpipe::ir::Plan& plan, const tdpipe::sim::SimOptions& options,
    const std::function<void(double)>& progress, tdpipe::sim::detail::RawResult& out) {
  out = tdpipe::sim::detail::run_engine(plan, options, progress);
}
