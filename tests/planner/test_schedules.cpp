// test_schedules.cpp — the schedule generators: exact orders against the reference
// implementations, completeness, dependencies, in-flight activations, closed forms.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/planner/generators.hpp"

using tdpipe::ir::Op;
using tdpipe::ir::OpKind;
using tdpipe::ir::Plan;
using tdpipe::planner::make_schedule;
using tdpipe::planner::ScheduleParams;

namespace {

ScheduleParams params(int p, int m, int v = 1, int S = 1) {
  ScheduleParams sp;
  sp.stages = p;
  sp.microbatches = m;
  sp.chunks = v;
  sp.slices = S;
  return sp;
}

// A local text form (the ir printer is written elsewhere): chunk ≠ 0 as ".cN", the
// slice as ":sN" when the plan is sliced.
std::string rank_text(const Plan& plan, int rank) {
  std::string out;
  for (const Op& op : plan.ranks[rank]) {
    if (!out.empty()) out += ' ';
    out += std::string(tdpipe::ir::to_string(op.kind)) + std::to_string(op.mb);
    if (op.chunk != 0) out += ".c" + std::to_string(op.chunk);
    if (plan.slices > 1) out += ":s" + std::to_string(op.slice);
  }
  return out;
}

std::vector<std::string> text(const Plan& plan) {
  std::vector<std::string> out;
  for (int r = 0; r < plan.num_ranks(); ++r) out.push_back(rank_text(plan, r));
  return out;
}

// Identity of a compute op in the DAG: (backward?, mb, virtual stage, slice).
// B and BW share the "input gradient done" role; W is its own class.
enum class Role { F, B, W };
using Node = std::tuple<Role, int, int, int>;

Role role_of(OpKind k) {
  if (k == OpKind::F) return Role::F;
  if (k == OpKind::W) return Role::W;
  return Role::B;
}

std::vector<Node> deps_of(const Plan& plan, const Op& op, int vs) {
  const int V = plan.virtual_stages(), S = plan.slices;
  std::vector<Node> deps;
  switch (role_of(op.kind)) {
    case Role::F:
      if (vs > 0) deps.emplace_back(Role::F, op.mb, vs - 1, op.slice);
      if (op.slice > 0) deps.emplace_back(Role::F, op.mb, vs, op.slice - 1);
      break;
    case Role::B:
      deps.emplace_back(Role::F, op.mb, vs, op.slice);
      if (vs + 1 < V) deps.emplace_back(Role::B, op.mb, vs + 1, op.slice);
      if (op.slice + 1 < S) deps.emplace_back(Role::B, op.mb, vs, op.slice + 1);
      break;
    case Role::W:
      deps.emplace_back(Role::B, op.mb, vs, op.slice);
      break;
  }
  return deps;
}

struct Costs {
  std::int64_t f = 1, b = 1, w = 1;
  std::int64_t of(OpKind k) const {
    switch (k) {
      case OpKind::F: return f;
      case OpKind::B: return b;
      case OpKind::W: return w;
      default: return b + w;  // BW
    }
  }
};

struct ReplayOut {
  bool completed = false;
  std::string stuck;  // first blocked op of each rank, when not completed
  std::int64_t makespan = 0;
  std::vector<std::int64_t> idle;  // makespan − busy time, per rank
};

// Dependency-driven replay: each rank runs its ops in order; an op starts when the
// rank is free and its DAG inputs are done. With zero costs it is the "can every op
// complete" check.
ReplayOut replay(const Plan& plan, const Costs& costs) {
  const int p = plan.num_ranks();
  std::map<Node, std::int64_t> done;
  std::vector<std::size_t> next(p, 0);
  std::vector<std::int64_t> clock(p, 0), busy(p, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < plan.ranks[r].size()) {
        const Op& op = plan.ranks[r][next[r]];
        const int vs = plan.stage_of[r][op.chunk];
        std::int64_t start = clock[r];
        bool ready = true;
        for (const Node& d : deps_of(plan, op, vs)) {
          auto it = done.find(d);
          if (it == done.end()) {
            ready = false;
            break;
          }
          start = std::max(start, it->second);
        }
        if (!ready) break;
        clock[r] = start + costs.of(op.kind);
        busy[r] += costs.of(op.kind);
        done[{role_of(op.kind), op.mb, vs, op.slice}] = clock[r];
        ++next[r];
        progress = true;
      }
    }
  }
  ReplayOut out;
  out.completed = true;
  for (int r = 0; r < p; ++r) {
    if (next[r] < plan.ranks[r].size()) {
      out.completed = false;
      const Op& op = plan.ranks[r][next[r]];
      out.stuck += "rank" + std::to_string(r) + " blocked at " +
                   std::string(tdpipe::ir::to_string(op.kind)) + std::to_string(op.mb) + ".c" +
                   std::to_string(op.chunk) + ":s" + std::to_string(op.slice) + "; ";
    }
  }
  out.makespan = *std::max_element(clock.begin(), clock.end());
  for (int r = 0; r < p; ++r) out.idle.push_back(out.makespan - busy[r]);
  return out;
}

