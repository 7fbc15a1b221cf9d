// test_chrome_json.cpp — Trace ⇄ Chrome Trace Event JSON: exact round trip, foreign
// traces, op-name parsing and every malformed input with its message.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/traces/chrome_json.hpp"
#include "tdpipe/traces/trace_io.hpp"
#include "tdpipe/traces/op_name.hpp"

using namespace tdpipe;
using namespace tdpipe::traces;
using nlohmann::json;

namespace {

TraceEvent ev(int rank, int stream, std::string name, std::optional<ir::OpKind> kind, std::int64_t start,
              std::int64_t dur) {
  TraceEvent e;
  e.rank = rank;
  e.stream = stream;
  e.name = std::move(name);
  e.kind = kind;
  e.start_ns = start;
  e.dur_ns = dur;
  return e;
}

Trace sample() {
  Trace t;
  t.origin = "analytic";
  t.schedule = "1f1b";
  t.scenario = "tiny";
  t.ranks = 2;
  t.metadata = {{"engine", "analytic"}, {"note", "ünïcode ok"}};
  auto f = ev(0, 0, "F0.c1:s2", ir::OpKind::F, 1, 18522001);  // odd ns must survive
  f.mb = 0;
  f.chunk = 1;
  f.slice = 2;
  f.layers_ns = 17000003;  // the CPU backend's part in decoder layers
  t.events.push_back(f);
  auto s = ev(0, 1, "SEND(F0.c1:s2>r1)", ir::OpKind::SEND, 18522002, 601);
  s.mb = 0;
  s.chunk = 1;
  s.slice = 2;
  s.peer = 1;
  s.bytes = 25165824;
  t.events.push_back(s);
  t.events.push_back(ev(1, 0, "custom marker", std::nullopt, 123456789012345, 7));
  t.events.push_back(ev(1, 2, "ALLREDUCE(b0)", ir::OpKind::ALLREDUCE, 5, 0));
  return t;
}

std::string expect_error(const json& j) {
  try {
    trace_from_chrome_json(j, "bad.json");
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("no error for " << j.dump());
  return {};
}

}  // namespace

TEST_CASE("Chrome JSON round trip is exact", "[traces][chrome]") {
  const Trace t = sample();
  const json j = to_chrome_json(t);
  REQUIRE(trace_from_chrome_json(j, "mem") == t);
  // Through text too (the file form).
  REQUIRE(trace_from_chrome_json(json::parse(j.dump()), "mem") == t);

  // Perfetto's expectations: M events name every rank and stream; X events in µs.
  int process_names = 0, thread_names = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") ++process_names;
    if (e["ph"] == "M" && e["name"] == "thread_name") ++thread_names;
  }
  REQUIRE(process_names == 2);
  REQUIRE(thread_names == 4);  // rank 0: compute, p2p; rank 1: compute, dp
  const json& x = j["traceEvents"][j["traceEvents"].size() - 4];
  REQUIRE(x["ph"] == "X");
  REQUIRE(x["ts"].get<double>() == Approx(0.001));
  REQUIRE(x["dur"].get<double>() == Approx(18522.001));
  REQUIRE(x["args"]["kind"] == "F");
  REQUIRE(x["args"]["layers_us"].get<double>() == Approx(17000.003));
  REQUIRE(!j["traceEvents"][j["traceEvents"].size() - 3]["args"].contains("layers_us"));  // unknown: not written
  REQUIRE(j["otherData"]["origin"] == "analytic");
  REQUIRE(j["otherData"]["ranks"] == 2);
}

TEST_CASE("write_trace / read_trace through a file, with file errors", "[traces][chrome]") {
  // Scratch files in the temp directory: ctest runs from the source tree.
  const auto dir = std::filesystem::temp_directory_path();
  const std::string path = (dir / "tdpipe_test_chrome_json_roundtrip.json").string();
  const std::string bad = (dir / "tdpipe_test_chrome_json_bad.json").string();
  write_trace(sample(), path);
  REQUIRE(read_trace(path) == sample());
  std::remove(path.c_str());

  REQUIRE_THROWS_WITH(read_trace("/nonexistent/dir/x.json"),
                      Catch::Contains("cannot read trace '/nonexistent/dir/x.json'"));
  REQUIRE_THROWS_WITH(write_trace(sample(), "/nonexistent/dir/x.json"),
                      Catch::Contains("cannot write trace '/nonexistent/dir/x.json'"));
  {
    std::ofstream out(bad);
    out << "{\"traceEvents\": [";
  }
  REQUIRE_THROWS_WITH(read_trace(bad), Catch::Contains(bad + ": not valid JSON"));
  std::remove(bad.c_str());
}

