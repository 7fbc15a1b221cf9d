// model_test.cpp — TimelineModel and pairing: lanes, shifts, pairing, hit testing.
#include <catch2/catch.hpp>

#include "synthetic.hpp"
#include "tdpipe/traces/pairing.hpp"
#include "tdpipe/viz/timeline_model.hpp"

using namespace tdpipe;
using namespace tdpipe::viz;
using tdpipe::viz::testing::find_event;
using tdpipe::viz::testing::make_1f1b;
using tdpipe::viz::testing::OneFOneB;

TEST_CASE("pair_ops matches the same op of two 1F1B timelines", "[pairing]") {
  const auto pred = make_1f1b({});
  OneFOneB jittered;
  jittered.seed = 7;
  const auto meas = make_1f1b(jittered);
  REQUIRE(pred.events.size() == meas.events.size());
  const traces::OpPairing p = traces::pair_ops(pred, meas);
  CHECK(p.pairs == static_cast<int>(pred.events.size()));
  for (std::size_t i = 0; i < pred.events.size(); ++i) {
    const int j = p.pred_to_meas[i];
    REQUIRE(j >= 0);
    const auto& a = pred.events[i];
    const auto& b = meas.events[static_cast<std::size_t>(j)];
    CHECK(a.rank == b.rank);
    CHECK(a.kind == b.kind);
    CHECK(a.mb == b.mb);
    CHECK(a.peer == b.peer);
    CHECK(p.meas_to_pred[static_cast<std::size_t>(j)] == static_cast<int>(i));
  }
}

TEST_CASE("TimelineModel puts each predicted lane directly above its measured lane", "[model]") {
  OneFOneB c;
  c.p = 3;
  c.m = 4;
  auto pred = make_1f1b(c);
  c.seed = 3;
  auto meas = make_1f1b(c);
  TimelineModel m;
  m.set_traces({pred, meas});
  // 3 ranks × {compute, p2p} × {pred, meas}
  REQUIRE(m.lanes().size() == 12);
  for (std::size_t i = 0; i < m.lanes().size(); i += 2) {
    const Lane& top = m.lanes()[i];
    const Lane& below = m.lanes()[i + 1];
    CHECK(top.trace == 0);
    CHECK(below.trace == 1);
    CHECK(top.rank == below.rank);
    CHECK(top.stream == below.stream);
    CHECK(below.y == top.y + top.height + kLaneGap);
  }
  CHECK(m.lanes()[0].rank == 0);
  CHECK(m.lanes()[0].stream == 0);
  CHECK(m.lanes()[0].compute);
  CHECK(m.lanes()[0].height == kComputeLaneHeight);
  CHECK(m.lanes()[2].stream == 1);
  CHECK_FALSE(m.lanes()[2].compute);
  CHECK(m.lanes()[2].height == kCommLaneHeight);
  CHECK(m.lanes()[4].rank == 1);
  CHECK(m.lanes()[4].y == m.lanes()[3].y + kCommLaneHeight + kLaneGap + kRankGap);
  CHECK(m.lanes()[0].label == "r0 compute · pred");
  CHECK(m.lanes()[3].label == "r0 p2p · meas");
  CHECK(m.ranks() == 3);
  CHECK(m.total_height() == m.lanes().back().y + m.lanes().back().height + kLaneGap);
  // Every event sits in exactly one lane of its side.
  std::size_t n = 0;
  for (const Lane& l : m.lanes()) n += l.events.size();
  CHECK(n == pred.events.size() + meas.events.size());
}

TEST_CASE("TimelineModel shifts traces to start at 0 and hit-tests ops and gaps", "[model]") {
  OneFOneB c;  // p=4, F=1 ms, comm=0.1 ms
  auto pred = make_1f1b(c);
  for (auto& e : pred.events) e.start_ns += 5'000'000;  // an absolute origin
  TimelineModel m;
  m.set_traces({pred});
  CHECK(m.shift_ns(0) == 5'000'000);
  CHECK(m.lanes().size() == 8);  // 4 ranks × {compute, p2p}
  CHECK_FALSE(m.has(1));
  CHECK(m.end_ns(1) == 0);

  // The last stage waits (p−1)(F + comm) for its first forward: a bubble.
  const int lane3 = 6;  // rank 3 compute
  REQUIRE(m.lanes()[lane3].rank == 3);
  REQUIRE(m.lanes()[lane3].compute);
  const auto gap = m.gap_at(lane3, 1'000'000);
  REQUIRE(gap);
  CHECK(gap->first == 0);
  CHECK(gap->second == 3 * 1'100'000);
  CHECK_FALSE(m.op_at(lane3, 1'000'000));
  const auto f0 = m.op_at(lane3, 3'500'000);
  REQUIRE(f0);
  CHECK(m.event(*f0).kind == ir::OpKind::F);
  CHECK(m.event(*f0).mb == 0);
  CHECK(m.event(*f0).start_ns == 3'300'000);
  CHECK_FALSE(m.gap_at(lane3, 3'500'000));
  CHECK(m.twins(*f0).empty());  // one trace: no twin
  CHECK_FALSE(m.twin(*f0, 1));
  // lane_at_y: inside a lane, and in the gap between ranks.
  CHECK(m.lane_at_y(m.lanes()[lane3].y + 3) == lane3);
  CHECK(m.lane_at_y(m.lanes()[1].y + m.lanes()[1].height + 1) == -1);
  CHECK(m.lane_at_y(-5) == -1);
}

TEST_CASE("TimelineModel.twin follows the pairing both ways", "[model][pairing]") {
  const auto pred = make_1f1b({});
  OneFOneB c;
  c.seed = 11;
  const auto meas = make_1f1b(c);
  TimelineModel m;
  m.set_traces({pred, meas});
  const int i = find_event(m.trace(0), 2, ir::OpKind::BW, 5);
  REQUIRE(i >= 0);
  const auto twin = m.twin({0, i}, 1);
  REQUIRE(twin);
  CHECK(twin->trace == 1);
  const auto& e = m.event(*twin);
  CHECK(e.rank == 2);
  CHECK(e.kind == ir::OpKind::BW);
  CHECK(e.mb == 5);
  CHECK(m.twin(*twin, 0) == OpId{0, i});
  CHECK(m.twins({0, i}) == std::vector<OpId>{*twin});
  CHECK(m.lane_of(*twin) == m.lane_of({0, i}) + 1);
}

TEST_CASE("TimelineModel shows foreign traces with one lane per pid and tid", "[model]") {
  TimelineModel m;
  m.set_traces({tdpipe::viz::testing::make_foreign(1'700'000'000'000'000)});
  REQUIRE(m.lanes().size() == 2);
  CHECK(m.lanes()[0].label == "r0 tid 7 · pred");
  CHECK(m.lanes()[0].compute);  // unknown purpose: idle is shown as bubble
  CHECK(m.end_ns(0) == 3'500'000 + 600'000);
  const auto op = m.op_at(1, 500'000 + 100);
  REQUIRE(op);
  CHECK(m.event(*op).name == "matmul");
}