bool splits_backward(const std::string& name) {
  return name == "zb-h1" || name == "zb-h2" || name == "zb-v";
}

// Every (mb, virtual stage, slice) has exactly one op of each role the schedule uses,
// on the rank that owns that virtual stage; fused schedules never emit B or W, split
// ones never BW; all ops are compute ops on the compute stream.
void check_complete(const Plan& plan) {
  const bool split = splits_backward(plan.schedule);
  std::string errors;
  std::map<std::tuple<OpKind, int, int, int>, int> count;
  for (int r = 0; r < plan.num_ranks(); ++r) {
    for (const Op& op : plan.ranks[r]) {
      const bool kind_ok = split ? (op.kind == OpKind::F || op.kind == OpKind::B ||
                                    op.kind == OpKind::W)
                                 : (op.kind == OpKind::F || op.kind == OpKind::BW);
      const bool ids_ok = op.chunk >= 0 && op.chunk < plan.chunks && op.mb >= 0 &&
                          op.mb < plan.microbatches && op.slice >= 0 && op.slice < plan.slices;
      if (!kind_ok || !ids_ok || op.stream != tdpipe::ir::Stream::Compute) {
        errors += "rank" + std::to_string(r) + " has a bad op " +
                  std::string(tdpipe::ir::to_string(op.kind)) + std::to_string(op.mb) + "; ";
        continue;
      }
      ++count[{op.kind, op.mb, plan.stage_of[r][op.chunk], op.slice}];
    }
  }
  const std::vector<OpKind> kinds = split ? std::vector<OpKind>{OpKind::F, OpKind::B, OpKind::W}
                                          : std::vector<OpKind>{OpKind::F, OpKind::BW};
  for (OpKind k : kinds)
    for (int mb = 0; mb < plan.microbatches; ++mb)
      for (int vs = 0; vs < plan.virtual_stages(); ++vs)
        for (int s = 0; s < plan.slices; ++s) {
          auto it = count.find({k, mb, vs, s});
          const int n = it == count.end() ? 0 : it->second;
          if (n != 1)
            errors += std::string(tdpipe::ir::to_string(k)) + std::to_string(mb) + " vs" +
                      std::to_string(vs) + ":s" + std::to_string(s) + " appears " +
                      std::to_string(n) + " times; ";
        }
  std::size_t total = 0;
  for (const auto& ops : plan.ranks) total += ops.size();
  INFO(errors);
  REQUIRE(errors.empty());
  REQUIRE(total == kinds.size() * plan.microbatches * plan.virtual_stages() * plan.slices);
}