TEST_CASE("Foreign Chrome traces: pids and tids renumbered, kinds guessed from names", "[traces][chrome]") {
  const json j = json::parse(R"J({
    "traceEvents": [
      {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "GPU 7"}},
      {"ph": "X", "name": "F0", "pid": 7, "tid": 20, "ts": 1000.5, "dur": 10},
      {"ph": "X", "name": "ncclKernel_AllReduce_RING", "pid": 3, "tid": "stream 7", "ts": 1000, "dur": 2.25,
       "args": {"bytes": 4096}},
      {"ph": "i", "name": "marker", "pid": 3, "tid": 1, "ts": 1005},
      {"ph": "X", "name": "SEND(B2.c1<r0)", "pid": 3, "tid": 20, "ts": 1010, "dur": 1},
      {"ph": "X", "name": "RECV(B2.c1<r0)", "pid": 3, "tid": 20, "ts": 1011, "dur": 1},
      {"ph": "X", "name": "BW3:s1", "pid": 3, "tid": 20, "ts": 1012, "dur": 1}
    ],
    "distributedInfo": {"rank": 0}
  })J");
  const Trace t = trace_from_chrome_json(j, "kineto.json");
  REQUIRE(t.origin == "chrome");
  REQUIRE(t.ranks == 2);
  REQUIRE(t.events.size() == 5);
  // pid 3 → rank 0, pid 7 → rank 1; tid 20 → 0, "stream 7" (a string) → 1; times start at 0.
  CHECK(t.events[0].rank == 1);
  CHECK(t.events[0].stream == 0);
  CHECK(t.events[0].start_ns == 500);
  CHECK(t.events[0].dur_ns == 10000);
  CHECK(t.events[0].kind == ir::OpKind::F);
  CHECK(t.events[0].mb == 0);
  CHECK(t.events[1].rank == 0);
  CHECK(t.events[1].stream == 1);
  CHECK(t.events[1].start_ns == 0);
  CHECK(t.events[1].dur_ns == 2250);
  CHECK_FALSE(t.events[1].kind);
  CHECK(t.events[1].bytes == 4096);
  // "SEND(… <r0)" is not valid (a SEND points with '>'): unknown kind.
  CHECK_FALSE(t.events[2].kind);
  CHECK(t.events[3].kind == ir::OpKind::RECV);
  CHECK(t.events[3].peer == 0);
  CHECK(t.events[3].chunk == 1);
  CHECK(t.events[4].kind == ir::OpKind::BW);
  CHECK(t.events[4].slice == 1);

  // Kineto-style epoch timestamps (µs since 1970) are shifted to start at 0.
  const Trace epoch = trace_from_chrome_json(json::parse(R"J({"traceEvents":[
      {"ph":"X","name":"F0","pid":0,"tid":7,"ts":1697132003186540,"dur":1.5},
      {"ph":"X","name":"F1","pid":0,"tid":7,"ts":1697132003186552,"dur":2}]})J"), "epoch.json");
  CHECK(epoch.events[0].start_ns == 0);
  CHECK(epoch.events[1].start_ns == 12000);
  CHECK(epoch.events[0].dur_ns == 1500);

  // The JSON Array Format is accepted too.
  const Trace a = trace_from_chrome_json(json::parse(R"J([{"ph":"X","name":"W1","pid":0,"tid":0,"ts":0,"dur":1}])J"),
                                         "array.json");
  REQUIRE(a.events.size() == 1);
  REQUIRE(a.events[0].kind == ir::OpKind::W);
}

