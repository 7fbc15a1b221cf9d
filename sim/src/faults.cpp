// faults.cpp — simulator fault specs, what they touch, and checkpoint-restart
// accounting (see faults.hpp).
#include "tdpipe/sim/faults.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/fault_text.hpp"

namespace tdpipe::sim {

const char* to_string(SimFault::Kind kind) {
  switch (kind) {
    case SimFault::Kind::Slow: return "slow";
    case SimFault::Kind::Link: return "link";
    case SimFault::Kind::Fail: return "fail";
  }
  return "?";
}

namespace {

constexpr const char* kSpecHelp = "slow:rank=G,factor=F | link:node=N,factor=F[,nic=J] | fail:rank=G,at=T";

/// GPUs of the plan on `node` (all of them, or those on NIC `nic`).
std::vector<int> gpus_of(const SimFault& f, const ir::Placement& place, const PlatformSpec& spec) {
  std::vector<int> out;
  const int per_nic = std::max(spec.gpus_per_nic(), 1);
  for (int k = 0; k < spec.gpus_per_node; ++k) {
    const int gpu = f.node * spec.gpus_per_node + k;
    if (gpu >= place.gpus()) break;
    if (f.nic < 0 || k / per_nic == f.nic) out.push_back(gpu);
  }
  return out;
}

std::string where(int gpu, const ir::Placement& place) {
  return fmt::format("replica {}, stage {}, TP rank {}", place.replica_of(gpu), place.stage_of(gpu),
                     place.tp_rank_of(gpu));
}

}  // namespace

SimFault parse_sim_fault(std::string_view text) {
  static const std::map<std::string, ir::FaultKeys, std::less<>> kinds = {
      {"slow", {{"rank", "factor"}, {"rank", "factor"}}},
      {"link", {{"node", "factor", "nic"}, {"node", "factor"}}},
      {"fail", {{"rank", "at"}, {"rank", "at"}}},
  };
  const ir::FaultText t = ir::parse_fault_text(text, kinds, kSpecHelp);
  SimFault f;
  f.text = t.text;
  f.kind = t.kind == "slow" ? SimFault::Kind::Slow : t.kind == "link" ? SimFault::Kind::Link : SimFault::Kind::Fail;
  constexpr int kMax = 1 << 30;
  for (const auto& [key, value] : t.keys) {
    if (key == "rank") f.rank = ir::fault_int(t, key, value, 0, kMax);
    else if (key == "node") f.node = ir::fault_int(t, key, value, 0, kMax);
    else if (key == "nic") f.nic = ir::fault_int(t, key, value, 0, kMax);
    else if (key == "at") f.at_seconds = ir::fault_seconds(t, key, value);
    else if (key == "factor")
      f.factor = f.kind == SimFault::Kind::Slow
                     ? ir::fault_number(t, key, value, 1, true, 100, "how many times slower")
                     : ir::fault_number(t, key, value, 0, true, 1, "the share of the bandwidth left");
  }
  return f;
}

void check_sim_faults(const std::vector<SimFault>& faults, const ir::Placement& place, const PlatformSpec& spec) {
  const int gpus = place.gpus();
  const int nodes_used = (gpus + spec.gpus_per_node - 1) / std::max(spec.gpus_per_node, 1);
  for (const SimFault& f : faults) {
    if ((f.kind == SimFault::Kind::Slow || f.kind == SimFault::Kind::Fail) && f.rank >= gpus)
      throw Error(fmt::format("--inject \"{}\": rank {} is not a GPU of the plan, whose GPUs are 0 to {} "
                              "((replica · {} + stage) · {} + TP rank)",
                              f.text, f.rank, gpus - 1, place.pipeline, place.tensor));
    if (f.kind != SimFault::Kind::Link) continue;
    if (spec.nodes <= 1 && f.node == 0)
      throw Error(fmt::format("--inject \"{}\": the cluster is one node; its GPUs talk over NVLink, so no NIC "
                              "carries the plan's traffic",
                              f.text));
    if (f.node >= nodes_used)
      throw Error(fmt::format("--inject \"{}\": node {} holds no GPU of the plan, which uses nodes 0 to {} "
                              "({} GPUs, {} per node)",
                              f.text, f.node, nodes_used - 1, gpus, spec.gpus_per_node));
    if (f.nic >= spec.nics_per_node)
      throw Error(fmt::format("--inject \"{}\": nic {} does not exist; a node has NICs 0 to {}", f.text, f.nic,
                              spec.nics_per_node - 1));
    if (gpus_of(f, place, spec).empty())
      throw Error(fmt::format("--inject \"{}\": no GPU of the plan uses NIC {} of node {}", f.text, f.nic, f.node));
  }
}

std::vector<int> affected_replicas(const std::vector<SimFault>& faults, const ir::Placement& place,
                                   const PlatformSpec& spec) {
  std::set<int> out;
  for (const SimFault& f : faults) {
    if (f.kind == SimFault::Kind::Slow) out.insert(place.replica_of(f.rank));
    if (f.kind == SimFault::Kind::Link)
      for (int gpu : gpus_of(f, place, spec)) out.insert(place.replica_of(gpu));
  }
  return {out.begin(), out.end()};
}

std::string describe_sim_fault(const SimFault& f, const ir::Placement& place, const PlatformSpec& spec) {
  switch (f.kind) {
    case SimFault::Kind::Slow: {
      const int first = f.rank - place.tp_rank_of(f.rank);
      const std::string group =
          place.tensor > 1 ? fmt::format("its TP group (GPUs {}–{})", first, first + place.tensor - 1) : "it";
      return fmt::format("{}: GPU {} = {}: {} computes {:g}× slower", f.text, f.rank, where(f.rank, place), group,
                         f.factor);
    }
    case SimFault::Kind::Link: {
      const std::vector<int> gpus = gpus_of(f, place, spec);
      std::set<std::pair<int, int>> groups;
      for (int g : gpus) groups.insert({place.replica_of(g), place.stage_of(g)});
      std::string held;
      for (const auto& [r, s] : groups) held += fmt::format("{}(replica {}, stage {})", held.empty() ? "" : ", ", r, s);
      const std::string nics = f.nic < 0 ? fmt::format("its {} NICs", spec.nics_per_node) : fmt::format("NIC {}", f.nic);
      const std::string range = gpus.size() == 1 ? fmt::format("GPU {}", gpus.front())
                                                 : fmt::format("GPUs {}–{}", gpus.front(), gpus.back());
      return fmt::format("{}: node {} ({}: {}): {} at {:g}× bandwidth ({:.1f} GB/s each way)", f.text, f.node, range,
                         held, nics, f.factor, f.factor * spec.nic_bytes_per_second / 1e9);
    }
    case SimFault::Kind::Fail:
      return fmt::format("{}: GPU {} = {} is lost {:.15g} s into the run", f.text, f.rank, where(f.rank, place),
                         f.at_seconds);
  }
  return f.text;
}

FailureTimeline failure_timeline(double T, const std::vector<SimFault>& faults, const FailureOptions& o) {
  if (!(T > 0) || !std::isfinite(T))
    throw Error(fmt::format("failure timeline: iteration time {} s; expected a positive time", T));
  if (o.checkpoint_every < 1)
    throw Error("a fail fault needs --checkpoint-every N (iterations between checkpoints, ≥ 1): the restart "
                "resumes from the last complete checkpoint");
  for (const auto& [name, v] : {std::pair{"--checkpoint-seconds", o.checkpoint_seconds},
                                {"--detect-seconds", o.detect_seconds}, {"--restart-seconds", o.restart_seconds}})
    if (!(v >= 0) || !(v <= 1e9)) throw Error(fmt::format("{} {}: expected a time in [0, 1e9] s", name, v));
  if (o.steps < 0) throw Error(fmt::format("--steps {}: expected ≥ 0", o.steps));
  const long long N = o.checkpoint_every;
  const double C = o.checkpoint_seconds;
  // Fault-free: iteration i and every checkpoint before it written by e(i).
  auto e = [&](long long i) { return static_cast<double>(i) * T + static_cast<double>(i / N) * C; };

  std::vector<const SimFault*> fails;
  for (const auto& f : faults)
    if (f.kind == SimFault::Kind::Fail) fails.push_back(&f);
  std::stable_sort(fails.begin(), fails.end(),
                   [](const SimFault* a, const SimFault* b) { return a->at_seconds < b->at_seconds; });

  FailureTimeline out;
  out.iteration_seconds = T;
  double w0 = 0;      // wall time at which the run (re)started from
  long long i0 = 0;   // iterations done at w0 (a checkpoint, or the start)
  long long last_interrupted = 0;
  for (const SimFault* f : fails) {
    FailureEvent ev;
    ev.text = f->text;
    ev.at_seconds = f->at_seconds;
    const double at = f->at_seconds;
    if (o.steps > 0 && at >= w0 + e(o.steps) - e(i0)) {  // the run is over by then
      out.events.push_back(ev);
      continue;
    }
    ev.fired = true;
    if (at < w0) {
      // During a restart: it starts over; no work is lost, the restart so far is.
      ev.iteration = i0 + 1;
      ev.restart_from = i0;
    } else {
      const double x = at - w0 + e(i0);  // how far a fault-free run would be
      long long k = static_cast<long long>(std::floor(x / e(N)));
      while (e((k + 1) * N) <= x) ++k;
      while (k > 0 && e(k * N) > x) --k;
      const long long c = k * N;  // last complete checkpoint
      const double r = x - e(c);
      long long i = c + static_cast<long long>(std::floor(r / T));
      while (i + 1 < c + N && e(i + 1) <= x) ++i;
      while (i > c && e(i) > x) --i;
      ev.iteration = std::min(i + 1, c + N);  // within the write after c+N: that one
      ev.restart_from = c;
      ev.lost_seconds = r;
      i0 = c;
    }
    ev.resume_at_seconds = at + o.detect_seconds + o.restart_seconds;
    w0 = ev.resume_at_seconds;
    last_interrupted = std::max<long long>(last_interrupted, ev.iteration);
    out.events.push_back(ev);
  }
  out.steps = o.steps > 0 ? o.steps : std::max<long long>(last_interrupted, 1);
  out.checkpoints = out.steps / N;
  out.no_failure_seconds = e(out.steps);
  out.total_seconds = w0 + e(out.steps) - e(i0);
  out.lost_seconds = out.total_seconds - out.no_failure_seconds;
  out.mean_iteration_seconds = out.total_seconds / out.steps;
  out.goodput = out.steps * T / out.total_seconds;
  return out;
}

}  // namespace tdpipe::sim