// Peak of activations alive per rank: an F's until its last backward op (BW or W).
std::vector<int> peak_inflight(const Plan& plan) {
  std::vector<int> peaks;
  for (const auto& ops : plan.ranks) {
    int now = 0, peak = 0;
    for (const Op& op : ops) {
      if (op.kind == OpKind::F) peak = std::max(peak, ++now);
      if (op.kind == OpKind::BW || op.kind == OpKind::W) --now;
    }
    peaks.push_back(peak);
  }
  return peaks;
}

}  // namespace

TEST_CASE("schedule_names lists every generator", "[schedules]") {
  REQUIRE(tdpipe::planner::schedule_names() ==
          std::vector<std::string>{"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v",
                                   "tdpipe", "auto"});
  for (const auto& name : tdpipe::planner::schedule_names()) {
    const Plan plan = make_schedule(name, params(2, 4, 2, 2));
    REQUIRE(plan.schedule == name);
    REQUIRE_FALSE(plan.lowered);
    REQUIRE(plan.stages == 2);
    REQUIRE(plan.microbatches == 4);
    REQUIRE(plan.num_ranks() == 2);
    REQUIRE(plan.stage_of.size() == 2);
  }
}

TEST_CASE("1f1b: Megatron's warm-up, steady 1F1B, cool-down (p=4, m=8)", "[schedules]") {
  const Plan plan = make_schedule("1f1b", params(4, 8));
  REQUIRE(plan.chunks == 1);
  REQUIRE(plan.slices == 1);
  REQUIRE(plan.stage_of == std::vector<std::vector<int>>{{0}, {1}, {2}, {3}});
  REQUIRE(text(plan) == std::vector<std::string>{
                            "F0 F1 F2 F3 BW0 F4 BW1 F5 BW2 F6 BW3 F7 BW4 BW5 BW6 BW7",
                            "F0 F1 F2 BW0 F3 BW1 F4 BW2 F5 BW3 F6 BW4 F7 BW5 BW6 BW7",
                            "F0 F1 BW0 F2 BW1 F3 BW2 F4 BW3 F5 BW4 F6 BW5 F7 BW6 BW7",
                            "F0 BW0 F1 BW1 F2 BW2 F3 BW3 F4 BW4 F5 BW5 F6 BW6 F7 BW7",
                        });
}

TEST_CASE("1f1b with fewer micro-batches than stages is all forwards, then backwards",
          "[schedules]") {
  const Plan plan = make_schedule("1f1b", params(4, 2));
  REQUIRE(text(plan) == std::vector<std::string>{"F0 F1 BW0 BW1", "F0 F1 BW0 BW1",
                                                 "F0 F1 BW0 BW1", "F0 BW0 F1 BW1"});
}

TEST_CASE("gpipe: PyTorch ScheduleGPipe, all forwards then backwards 0..m-1 (p=4, m=4)",
          "[schedules]") {
  const Plan plan = make_schedule("gpipe", params(4, 4));
  for (const auto& line : text(plan)) REQUIRE(line == "F0 F1 F2 F3 BW0 BW1 BW2 BW3");
}

TEST_CASE("interleaved: Megatron's chunk grouping and warm-up (p=2, m=4, v=2)",
          "[schedules]") {
  const Plan plan = make_schedule("interleaved", params(2, 4, 2));
  REQUIRE(plan.chunks == 2);
  REQUIRE(plan.stage_of == std::vector<std::vector<int>>{{0, 2}, {1, 3}});
  REQUIRE(text(plan) ==
          std::vector<std::string>{
              "F0 F1 F0.c1 F1.c1 F2 BW0.c1 F3 BW1.c1 F2.c1 BW0 F3.c1 BW1 BW2.c1 BW3.c1 BW2 BW3",
              "F0 F1 F0.c1 BW0.c1 F1.c1 BW1.c1 F2 BW0 F3 BW1 F2.c1 BW2.c1 F3.c1 BW3.c1 BW2 BW3",
          });
}