TEST_CASE("Op names parse back into their fields", "[traces][chrome]") {
  auto p = parse_op_name("F12.c1:s3");
  REQUIRE(p);
  CHECK(p->kind == ir::OpKind::F);
  CHECK(p->mb == 12);
  CHECK(p->chunk == 1);
  CHECK(p->slice == 3);
  p = parse_op_name("SEND(B3:s1>r2)@dp");
  REQUIRE(p);
  CHECK(p->kind == ir::OpKind::SEND);
  CHECK(p->payload == ir::OpKind::B);
  CHECK(p->mb == 3);
  CHECK(p->slice == 1);
  CHECK(p->peer == 2);
  p = parse_op_name("ALLREDUCE(b4.c1)");
  REQUIRE(p);
  CHECK(p->tag == 4);
  CHECK(p->chunk == 1);
  CHECK(p->mb == -1);
  p = parse_op_name("OPT");
  REQUIRE(p);
  CHECK(p->kind == ir::OpKind::OPT);
  CHECK(p->mb == -1);
  for (const char* bad : {"", "Forward", "F0.c", "F0:x1", "SEND(F0>1)", "RECV(F0<r1", "ALLREDUCE(0)",
                          "F0@gpu", "BWX", "f0"})
    CHECK_FALSE(parse_op_name(bad));
}

TEST_CASE("Malformed traces are rejected naming the source, event and field", "[traces][chrome]") {
  CHECK_THAT(expect_error(json(42)), Catch::Contains("bad.json: top level: expected an object"));
  CHECK_THAT(expect_error(json::object()), Catch::Contains("bad.json: top level: expected a \"traceEvents\" array"));
  CHECK_THAT(expect_error(json{{"traceEvents", 3}}), Catch::Contains("traceEvents: expected an array"));
  CHECK_THAT(expect_error(json{{"traceEvents", {1}}}), Catch::Contains("traceEvents[0]: expected an object"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"name":"F0"}]})J")),
             Catch::Contains("traceEvents[0]: field \"ph\": missing"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"M"},{"ph":"X","name":"F0","pid":0,"tid":0,"dur":1}]})J")),
             Catch::Contains("traceEvents[1]: field \"ts\": missing"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","pid":0,"tid":0,"ts":"0","dur":1}]})J")),
             Catch::Contains("traceEvents[0]: field \"ts\": expected a number"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","pid":0,"tid":0,"ts":0}]})J")),
             Catch::Contains("field \"dur\": missing"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","pid":0,"tid":0,"ts":0,"dur":-1}]})J")),
             Catch::Contains("field \"dur\": expected a duration ≥ 0"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":7,"pid":0,"tid":0,"ts":0,"dur":1}]})J")),
             Catch::Contains("field \"name\": expected a string"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","tid":0,"ts":0,"dur":1}]})J")),
             Catch::Contains("field \"pid\": missing"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","pid":[1],"tid":0,"ts":0,"dur":1}]})J")),
             Catch::Contains("field \"pid\": expected a number or a string"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","pid":0,"tid":0,"ts":0,"dur":1,"args":{"mb":"x"}}]})J")),
             Catch::Contains("field \"args.mb\": expected an integer"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","pid":0,"tid":0,"ts":0,"dur":1,"args":{"kind":"FWD"}}]})J")),
             Catch::Contains("field \"args.kind\": unknown op kind \"FWD\""));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","pid":0,"tid":0,"ts":0,"dur":1,"args":{"layers_us":2}}]})J")),
             Catch::Contains("field \"args.layers_us\": expected the µs of dur spent in layers (0 ≤ layers_us ≤ dur), got 2"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","pid":0,"tid":0,"ts":0,"dur":1,"args":{"layers_us":"x"}}]})J")),
             Catch::Contains("field \"args.layers_us\": expected the µs"));
  // tdpipe traces: pid must be a rank and within otherData.ranks.
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","pid":"r0","tid":0,"ts":0,"dur":1}],
                                          "otherData":{"generator":"tdpipe","ranks":1}})J")),
             Catch::Contains("field \"pid\": expected an integer"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","pid":3,"tid":0,"ts":0,"dur":1}],
                                          "otherData":{"generator":"tdpipe","ranks":2}})J")),
             Catch::Contains("otherData.ranks: 2 but an event is on rank 3"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","pid":0,"tid":0,"ts":1e300,"dur":1}]})J")),
             Catch::Contains("traceEvents[0]: field \"ts\": out of range"));
  // Bounds: ranks that could not be allocated, ids that would wrap, times past int64 ns.
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","pid":2147483647,"tid":0,"ts":0,"dur":1}],
                                          "otherData":{"generator":"tdpipe"}})J")),
             Catch::Contains("field \"pid\": expected an integer in [0, 1048576]"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[],"otherData":{"generator":"tdpipe","ranks":2000000000}})J")),
             Catch::Contains("otherData.ranks: expected an integer in [0, 1048576]"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"F0","pid":0,"tid":0,"ts":0,"dur":1,"args":{"mb":4294967296}}]})J")),
             Catch::Contains("field \"args.mb\": expected an integer in [-1, 2147483647], got 4294967296"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"a","pid":0,"tid":0,"ts":-8e15,"dur":1},
                                                          {"ph":"X","name":"b","pid":0,"tid":0,"ts":8e15,"dur":1}]})J")),
             Catch::Contains("expected each ≤ 4e15 µs"));
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[],"otherData":{"metadata":{"a":1}}})J")),
             Catch::Contains("otherData.metadata.a: expected a string"));
  // Fuzz finding (bench/fuzz.sh): a foreign trace with a phase that is not a string
  // escaped as nlohmann's type_error from the pid/tid renumbering pass.
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"a","pid":0,"tid":0,"ts":0,"dur":1},
                                                          {"ph":7,"name":"b","pid":0,"tid":0,"ts":0,"dur":1}]})J")),
             Catch::Contains("traceEvents[1]: field \"ph\": expected a string"));
}

