// test_offload.cpp — parameter offload in the IR: the LOAD/OFFLOAD ops lowering adds
// (order, gates, window), their exact replay timing (segments gated by their LOADs),
// and the validator's refusals.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/lowering.hpp"
#include "tdpipe/ir/plan_io.hpp"
#include "tdpipe/ir/replay.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/ir/validate.hpp"

using namespace tdpipe::ir;
using tdpipe::Error;

namespace {

/// One rank, F0 then BW0, three layer blocks of 10 bytes, a window of two, state ratio 6;
/// a copy takes `bytes` ns.
Plan offloaded_plan() {
  Plan plan = plan_from_text("rank0: F0 BW0\n");
  LoweringOptions opt;
  opt.offload_blocks = [](int, int) { return std::vector<std::int64_t>{10, 10, 10}; };
  opt.copy_seconds = [](int, std::int64_t bytes) { return static_cast<double>(bytes) * 1e-9; };
  opt.offload_window = 2;
  opt.offload_state_ratio = 6;
  return lower(plan, opt);
}

/// "KIND.tag<dep@ready_after" for each copy op, in plan order.
std::string copies(const Plan& plan) {
  std::string out;
  for (const Op& op : plan.ranks[0]) {
    if (op.stream != Stream::Copy) continue;
    if (!out.empty()) out += ' ';
    out += std::string(op.kind == OpKind::LOAD ? "L" : "O") + std::to_string(op.tag) + "/" + std::to_string(op.bytes);
    if (!op.deps.empty())
      out += "<" + op_to_text(plan.at(op.deps.front())) + "@" + std::to_string(op.ready_after).substr(0, 4);
  }
  return out;
}

}  // namespace