TEST_CASE("interleaved: Megatron's order for p=4, m=8, v=2", "[schedules]") {
  const Plan plan = make_schedule("interleaved", params(4, 8, 2));
  REQUIRE(plan.stage_of == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  REQUIRE(text(plan) ==
          std::vector<std::string>{
              "F0 F1 F2 F3 F0.c1 F1.c1 F2.c1 F3.c1 F4 F5 F6 BW0.c1 F7 BW1.c1 F4.c1 BW2.c1 F5.c1 "
              "BW3.c1 F6.c1 BW0 F7.c1 BW1 BW2 BW3 BW4.c1 BW5.c1 BW6.c1 BW7.c1 BW4 BW5 BW6 BW7",
              "F0 F1 F2 F3 F0.c1 F1.c1 F2.c1 F3.c1 F4 BW0.c1 F5 BW1.c1 F6 BW2.c1 F7 BW3.c1 F4.c1 "
              "BW0 F5.c1 BW1 F6.c1 BW2 F7.c1 BW3 BW4.c1 BW5.c1 BW6.c1 BW7.c1 BW4 BW5 BW6 BW7",
              "F0 F1 F2 F3 F0.c1 F1.c1 F2.c1 BW0.c1 F3.c1 BW1.c1 F4 BW2.c1 F5 BW3.c1 F6 BW0 F7 "
              "BW1 F4.c1 BW2 F5.c1 BW3 F6.c1 BW4.c1 F7.c1 BW5.c1 BW6.c1 BW7.c1 BW4 BW5 BW6 BW7",
              "F0 F1 F2 F3 F0.c1 BW0.c1 F1.c1 BW1.c1 F2.c1 BW2.c1 F3.c1 BW3.c1 F4 BW0 F5 BW1 F6 "
              "BW2 F7 BW3 F4.c1 BW4.c1 F5.c1 BW5.c1 F6.c1 BW6.c1 F7.c1 BW7.c1 BW4 BW5 BW6 BW7",
          });
}

TEST_CASE("zb-h1: 1F1B with W deferred by the rank index (p=4, m=8)", "[schedules]") {
  const Plan plan = make_schedule("zb-h1", params(4, 8));
  REQUIRE(text(plan) ==
          std::vector<std::string>{
              "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7",
              "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7",
              "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7",
              "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7",
          });
}

TEST_CASE("zb-h2: doubled warm-up, W deferred by twice the rank index (p=4, m=8)",
          "[schedules]") {
  const Plan plan = make_schedule("zb-h2", params(4, 8));
  REQUIRE(text(plan) ==
          std::vector<std::string>{
              "F0 F1 F2 F3 F4 F5 F6 B0 W0 F7 B1 W1 B2 W2 B3 W3 B4 W4 B5 W5 B6 W6 B7 W7",
              "F0 F1 F2 F3 F4 B0 F5 B1 F6 B2 W0 F7 B3 W1 B4 W2 B5 W3 B6 W4 B7 W5 W6 W7",
              "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 W0 F7 B5 W1 B6 W2 B7 W3 W4 W5 W6 W7",
              "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 W0 F7 B7 W1 W2 W3 W4 W5 W6 W7",
          });
}

TEST_CASE("zb-v: PyTorch ScheduleZBVZeroBubble order and V placement (p=4, m=8)",
          "[schedules]") {
  const Plan plan = make_schedule("zb-v", params(4, 8));
  REQUIRE(plan.chunks == 2);
  REQUIRE(plan.stage_of == std::vector<std::vector<int>>{{0, 7}, {1, 6}, {2, 5}, {3, 4}});
  REQUIRE(text(plan) ==
          std::vector<std::string>{
              "F0 F1 F2 F3 F4 F5 F6 F0.c1 B0.c1 W0.c1 F1.c1 B1.c1 W1.c1 F2.c1 B2.c1 W2.c1 F3.c1 "
              "B3.c1 W3.c1 F7 B0 W0 F4.c1 B4.c1 W4.c1 B1 W1 F5.c1 B5.c1 W5.c1 B2 W2 F6.c1 B6.c1 "
              "W6.c1 B3 W3 F7.c1 B7.c1 W7.c1 B4 W4 B5 W5 B6 W6 B7 W7",
              "F0 F1 F2 F3 F4 F0.c1 F5 F1.c1 B0.c1 W0.c1 F2.c1 B1.c1 W1.c1 F3.c1 B2.c1 W2.c1 F6 "
              "B0 W0 F4.c1 B3.c1 W3.c1 F7 B1 W1 F5.c1 B4.c1 W4.c1 B2 W2 F6.c1 B5.c1 W5.c1 B3 W3 "
              "F7.c1 B6.c1 W6.c1 B4 B7.c1 B5 W4 B6 W5 B7 W6 W7.c1 W7",
              "F0 F1 F2 F0.c1 F3 F1.c1 F4 F2.c1 B0.c1 W0.c1 F3.c1 B1.c1 W1.c1 F5 B0 W0 F4.c1 "
              "B2.c1 W2.c1 F6 B1 W1 F5.c1 B3.c1 W3.c1 F7 B2 W2 F6.c1 B4.c1 W4.c1 B3 W3 F7.c1 "
              "B5.c1 W5.c1 B4 B6.c1 B5 B7.c1 B6 W4 B7 W5 W6.c1 W7.c1 W6 W7",
              "F0 F0.c1 F1 F1.c1 F2 F2.c1 F3 F3.c1 B0.c1 W0.c1 F4 B0 W0 F4.c1 B1.c1 W1.c1 F5 B1 "
              "W1 F5.c1 B2.c1 W2.c1 F6 B2 W2 F6.c1 B3.c1 W3.c1 F7 B3 W3 F7.c1 B4.c1 W4.c1 B4 "
              "B5.c1 B5 B6.c1 B6 B7.c1 B7 W4 W5.c1 W6.c1 W7.c1 W5 W6 W7",
          });
}

TEST_CASE("zb-v with m < 2p-1 drops the padding micro-batches as PyTorch does",
          "[schedules]") {
  const Plan plan = make_schedule("zb-v", params(2, 2));
  REQUIRE(text(plan) == std::vector<std::string>{
                            "F0 F1 F0.c1 B0.c1 W0.c1 F1.c1 B1.c1 W1.c1 B0 W0 B1 W1",
                            "F0 F0.c1 F1 F1.c1 B0.c1 W0.c1 B0 W0 B1.c1 W1.c1 B1 W1",
                        });
}

TEST_CASE("tdpipe: slice orders from the list scheduler", "[schedules][tdpipe]") {
  SECTION("p=2, m=2, S=2: the cap is reached at micro-batch granularity") {
    const Plan plan = make_schedule("tdpipe", params(2, 2, 1, 2));
    REQUIRE(plan.slices == 2);
    REQUIRE(plan.chunks == 1);
    REQUIRE(text(plan) == std::vector<std::string>{
                              "F0:s0 F0:s1 F1:s0 F1:s1 BW0:s1 BW0:s0 BW1:s1 BW1:s0",
                              "F0:s0 F0:s1 BW0:s1 BW0:s0 F1:s0 F1:s1 BW1:s1 BW1:s0",
                          });
  }
  SECTION("p=3, m=4, S=2, equal slices") {
    const Plan plan = make_schedule("tdpipe", params(3, 4, 1, 2));
    REQUIRE(text(plan) ==
            std::vector<std::string>{
                "F0:s0 F0:s1 F1:s0 F1:s1 F2:s0 F2:s1 BW0:s1 BW0:s0 F3:s0 F3:s1 BW1:s1 BW1:s0 "
                "BW2:s1 BW2:s0 BW3:s1 BW3:s0",
                "F0:s0 F0:s1 F1:s0 F1:s1 BW0:s1 BW0:s0 F2:s0 F2:s1 BW1:s1 BW1:s0 F3:s0 F3:s1 "
                "BW2:s1 BW2:s0 BW3:s1 BW3:s0",
                "F0:s0 F0:s1 BW0:s1 BW0:s0 F1:s0 F1:s1 BW1:s1 BW1:s0 F2:s0 F2:s1 BW2:s1 BW2:s0 "
                "F3:s0 F3:s1 BW3:s1 BW3:s0",
            });
  }
  SECTION("uneven slice costs interleave forward and backward slices") {
    // F costs 2 then 1, BW twice that. Rank 0 hits its cap of 4 slices at t=6, runs
    // BW0:s1 once rank 1's is done (t=7..9), and while BW0:s0 waits for rank 1 (t=11)
    // it fits F2:s0 (t=9..11); F2:s1 likewise fills the wait for BW1:s1.
    ScheduleParams sp = params(2, 3, 1, 2);
    sp.slice_costs = {2.0, 1.0};
    const Plan plan = make_schedule("tdpipe", sp);
    REQUIRE(text(plan) ==
            std::vector<std::string>{
                "F0:s0 F0:s1 F1:s0 F1:s1 BW0:s1 F2:s0 BW0:s0 F2:s1 BW1:s1 BW1:s0 BW2:s1 BW2:s0",
                "F0:s0 F0:s1 BW0:s1 BW0:s0 F1:s0 F1:s1 BW1:s1 BW1:s0 F2:s0 F2:s1 BW2:s1 BW2:s0",
            });
  }
}

TEST_CASE("tdpipe with S=1 is exactly 1f1b", "[schedules][tdpipe]") {
  for (int p = 1; p <= 7; ++p) {
    for (int m = 1; m <= 13; ++m) {
      INFO("p=" << p << " m=" << m);
      const Plan ref = make_schedule("1f1b", params(p, m));
      ScheduleParams sp = params(p, m, 1, 1);
      const Plan td = make_schedule("tdpipe", sp);
      REQUIRE(td.ranks == ref.ranks);
      sp.slice_costs = {3.5};  // the single slice's cost does not matter
      REQUIRE(make_schedule("tdpipe", sp).ranks == ref.ranks);
    }
  }
}

TEST_CASE("every schedule is complete and can run to the end", "[schedules]") {
  struct Case {
    std::string name;
    int p, m, v, S;
  };
  std::vector<Case> cases;
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 14; ++m) {
      for (const char* name : {"gpipe", "1f1b", "zb-h1", "zb-h2", "zb-v"})
        cases.push_back({name, p, m, 1, 1});
      if (m % p == 0)
        for (int v = 1; v <= 3; ++v) cases.push_back({"interleaved", p, m, v, 1});
      for (int S = 1; S <= 4; ++S) cases.push_back({"tdpipe", p, m, 1, S});
    }
  }
  for (const auto& c : cases) {
    INFO(c.name << " p=" << c.p << " m=" << c.m << " v=" << c.v << " S=" << c.S);
    const Plan plan = make_schedule(c.name, params(c.p, c.m, c.v, c.S));
    check_complete(plan);
    const ReplayOut out = replay(plan, Costs{0, 0, 0});
    INFO(out.stuck);
    REQUIRE(out.completed);
  }
}