TEST_CASE("trace op fields out of their range and peers that do not exist are rejected", "[traces][chrome]") {
  auto event_with = [](const std::string& args) {
    return json::parse(R"J({"traceEvents":[{"ph":"X","name":"x","pid":0,"tid":0,"ts":0,"dur":1,"args":)J" + args +
                       R"J(}],"otherData":{"generator":"tdpipe","ranks":2}})J");
  };
  CHECK_THAT(expect_error(event_with(R"({"mb":-2})")),
             Catch::Contains("traceEvents[0]: field \"args.mb\": expected an integer in [-1, 2147483647], got -2"));
  CHECK_THAT(expect_error(event_with(R"({"chunk":-1})")),
             Catch::Contains("field \"args.chunk\": expected an integer in [0, 2147483647], got -1"));
  CHECK_THAT(expect_error(event_with(R"({"slice":-1})")),
             Catch::Contains("field \"args.slice\": expected an integer in [0, 2147483647], got -1"));
  CHECK_THAT(expect_error(event_with(R"({"bytes":-5})")),
             Catch::Contains("field \"args.bytes\": expected an integer ≥ 0, got -5"));
  CHECK_THAT(expect_error(event_with(R"({"peer":7})")),
             Catch::Contains("traceEvents[0]: field \"args.peer\": rank 7 does not exist; expected -1 (none) or a rank < 2"));
  CHECK_THAT(expect_error(event_with(R"({"peer":-3})")), Catch::Contains("field \"args.peer\": expected an integer in [-1"));
  // A peer named by the op's text form counts too.
  CHECK_THAT(expect_error(json::parse(R"J({"traceEvents":[{"ph":"X","name":"SEND(F0>r5)","pid":0,"tid":1,"ts":0,"dur":1}],
                                          "otherData":{"generator":"tdpipe","ranks":2}})J")),
             Catch::Contains("rank 5 does not exist"));
  CHECK_NOTHROW(trace_from_chrome_json(event_with(R"({"mb":-1,"chunk":0,"slice":0,"peer":1,"bytes":0})"), "ok.json"));
}

