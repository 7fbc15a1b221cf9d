// handoff.cpp — fitting the pipeline hand-off latency from measured step traces
// (semantics in handoff.hpp).
#include "tdpipe/traces/handoff.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "tdpipe/traces/sharing.hpp"

namespace tdpipe::traces {
namespace {

constexpr std::int64_t kNone = -1;

/// Start and end of every plan op in one step trace, or kNone where the trace lacks it.
struct StepTimes {
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> at;  ///< [rank][op]
};

StepTimes match(const ir::Plan& plan, const Trace& trace) {
  const auto index = plan_event_index(plan, trace);
  StepTimes t;
  t.at.resize(plan.ranks.size());
  for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
    t.at[r].assign(plan.ranks[r].size(), {kNone, kNone});
    for (std::size_t i = 0; i < plan.ranks[r].size(); ++i)
      if (const int e = index[r][i]; e >= 0)
        t.at[r][i] = {trace.events[static_cast<std::size_t>(e)].start_ns, trace.events[static_cast<std::size_t>(e)].end_ns()};
  }
  return t;
}

}  // namespace

std::optional<HandoffFit> fit_handoff_latency(const ir::Plan& plan, const std::vector<Trace>& steps,
                                              double bytes_per_second, int min_samples) {
  const std::size_t ranks = plan.ranks.size();
  // SEND/RECV pairs by NCCL's rule: per (sender, receiver), k-th SEND ↔ k-th RECV.
  std::map<std::pair<int, int>, std::vector<int>> sends, recvs;  // (from, to) → op indices
  for (std::size_t r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < plan.ranks[r].size(); ++i) {
      const ir::Op& op = plan.ranks[r][i];
      if (op.kind == ir::OpKind::SEND) sends[{static_cast<int>(r), op.peer}].push_back(static_cast<int>(i));
      if (op.kind == ir::OpKind::RECV) recvs[{op.peer, static_cast<int>(r)}].push_back(static_cast<int>(i));
    }
  std::map<std::pair<int, int>, int> send_of_recv;  // (receiver rank, RECV index) → SEND index on the peer
  for (const auto& [pair, rv] : recvs) {
    const auto it = sends.find(pair);
    if (it == sends.end()) continue;
    for (std::size_t k = 0; k < rv.size() && k < it->second.size(); ++k) send_of_recv[{pair.second, rv[k]}] = it->second[k];
  }
  // Previous op on the same stream of the same rank (or −1).
  std::vector<std::vector<int>> prev(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    std::map<int, int> last;
    prev[r].assign(plan.ranks[r].size(), -1);
    for (std::size_t i = 0; i < plan.ranks[r].size(); ++i) {
      const int s = static_cast<int>(plan.ranks[r][i].stream);
      const auto it = last.find(s);
      if (it != last.end()) prev[r][i] = it->second;
      last[s] = static_cast<int>(i);
    }
  }

  std::vector<double> samples;
  for (const Trace& step : steps) {
    const StepTimes t = match(plan, step);
    auto start = [&](int r, int i) { return t.at[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)].first; };
    auto end = [&](int r, int i) { return t.at[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)].second; };
    for (std::size_t r = 0; r < ranks; ++r) {
      const auto& ops = plan.ranks[r];
      for (std::size_t x = 0; x < ops.size(); ++x) {
        const ir::Op& X = ops[x];
        if (X.kind != ir::OpKind::F && X.kind != ir::OpKind::B && X.kind != ir::OpKind::BW) continue;
        for (const ir::OpRef& d : X.deps) {
          if (d.rank != static_cast<int>(r) || ops[static_cast<std::size_t>(d.index)].kind != ir::OpKind::RECV) continue;
          const ir::Op& R = ops[static_cast<std::size_t>(d.index)];
          const auto s_it = send_of_recv.find({static_cast<int>(r), d.index});
          if (s_it == send_of_recv.end()) continue;
          const int q = R.peer, s = s_it->second;
          const ir::Op& S = plan.ranks[static_cast<std::size_t>(q)][static_cast<std::size_t>(s)];
          // The producer: S's dependency on its own rank's compute op.
          int p = -1;
          for (const ir::OpRef& sd : S.deps)
            if (sd.rank == q && ir::is_compute(plan.ranks[static_cast<std::size_t>(q)][static_cast<std::size_t>(sd.index)].kind))
              p = sd.index;
          if (p < 0) continue;
          const std::int64_t p_end = end(q, p);
          if (p_end == kNone || start(static_cast<int>(r), static_cast<int>(x)) == kNone ||
              start(static_cast<int>(r), d.index) == kNone || start(q, s) == kNone)
            continue;
          // Clean hand-offs only: nothing but P held X back.
          if (start(static_cast<int>(r), d.index) > p_end) continue;  // RECV posted late
          // S is posted with its batch (one NCCL group): the whole batch must have been
          // ready, and the sender's stream free, when P ended.
          const auto& qops = plan.ranks[static_cast<std::size_t>(q)];
          int b0 = s, b1 = s;
          if (S.batch >= 0) {
            while (b0 > 0 && qops[static_cast<std::size_t>(b0 - 1)].batch == S.batch) --b0;
            while (b1 + 1 < static_cast<int>(qops.size()) && qops[static_cast<std::size_t>(b1 + 1)].batch == S.batch) ++b1;
          }
          const int sp = prev[static_cast<std::size_t>(q)][static_cast<std::size_t>(b0)];
          if (sp >= 0 && (end(q, sp) == kNone || end(q, sp) > p_end)) continue;  // sender's stream busy
          bool batch_ready = true;
          for (int m = b0; m <= b1 && batch_ready; ++m)
            for (const ir::OpRef& md : qops[static_cast<std::size_t>(m)].deps)
              if (md.rank == q && (end(q, md.index) == kNone || end(q, md.index) > p_end)) batch_ready = false;
          if (!batch_ready) continue;
          const int xp = prev[r][x];
          if (xp >= 0 && (end(static_cast<int>(r), xp) == kNone || end(static_cast<int>(r), xp) > p_end)) continue;
          const double transfer = bytes_per_second > 0 ? static_cast<double>(S.bytes) / bytes_per_second : 0.0;
          samples.push_back(static_cast<double>(start(static_cast<int>(r), static_cast<int>(x)) - p_end) * 1e-9 - transfer);
        }
      }
    }
  }
  if (static_cast<int>(samples.size()) < min_samples || samples.empty()) return std::nullopt;
  double sum = 0;
  for (double x : samples) sum += x;
  return HandoffFit{std::max(0.0, sum / static_cast<double>(samples.size())), static_cast<int>(samples.size())};
}

void fit_profile_p2p_latency(Profile& profile, const ir::Plan& plan, const std::vector<Trace>& steps) {
  const auto fit = fit_handoff_latency(plan, steps, profile.p2p.bytes_per_second);
  if (!fit) return;
  profile.metadata["p2p_latency_microbenchmark_seconds"] = fmt::format("{:.9g}", profile.p2p.latency_seconds);
  profile.metadata["p2p_latency_samples"] = std::to_string(fit->samples);
  profile.p2p.latency_seconds = fit->latency_seconds;
}

}  // namespace tdpipe::traces