TEST_CASE("tdpipe: uneven costs and custom caps stay complete and runnable",
          "[schedules][tdpipe]") {
  const std::vector<std::vector<double>> cost_sets = {
      {1, 1, 1}, {3, 1, 2}, {0.5, 2, 4}, {5, 0.25, 1}};
  for (int p = 1; p <= 5; ++p) {
    for (int m : {1, 3, 8}) {
      for (const auto& costs : cost_sets) {
        for (int cap : {0, 3, 6, 11}) {
          ScheduleParams sp = params(p, m, 1, 3);
          sp.slice_costs = costs;
          sp.max_inflight = cap;
          INFO("p=" << p << " m=" << m << " cap=" << cap << " c0=" << costs[0]);
          const Plan plan = make_schedule("tdpipe", sp);
          check_complete(plan);
          REQUIRE(replay(plan, Costs{0, 0, 0}).completed);
          const int limit = cap > 0 ? cap : p * 3;
          for (int peak : peak_inflight(plan)) REQUIRE(peak <= limit);
        }
      }
    }
  }
}

TEST_CASE("the replay check catches an order that cannot complete", "[schedules]") {
  Plan plan = make_schedule("1f1b", params(2, 2));
  std::swap(plan.ranks[1][0], plan.ranks[1][1]);  // BW0 before F0 on the last rank
  const ReplayOut out = replay(plan, Costs{});
  REQUIRE_FALSE(out.completed);
  REQUIRE(out.stuck.find("rank1 blocked at BW0") != std::string::npos);
}