TEST_CASE("lower with parameter offload: a LOAD per layer in use order, a window of two, OPT's state in and out",
          "[lowering][offload]") {
  const Plan low = offloaded_plan();
  REQUIRE(low.ranks[0].size() == 3 + 12);  // F0 BW0 OPT, then 9 LOADs and 3 OFFLOADs
  // F takes the layers first to last, BW last to first, OPT first to last with each
  // block's OFFLOAD (state 60 B + weights 10 B) freeing the slot of the LOAD two later.
  CHECK(copies(low) ==
        "L0/10 L1/10 L2/10<F0@0.33 L2/10<F0@0.66 L1/10<F0@1.00 L0/10<BW0@0.33 "
        "L0/60<BW0@0.66 L1/60<BW0@1.00 O0/70<OPT@0.33 L2/60<OFFLOAD@1.00 O1/70<OPT@0.66 O2/70<OPT@1.00");
  // Each weight-reading op lists its three LOADs, in the order it uses them.
  const auto gates = [&](int i) {
    std::vector<int> tags;
    for (const OpRef& d : low.ranks[0][i].deps)
      if (low.at(d).kind == OpKind::LOAD) tags.push_back(low.at(d).tag);
    return tags;
  };
  CHECK(gates(0) == std::vector<int>{0, 1, 2});
  CHECK(gates(1) == std::vector<int>{2, 1, 0});
  CHECK(gates(2) == std::vector<int>{0, 1, 2});
  for (const Op& op : low.ranks[0])
    if (op.kind == OpKind::LOAD || op.kind == OpKind::OFFLOAD) {
      CHECK(op.stream == Stream::Copy);
      CHECK(op.est_seconds == Approx(op.bytes * 1e-9));
    }
  CHECK_NOTHROW(validate(low));

  SECTION("the plan file keeps the copies, their stream and ready_after") {
    Plan with = low;  // a plan file carries a valid scenario
    with.scenario = load_scenario(std::string(TDPIPE_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml");
    const Plan back = plan_from_json(to_json(with));
    CHECK(back.ranks == low.ranks);
  }
}

TEST_CASE("replay with parameter offload: segments wait for their LOAD, LOADs for the block they replace (hand-computed)",
          "[replay][offload]") {
  const Plan low = offloaded_plan();
  // F 30 ns and BW 60 ns in three segments each, OPT 30; copies as their est_seconds.
  const auto res = replay(low, [](const Op& op, int) -> std::int64_t {
    switch (op.kind) {
      case OpKind::F: return 30;
      case OpKind::BW: return 60;
      case OpKind::OPT: return 30;
      default: return std::llround(op.est_seconds * 1e9);
    }
  });
  std::string times;
  for (std::size_t i = 0; i < low.ranks[0].size(); ++i)
    times += (i ? " " : "") + std::to_string(res.timing[0][i].start_ns) + "-" + std::to_string(res.timing[0][i].end_ns);
  // F: its block 0 arrives at 10, block 1 at 20, block 2 (after F's first segment
  // freed block 0, at 20) at 30 → 10-40. BW's block 1 waits for F's end (40 → 50), its
  // block 0 for BW's first segment (60 → 70): BW 40-100. OPT's state: block 0 after BW's
  // second segment (80-140), block 1 after BW (140-200); OFFLOAD 0 after OPT's first
  // segment, behind LOAD 1 on the copy stream (200-270); block 2 after it (270-330);
  // OPT's last segment 330-340; the OFFLOADs of blocks 1 and 2 end the step at 470.
  CHECK(times ==
        "10-40 40-100 140-340 "
        "0-10 10-20 20-30 30-40 40-50 60-70 80-140 140-200 200-270 270-330 330-400 400-470");
  CHECK(res.makespan_ns == 470);
}

TEST_CASE("parameter offload: copies with no room to wait deadlock with the op named", "[replay][offload]") {
  // A window of one block whose release is the op's own end: the op's second LOAD waits
  // for the op, the op for that LOAD.
  Plan low = offloaded_plan();
  Op& second = low.ranks[0][4];  // F0's LOAD of block 1
  REQUIRE(second.kind == OpKind::LOAD);
  second.deps = {{0, 0}};
  second.ready_after = 1.0f;
  try {
    replay(low, [](const Op&, int) -> std::int64_t { return 1; });
    FAIL("expected a deadlock");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(what.find("deadlock") != std::string::npos);
    CHECK(what.find("rank 0 blocked on F0 (waits for LOAD") != std::string::npos);
  }
}

TEST_CASE("validate refuses copies off the copy stream, a LOAD gating another rank, a stray ready_after",
          "[validate][offload]") {
  const auto expect = [](Plan plan, const std::string& fragment) {
    try {
      validate(plan);
      FAIL("expected " << fragment);
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(fragment) != std::string::npos);
    }
  };
  {
    Plan low = offloaded_plan();
    low.ranks[0][3].stream = Stream::Compute;
    expect(low, "a LOAD op on the compute stream; LOAD and OFFLOAD run on the copy stream, and only they");
  }
  {
    Plan low = offloaded_plan();
    low.ranks[0][1].stream = Stream::Copy;
    expect(low, "a BW op on the copy stream");
  }
  {
    Plan low = offloaded_plan();
    low.ranks[0][3].bytes = 0;
    expect(low, "LOAD of 0 bytes; expected the block's bytes (> 0)");
  }
  {
    Plan low = offloaded_plan();
    Op& load = low.ranks[0][5];  // its first dep is F0
    load.deps.front() = {0, 3};  // another LOAD
    expect(low, "applies to a copy's first dependency, a compute op on its own rank");
  }
  {
    Plan low = offloaded_plan();
    // BW0 no longer lists its first LOAD: that block would come and never go.
    auto& deps = low.ranks[0][1].deps;
    for (auto it = deps.begin(); it != deps.end(); ++it)
      if (low.ranks[0][static_cast<std::size_t>(it->index)].kind == OpKind::LOAD) {
        deps.erase(it);
        break;
      }
    expect(low, "a LOAD gates 0 ops; expected the one F, B, BW or OPT of its rank that lists it");
  }
  {
    Plan two = plan_from_text("rank0: F0 BW0\nrank1: F0 BW0\n");
    LoweringOptions opt;
    opt.offload_blocks = [](int, int) { return std::vector<std::int64_t>{10}; };
    Plan low = lower(two, opt);
    // Rank 1's F0 waits for a LOAD of rank 0.
    for (std::size_t i = 0; i < low.ranks[0].size(); ++i)
      if (low.ranks[0][i].kind == OpKind::LOAD) {
        for (Op& op : low.ranks[1])
          if (op.kind == OpKind::F) op.deps.push_back({0, static_cast<int>(i)});
        break;
      }
    expect(low, "waits for a LOAD on rank 0; a LOAD brings weights to its own rank's device");
  }
}

TEST_CASE("gate_segment names the segment whose end lowering wrote, for any realistic segment count",
          "[ir][offload]") {
  // Lowering writes the end of segment s of n as the float (s + 1)/n; every engine reads
  // it back with gate_segment. A 1e-6 slack got n = 35, s = 17 wrong (the review's case).
  for (int n = 1; n <= 4096; ++n)
    for (int s = 0; s < n; ++s) {
      const float end = s + 1 == n ? 1.0f : static_cast<float>(s + 1) / static_cast<float>(n);
      if (gate_segment(end, n) != s) FAIL("n = " << n << ", s = " << s << ": got " << gate_segment(end, n));
    }
  // A fraction inside a segment names that segment (a bucket's ready_after).
  CHECK(gate_segment(0.3f, 4) == 1);
  CHECK(gate_segment(0.0f, 4) == 0);
  CHECK(gate_segment(1.0f, 4) == 3);
}