TEST_CASE("trace files with duplicate keys or deep nesting are refused", "[traces][chrome]") {
  const auto path = (std::filesystem::temp_directory_path() / "tdpipe_test_trace_dup.json").string();
  std::ofstream(path) << R"({"traceEvents": [], "traceEvents": [{"ph":"X"}]})";
  CHECK_THROWS_WITH(read_trace(path), path + ": top level: key \"traceEvents\" given twice; expected each key once");
  std::ofstream(path) << R"({"traceEvents": [], "otherData": {"metadata": )" + std::string(100, '[') +
                             std::string(100, ']') + "}}";
  CHECK_THROWS_WITH(read_trace(path), Catch::StartsWith(path + ": nested deeper than 64 levels"));
  std::remove(path.c_str());
}

TEST_CASE("what Perfetto draws as written: pid and tid from 1, a cat on every event, no slices overlapping on a "
          "track, a flow from each SEND to its RECV",
          "[traces][chrome]") {
  // A p2p batch on rank 0 (SEND F0 and RECV B0 start together, end apart) and its peers.
  Trace t;
  t.origin = "analytic";
  t.ranks = 2;
  const int kCompute = 0, kP2P = 1;
  auto p2p = [&](int rank, const char* name, ir::OpKind kind, int peer, std::int64_t start, std::int64_t dur) {
    TraceEvent e = ev(rank, kP2P, name, kind, start, dur);
    e.peer = peer;
    e.mb = 0;
    return e;
  };
  t.events = {ev(0, kCompute, "F0", ir::OpKind::F, 0, 10'000),
              p2p(0, "SEND(F0>r1)", ir::OpKind::SEND, 1, 10'000, 5'000),
              p2p(0, "RECV(B0<r1)", ir::OpKind::RECV, 1, 10'000, 20'000),
              ev(0, kCompute, "BW0", ir::OpKind::BW, 30'000, 10'000),
              p2p(1, "RECV(F0<r0)", ir::OpKind::RECV, 0, 0, 15'000),
              ev(1, kCompute, "F0", ir::OpKind::F, 15'000, 5'000),
              ev(1, kCompute, "BW0", ir::OpKind::BW, 20'000, 5'000),
              p2p(1, "SEND(B0>r0)", ir::OpKind::SEND, 0, 25'000, 5'000)};
  const json j = to_chrome_json(t);
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> tracks;
  std::map<int, std::vector<std::pair<int, int>>> flow_ends;  // id → (pid, tid) of s, then f
  for (const json& e : j["traceEvents"]) {
    INFO(e.dump());
    CHECK(e.contains("cat"));
    CHECK(e["pid"].get<int>() >= 1);
    CHECK(e["tid"].get<int>() >= 1);
    if (e["ph"] == "X")
      tracks[{e["pid"], e["tid"]}].push_back({e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
    if (e["ph"] == "s" || e["ph"] == "f") flow_ends[e["id"].get<int>()].push_back({e["pid"], e["tid"]});
  }
  for (auto& [track, slices] : tracks) {
    std::sort(slices.begin(), slices.end());
    for (std::size_t k = 1; k < slices.size(); ++k) {
      INFO("pid " << track.first << " tid " << track.second);
      CHECK(slices[k].first >= slices[k - 1].second);
    }
  }
  // Rank 0's batch takes two p2p tracks; three tracks on rank 0 in all.
  int rank0_tracks = 0;
  for (const auto& [track, slices] : tracks) rank0_tracks += track.first == 1;
  CHECK(rank0_tracks == 3);
  // Two flows: rank 0's SEND to rank 1's RECV and back.
  REQUIRE(flow_ends.size() == 2);
  for (const auto& [id, ends] : flow_ends) {
    REQUIRE(ends.size() == 2);
    CHECK(ends[0].first != ends[1].first);
  }
  // And it reads back as written.
  CHECK(trace_from_chrome_json(j, "perfetto.json") == t);
  // A format-1 file (pid = rank, tid = stream, older tdpipe) still reads.
  json old = j;
  old["otherData"].erase("format");
  for (json& e : old["traceEvents"])
    if (e["ph"] == "X") e["pid"] = e["pid"].get<int>() - 1, e["tid"] = e["args"]["stream"];
  CHECK(trace_from_chrome_json(old, "old.json") == t);
  json bad = j;
  bad["otherData"]["format"] = 9;
  CHECK_THROWS_WITH(trace_from_chrome_json(bad, "bad.json"), Catch::Contains("otherData.format"));
}