TEST_CASE("in-flight activations per rank", "[schedules]") {
  SECTION("1f1b: rank r holds at most min(p - r, m)") {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 10; ++m) {
        const auto peaks = peak_inflight(make_schedule("1f1b", params(p, m)));
        for (int r = 0; r < p; ++r) REQUIRE(peaks[r] == std::min(p - r, m));
      }
    }
  }
  SECTION("gpipe: every rank holds all m") {
    for (int m : {1, 4, 9})
      REQUIRE(peak_inflight(make_schedule("gpipe", params(4, m))) == std::vector<int>(4, m));
  }
  SECTION("zb-h1 keeps 1F1B's p on every rank; zb-h2 holds 2p-1 (until each W)") {
    REQUIRE(peak_inflight(make_schedule("zb-h1", params(4, 8))) == std::vector<int>(4, 4));
    REQUIRE(peak_inflight(make_schedule("zb-h2", params(4, 8))) == std::vector<int>(4, 7));
    REQUIRE(peak_inflight(make_schedule("zb-h2", params(5, 20))) == std::vector<int>(5, 9));
  }
  SECTION("tdpipe: rank r holds (p - r)·S slices, or max_inflight") {
    ScheduleParams sp = params(4, 8, 1, 3);
    REQUIRE(peak_inflight(make_schedule("tdpipe", sp)) == std::vector<int>{12, 9, 6, 3});
    sp.max_inflight = 4;
    REQUIRE(peak_inflight(make_schedule("tdpipe", sp)) == std::vector<int>{4, 4, 4, 3});
  }
}

