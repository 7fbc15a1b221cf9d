// test_timeline.cpp — measured CUDA intervals → Trace conversion (CPU only).
#include <catch2/catch.hpp>

#include "tdpipe/exec/cuda/timeline.hpp"
#include "tdpipe/ir/error.hpp"

using namespace tdpipe::exec::cuda;
using tdpipe::ir::Op;
using tdpipe::ir::OpKind;
using tdpipe::ir::Stream;
using Catch::Matchers::Contains;

namespace {
Op op(OpKind kind, int mb, int chunk = 0, int slice = 0) {
  Op o;
  o.kind = kind;
  o.mb = mb;
  o.chunk = chunk;
  o.slice = slice;
  o.stream = tdpipe::ir::default_stream(kind);
  return o;
}
}  // namespace

TEST_CASE("trace names follow the plan text form", "[timeline]") {
  CHECK(trace_name(op(OpKind::F, 3)) == "F3");
  CHECK(trace_name(op(OpKind::B, 0, 1, 2)) == "B0.c1:s2");
  CHECK(trace_name(op(OpKind::W, 4, 0, 1)) == "W4:s1");
  Op s = op(OpKind::SEND, 2, 1);
  s.payload = OpKind::F;
  s.peer = 1;
  CHECK(trace_name(s) == "SEND(F2.c1>r1)");
  Op r = op(OpKind::RECV, 3);
  r.payload = OpKind::B;
  r.peer = 2;
  CHECK(trace_name(r) == "RECV(B3<r2)");
  Op a = op(OpKind::ALLREDUCE, -1);
  a.tag = 2;
  CHECK(trace_name(a) == "ALLREDUCE(b2)");
  CHECK(trace_name(op(OpKind::OPT, -1)) == "OPT");
}

TEST_CASE("intervals become integer-ns events sorted per rank and stream", "[timeline]") {
  Op send = op(OpKind::SEND, 0);
  send.payload = OpKind::F;
  send.peer = 1;
  send.bytes = 4096;
  std::vector<TimedOp> ops = {
      {1, op(OpKind::F, 0), 0.5, 1.25},
      {0, op(OpKind::F, 1), 1.0, 2.0},
      {0, send, 0.75, 0.8},
      {0, op(OpKind::F, 0), 0.0, 0.5},
  };
  TimelineInfo info{"1f1b", "tiny", 2, {{"device", "NVIDIA H200"}}};
  tdpipe::traces::Trace t = build_trace(ops, info);
  CHECK(t.origin == "cuda");
  CHECK(t.schedule == "1f1b");
  CHECK(t.ranks == 2);
  CHECK(t.metadata.at("device") == "NVIDIA H200");
  REQUIRE(t.events.size() == 4);
  CHECK(t.events[0].name == "F0");
  CHECK(t.events[0].rank == 0);
  CHECK(t.events[0].start_ns == 0);
  CHECK(t.events[0].dur_ns == 500000);
  CHECK(t.events[1].name == "F1");
  CHECK(t.events[1].start_ns == 1000000);
  CHECK(t.events[2].name == "SEND(F0>r1)");
  CHECK(t.events[2].stream == static_cast<int>(Stream::P2P));
  CHECK(t.events[2].start_ns == 750000);
  CHECK(t.events[2].dur_ns == 50000);
  CHECK(t.events[2].bytes == 4096);
  CHECK(t.events[2].peer == 1);
  CHECK(t.events[3].rank == 1);
  CHECK(t.events[3].dur_ns == 750000);
  CHECK(*t.events[3].kind == OpKind::F);
}

TEST_CASE("bad intervals are errors naming rank and op", "[timeline]") {
  TimelineInfo info{"1f1b", "tiny", 2, {}};
  CHECK_THROWS_WITH(build_trace({{0, op(OpKind::B, 2), 2.0, 1.0}}, info),
                    Contains("rank 0 op B2 ends before it starts"));
  CHECK_THROWS_WITH(build_trace({{1, op(OpKind::F, 0), -0.5, 1.0}}, info),
                    Contains("rank 1 op F0 starts 0.5") && Contains("before the origin event"));
  CHECK_THROWS_WITH(build_trace({{2, op(OpKind::F, 0), 0, 1.0}}, info),
                    Contains("on rank 2 but the trace has 2 ranks"));
}

TEST_CASE("trace names are the interpreter's event names, chunked collectives and streams included",
          "[timeline]") {
  Op a = op(OpKind::ALLREDUCE, -1, 1);
  a.tag = 0;
  CHECK(trace_name(a) == "ALLREDUCE(b0.c1)");
  Op moved = op(OpKind::F, 5);
  moved.stream = Stream::P2P;  // an op off its default stream carries the suffix
  CHECK(trace_name(moved).rfind("F5@", 0) == 0);
  Op send = op(OpKind::SEND, 1, 0, 3);
  send.payload = OpKind::B;
  send.peer = 0;
  for (const Op& o : {a, moved, send, op(OpKind::W, 2, 1, 1), op(OpKind::OPT, -1)}) {
    INFO(trace_name(o));
    CHECK(trace_name(o) == tdpipe::traces::event_of(o, 0, 0, 0).name);
    const tdpipe::traces::Trace t = build_trace({{0, o, 0.0, 0.001}}, TimelineInfo{"x", "y", 1, {}});
    CHECK(t.events.at(0).name == trace_name(o));
    CHECK(t.events.at(0).dur_ns == 1000);
  }
}
