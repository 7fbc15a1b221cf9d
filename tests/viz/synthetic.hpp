// synthetic.hpp — 1F1B timelines built in code for the GUI tests: a small list
// scheduler over per-op durations, so a "measured" copy with jittered durations is
// still a consistent timeline (no overlaps, dependencies respected).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tdpipe/ir/op.hpp"
#include "tdpipe/traces/trace.hpp"

namespace tdpipe::viz::testing {

struct OneFOneB {
  int p = 4, m = 8;
  std::int64_t f_ns = 1'000'000;   // forward
  std::int64_t b_ns = 2'000'000;   // fused backward
  std::int64_t comm_ns = 100'000;  // activation / gradient transfer
  std::int64_t opt_ns = 300'000;   // optimizer step
  std::uint32_t seed = 0;          // 0: exact durations; else jitter them
  double jitter = 0.15;            // relative spread of the jitter
};

inline traces::Trace make_1f1b(const OneFOneB& c) {
  std::mt19937 rng(c.seed);
  std::normal_distribution<double> noise(1.0, c.jitter);
  auto dur = [&](std::int64_t d) -> std::int64_t {
    if (c.seed == 0) return d;
    return std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(d) *
                                                                std::clamp(noise(rng), 0.5, 1.6)));
  };
  struct Step { ir::OpKind kind; int mb; };
  std::vector<std::vector<Step>> order(static_cast<std::size_t>(c.p));
  for (int r = 0; r < c.p; ++r) {
    const int warm = std::min(c.p - r - 1, c.m);
    auto& o = order[static_cast<std::size_t>(r)];
    for (int i = 0; i < warm; ++i) o.push_back({ir::OpKind::F, i});
    for (int i = 0; i < c.m - warm; ++i) {
      o.push_back({ir::OpKind::F, warm + i});
      o.push_back({ir::OpKind::BW, i});
    }
    for (int i = c.m - warm; i < c.m; ++i) o.push_back({ir::OpKind::BW, i});
  }
  // ready[r][mb]: when rank r may start F(mb) (fwd) or BW(mb) (bwd), -1 = not yet.
  const auto P = static_cast<std::size_t>(c.p), M = static_cast<std::size_t>(c.m);
  std::vector<std::vector<std::int64_t>> fwd_ready(P, std::vector<std::int64_t>(M, -1));
  std::vector<std::vector<std::int64_t>> bwd_ready(P, std::vector<std::int64_t>(M, -1));
  for (std::size_t mb = 0; mb < M; ++mb) fwd_ready[0][mb] = 0;
  std::vector<std::size_t> next(P, 0);
  std::vector<std::int64_t> free_at(P, 0);
  traces::Trace t;
  t.origin = c.seed ? "cpu" : "analytic";
  t.schedule = "1f1b";
  t.scenario = "synthetic";
  t.ranks = c.p;
  auto add_event = [&](int rank, int stream, ir::OpKind kind, int mb, int peer, std::int64_t start,
                  std::int64_t d, const std::string& name) {
    traces::TraceEvent e;
    e.rank = rank;
    e.stream = stream;
    e.kind = kind;
    e.mb = mb;
    e.peer = peer;
    e.name = name;
    e.start_ns = start;
    e.dur_ns = d;
    if (peer >= 0) e.bytes = 1 << 20;
    t.events.push_back(e);
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < c.p; ++r) {
      const auto R = static_cast<std::size_t>(r);
      while (next[R] < order[R].size()) {
        const Step s = order[R][next[R]];
        const auto mb = static_cast<std::size_t>(s.mb);
        const std::int64_t ready = s.kind == ir::OpKind::F ? fwd_ready[R][mb] : bwd_ready[R][mb];
        if (ready < 0) break;
        const std::int64_t start = std::max(ready, free_at[R]);
        const bool fwd = s.kind == ir::OpKind::F;
        const std::int64_t d = dur(fwd ? c.f_ns : c.b_ns);
        add_event(r, 0, s.kind, s.mb, -1, start, d, (fwd ? "F" : "BW") + std::to_string(s.mb));
        const std::int64_t end = start + d;
        free_at[R] = end;
        ++next[R];
        progress = true;
        const int to = fwd ? r + 1 : r - 1;
        if (fwd && r == c.p - 1) {
          bwd_ready[R][mb] = end;  // the last stage turns around at once
        } else if (to >= 0 && to < c.p) {
          const std::int64_t cd = dur(c.comm_ns);
          // Names in the IR's text form, as tdpipe traces carry them.
          const auto payload = std::string(fwd ? "F" : "B") + std::to_string(s.mb);
          add_event(r, 1, ir::OpKind::SEND, s.mb, to, end, cd,
               "SEND(" + payload + ">r" + std::to_string(to) + ")");
          add_event(to, 1, ir::OpKind::RECV, s.mb, r, end, cd,
               "RECV(" + payload + "<r" + std::to_string(r) + ")");
          (fwd ? fwd_ready : bwd_ready)[static_cast<std::size_t>(to)][mb] = end + cd;
        }
      }
    }
  }
  // Optimizer step once every rank has finished its backward passes.
  const std::int64_t all_done = *std::max_element(free_at.begin(), free_at.end());
  for (int r = 0; r < c.p; ++r) add_event(r, 0, ir::OpKind::OPT, -1, -1, all_done, dur(c.opt_ns), "OPT");
  return t;
}

/// A foreign Chrome-style trace: two "processes", named events with no kind.
inline traces::Trace make_foreign(std::int64_t origin_ns) {
  traces::Trace t;
  t.origin = "chrome";
  t.ranks = 2;
  const char* names[] = {"matmul", "softmax", "matmul", "allreduce"};
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 4; ++i) {
      traces::TraceEvent e;
      e.rank = r;
      e.stream = 7;
      e.name = names[i];
      e.start_ns = origin_ns + i * 1'000'000 + r * 500'000;
      e.dur_ns = 600'000;
      t.events.push_back(e);
    }
  return t;
}

/// Finds the event of (rank, kind, mb) — for assertions.
inline int find_event(const traces::Trace& t, int rank, ir::OpKind kind, int mb) {
  for (int i = 0; i < static_cast<int>(t.events.size()); ++i) {
    const auto& e = t.events[static_cast<std::size_t>(i)];
    if (e.rank == rank && e.kind == kind && e.mb == mb) return i;
  }
  return -1;
}

}  // namespace tdpipe::viz::testing