TEST_CASE("closed forms under a dependency-driven replay", "[schedules]") {
  const int p = 4, m = 8;
  SECTION("gpipe and 1f1b idle (p-1)(F+B+W) per rank") {
    const Costs c{3, 2, 1};
    for (const char* name : {"gpipe", "1f1b"}) {
      const ReplayOut out = replay(make_schedule(name, params(p, m)), c);
      REQUIRE(out.idle == std::vector<std::int64_t>(p, (p - 1) * (3 + 2 + 1)));
    }
  }
  SECTION("zb-h1 idles (p-1)(F+B-W) per rank when W <= F") {
    for (const Costs c : {Costs{3, 2, 1}, Costs{2, 2, 2}, Costs{4, 3, 2}, Costs{2, 5, 1}}) {
      const ReplayOut out = replay(make_schedule("zb-h1", params(p, m)), c);
      REQUIRE(out.idle == std::vector<std::int64_t>(p, (p - 1) * (c.f + c.b - c.w)));
    }
  }
  SECTION("zb-h2 idles (p-1)·max(F, F+B-2W): only the start offset when F = B = W") {
    for (const Costs c : {Costs{1, 1, 1}, Costs{3, 2, 1}, Costs{2, 3, 1}, Costs{5, 5, 2},
                          Costs{2, 1, 1}}) {
      const ReplayOut out = replay(make_schedule("zb-h2", params(p, 12)), c);
      REQUIRE(out.idle ==
              std::vector<std::int64_t>(p, (p - 1) * std::max(c.f, c.f + c.b - 2 * c.w)));
    }
  }
  SECTION("zb-v with F = B = W idles only the start offset (p-1)F") {
    const ReplayOut out = replay(make_schedule("zb-v", params(p, m)), Costs{1, 1, 1});
    REQUIRE(out.idle == std::vector<std::int64_t>(p, p - 1));
  }
  SECTION("interleaved divides 1F1B's bubble by v") {
    // Per-chunk costs F = 2, BW = 4: 1F1B with whole-rank costs 2v and 4v idles
    // (p-1)(F+BW)·v; interleaved idles (p-1)(F+BW).
    const ReplayOut out = replay(make_schedule("interleaved", params(p, m, 2)), Costs{2, 3, 1});
    REQUIRE(out.idle == std::vector<std::int64_t>(p, (p - 1) * (2 + 4)));
  }
  SECTION("tdpipe with S equal slices divides 1F1B's bubble by S") {
    for (int S : {1, 2, 4}) {
      // A slice costs F = 1, BW = 2 (the scheduler's own ratio): a micro-batch F = S.
      const ReplayOut out = replay(make_schedule("tdpipe", params(p, m, 1, S)), Costs{1, 1, 1});
      REQUIRE(out.idle == std::vector<std::int64_t>(p, (p - 1) * (1 + 2)));
      const ReplayOut ref = replay(make_schedule("1f1b", params(p, m)), Costs{S, S, S});
      REQUIRE(ref.idle[0] == S * out.idle[0]);
    }
  }
}

TEST_CASE("bad names and impossible parameters are rejected with what was expected",
          "[schedules]") {
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(make_schedule("pipedream", params(2, 2)),
                      Contains("unknown schedule 'pipedream'") &&
                          Contains("gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, tdpipe"));
  REQUIRE_THROWS_AS(make_schedule("pipedream", params(2, 2)), tdpipe::Error);
  REQUIRE_THROWS_WITH(make_schedule("1f1b", params(0, 2)),
                      Contains("schedule 1f1b: stages (p) = 0") && Contains("at least 1"));
  REQUIRE_THROWS_WITH(make_schedule("gpipe", params(2, 0)),
                      Contains("schedule gpipe: microbatches (m) = 0"));
  REQUIRE_THROWS_WITH(make_schedule("interleaved", params(2, 4, 0)),
                      Contains("chunks (v) = 0"));
  REQUIRE_THROWS_WITH(make_schedule("tdpipe", params(2, 4, 1, 0)),
                      Contains("schedule tdpipe: slices (S) = 0"));
  REQUIRE_THROWS_WITH(make_schedule("interleaved", params(4, 6, 2)),
                      Contains("m = 6 is not a multiple of stages p = 4") &&
                          Contains("m % p == 0") && Contains("e.g. m = 8"));
  REQUIRE_THROWS_WITH(make_schedule("interleaved", params(4, 2, 2)),
                      Contains("m = 2 is not a multiple of stages p = 4"));

  ScheduleParams sp = params(2, 4, 1, 3);
  sp.slice_costs = {1.0, 2.0};
  REQUIRE_THROWS_WITH(make_schedule("tdpipe", sp),
                      Contains("slice_costs has 2 entries") && Contains("S = 3"));
  sp.slice_costs = {1.0, 0.0, 2.0};
  REQUIRE_THROWS_WITH(make_schedule("tdpipe", sp),
                      Contains("slice_costs[1] = 0") && Contains("greater than 0"));
  sp.slice_costs.clear();
  sp.max_inflight = 2;
  REQUIRE_THROWS_WITH(make_schedule("tdpipe", sp),
                      Contains("max_inflight = 2") && Contains("at least S = 3"));
  sp.max_inflight = -1;
  REQUIRE_THROWS_AS(make_schedule("tdpipe", sp), tdpipe::Error);
}
