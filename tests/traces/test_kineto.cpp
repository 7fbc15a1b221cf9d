// test_kineto.cpp — Kineto JSON (per rank) and Nsight Systems SQLite as traces: tdpipe's
// own Kineto files round-trip exactly; the PyTorch profiler's record_function ranges
// and NVTX ranges named like tdpipe ops become those ops; gzip; every bad input names
// its file.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <sqlite3.h>
#include <zlib.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/traces/kineto.hpp"
#include "tdpipe/traces/trace_io.hpp"

using namespace tdpipe;
using namespace tdpipe::traces;
using nlohmann::json;

namespace {

TraceEvent op(int rank, ir::Stream stream, std::string name, ir::OpKind kind, std::int64_t start, std::int64_t dur,
              int mb = -1, int peer = -1) {
  TraceEvent e;
  e.rank = rank;
  e.stream = static_cast<int>(stream);
  e.name = std::move(name);
  e.kind = kind;
  e.mb = mb;
  e.peer = peer;
  e.start_ns = start;
  e.dur_ns = dur;
  return e;
}

// Two ranks; rank 0's batched SEND and RECV start together (two p2p lanes).
Trace sample() {
  Trace t;
  t.origin = "cpu";
  t.schedule = "1f1b";
  t.scenario = "tiny";
  t.ranks = 2;
  t.metadata = {{"step", "4"}, {"backend", "cpu"}};
  auto f = op(0, ir::Stream::Compute, "F0", ir::OpKind::F, 1000, 18522001, 0);
  f.layers_ns = 17000003;
  t.events.push_back(f);
  auto s = op(0, ir::Stream::P2P, "SEND(F0>r1)", ir::OpKind::SEND, 18523001, 601, 0, 1);
  s.bytes = 25165824;
  t.events.push_back(s);
  t.events.push_back(op(0, ir::Stream::P2P, "RECV(B0<r1)", ir::OpKind::RECV, 18523001, 90001, 0, 1));
  t.events.push_back(op(1, ir::Stream::P2P, "RECV(F0<r0)", ir::OpKind::RECV, 17000000, 1524002, 0, 0));
  t.events.push_back(op(1, ir::Stream::Compute, "F0", ir::OpKind::F, 18524003, 5000, 0));
  t.events.push_back(op(1, ir::Stream::DP, "ALLREDUCE(b0)", ir::OpKind::ALLREDUCE, 18600000, 7777));
  t.events.push_back(op(1, ir::Stream::Copy, "LOAD0.c0", ir::OpKind::LOAD, 18610000, 100));
  return t;
}

std::string temp_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("tdpipe-kineto-" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A torch.profiler-like file: host ranges (record_function), two profiler steps.
json torch_like(int rank, int world, double base_us) {
  json events = json::array();
  auto x = [&](const char* cat, const std::string& name, double ts, double dur) {
    events.push_back({{"ph", "X"}, {"cat", cat}, {"name", name}, {"pid", 4242 + rank}, {"tid", 4242 + rank},
                      {"ts", base_us + ts}, {"dur", dur}, {"args", {{"External id", 1}}}});
  };
  for (int step = 1; step <= 2; ++step) {
    const double at = (step - 1) * 1000.0;
    x("user_annotation", "ProfilerStep#" + std::to_string(step), at, 900);
    x("user_annotation", "F0", at + 10, 100.5);
    x("cpu_op", "aten::linear", at + 12, 50);  // nested: not an op, dropped
    x("user_annotation", rank == 0 ? "SEND(F0>r1)+RECV(B0<r1)" : "RECV(F0<r0)", at + 200, 30.25);
    x("user_annotation", "gloo:send", at + 205, 5);
  }
  return {{"schemaVersion", 1},
          {"distributedInfo", {{"backend", "gloo"}, {"rank", rank}, {"world_size", world}}},
          {"traceEvents", events}};
}

}  // namespace

TEST_CASE("tdpipe's Kineto files round-trip exactly and say what HTA needs", "[traces][kineto]") {
  const Trace t = sample();
  std::vector<std::pair<std::string, json>> files;
  for (int r = 0; r < t.ranks; ++r) files.emplace_back("rank" + std::to_string(r), to_kineto_json(t, r));
  Trace back = trace_from_kineto(files);
  // Events come back per rank in start order; the sample is already in that order.
  CHECK(back == t);

  const json r0 = files[0].second;
  CHECK(r0["distributedInfo"]["rank"] == 0);
  CHECK(r0["distributedInfo"]["world_size"] == 2);
  std::map<std::string, json> by_op;
  std::set<int> streams, launches;
  int steps = 0;
  for (const auto& e : r0["traceEvents"]) {
    if (e["ph"] != "X") continue;
    if (e["cat"] == "cuda_runtime") {  // each kernel's launch, correlated with it
      CHECK(e["name"] == "cudaLaunchKernel");
      launches.insert(e["args"]["correlation"].get<int>());
      continue;
    }
    if (e["cat"] == "user_annotation") {
      ++steps;
      CHECK(e["name"] == "ProfilerStep#4");  // the trace's step
      CHECK(e["ts"].get<double>() == 1.0);
      CHECK(e["dur"].get<double>() == Approx((18523001 + 90001 - 1000) / 1000.0));
      continue;
    }
    by_op[e["args"]["op"]] = e;
    CHECK(e["tid"] == e["args"]["stream"]);
    streams.insert(e["args"]["stream"].get<int>());
  }
  CHECK(steps == 1);
  CHECK(r0["baseTimeNanoseconds"] == 0);
  std::set<int> correlations;
  for (const auto& [name, e] : by_op) correlations.insert(e["args"]["correlation"].get<int>());
  CHECK(launches == correlations);
  CHECK(by_op.at("F0")["name"] == "F0");
  CHECK(by_op.at("F0")["cat"] == "kernel");
  CHECK(by_op.at("SEND(F0>r1)")["name"] == "ncclDevKernel_SendRecv");
  CHECK(by_op.at("SEND(F0>r1)")["args"]["bytes"] == 25165824);
  // SEND and RECV start together: two streams, so that no stream's kernels overlap.
  CHECK(by_op.at("SEND(F0>r1)")["args"]["stream"] != by_op.at("RECV(B0<r1)")["args"]["stream"]);
  CHECK(streams == std::set<int>{7, 8, 9});

  const json r1 = to_kineto_json(t, 1);
  std::map<std::string, std::string> names;
  for (const auto& e : r1["traceEvents"])
    if (e["ph"] == "X" && e.contains("args") && e["args"].contains("op"))
      names[e["args"]["op"]] = e["name"].get<std::string>() + "|" + e["cat"].get<std::string>();
  CHECK(names.at("ALLREDUCE(b0)") == "ncclDevKernel_AllReduce_Sum|kernel");
  CHECK(names.at("LOAD0.c0") == "Memcpy HtoD (Pinned -> Device)|gpu_memcpy");
}

TEST_CASE("write_trace(kineto) writes a folder read_trace reads back, gzip included", "[traces][kineto]") {
  const std::string dir = temp_dir("dir");
  // An earlier, larger run's files in the folder: this trace's ranks replace them.
  std::filesystem::create_directories(dir + "/run");
  write_text(dir + "/run/rank5.json", "{}");
  write_text(dir + "/run/rank2.json.gz", "x");
  write_text(dir + "/run/notes.txt", "kept");
  write_trace(sample(), dir + "/run", TraceFormat::Kineto);
  CHECK_FALSE(std::filesystem::exists(dir + "/run/rank5.json"));
  CHECK_FALSE(std::filesystem::exists(dir + "/run/rank2.json.gz"));
  CHECK(std::filesystem::exists(dir + "/run/notes.txt"));
  CHECK(std::filesystem::exists(dir + "/run/rank0.json"));
  CHECK(std::filesystem::exists(dir + "/run/rank1.json"));
  CHECK(read_trace(dir + "/run") == sample());

  // One rank's file compressed, as torch.profiler writes `*.json.gz`.
  std::ifstream in(dir + "/run/rank1.json");
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  // Two gzip members, as concatenated .gz files are: read as zcat reads them.
  const std::size_t half = text.size() / 2;
  for (const char* mode : {"wb", "ab"}) {
    gzFile gz = gzopen((dir + "/run/rank1.json.gz").c_str(), mode);
    REQUIRE(gz);
    const std::string part = std::string(mode) == "wb" ? text.substr(0, half) : text.substr(half);
    REQUIRE(gzwrite(gz, part.data(), static_cast<unsigned>(part.size())) == static_cast<int>(part.size()));
    gzclose(gz);
  }
  std::filesystem::remove(dir + "/run/rank1.json");
  CHECK(read_trace(dir + "/run") == sample());

  // A truncated gzip file is an error naming it, not a crash.
  write_text(dir + "/run/rank1.json.gz", std::string("\x1f\x8b\x08\x00", 4) + "garbage");
  CHECK_THROWS_WITH(read_trace(dir + "/run"), Catch::Contains("rank1.json.gz: gzip"));
  CHECK_THROWS_WITH(trace_format_from_string("perfetto"),
                    "trace format \"perfetto\": expected chrome or kineto");
  std::filesystem::remove_all(dir);
}

TEST_CASE("torch.profiler's ranges named like ops: the last common step, batches split, the rest dropped",
          "[traces][kineto]") {
  std::vector<std::pair<std::string, json>> files{{"a.json", torch_like(1, 2, 1.7e12 + 3)},
                                                  {"b.json", torch_like(0, 2, 1.7e12)}};
  const Trace t = trace_from_kineto(files);
  CHECK(t.origin == "kineto");
  CHECK(t.ranks == 2);
  CHECK(t.metadata.at("kineto.step") == "ProfilerStep#2");
  CHECK(t.metadata.at("kineto.files") == "2");
  CHECK(t.metadata.at("kineto.other_events") == "8");  // aten::linear and gloo:send, twice per file
  REQUIRE(t.events.size() == 5);  // rank 0: F0, SEND, RECV; rank 1: F0, RECV
  std::map<std::pair<int, std::string>, TraceEvent> by;
  for (const auto& e : t.events) by[{e.rank, e.name}] = e;
  // Step 2 starts at 1000 µs; rank 0's clock is the earlier one: times from its F0.
  const auto& f0 = by.at({0, "F0"});
  CHECK(f0.start_ns == 0);
  CHECK(f0.dur_ns == 100500);
  CHECK(f0.kind == ir::OpKind::F);
  CHECK(f0.stream == static_cast<int>(ir::Stream::Compute));
  CHECK(by.at({1, "F0"}).start_ns == 3000);  // 3 µs later: the files' common clock kept
  const auto& send = by.at({0, "SEND(F0>r1)"});
  const auto& recv = by.at({0, "RECV(B0<r1)"});
  CHECK(send.start_ns == 190000);
  CHECK(recv.start_ns == 190000);
  CHECK(send.dur_ns == 30250);
  CHECK(send.peer == 1);
  CHECK(send.stream == static_cast<int>(ir::Stream::P2P));

  // An op's device-side range (as Kineto writes record_function's GPU span: args only
  // "External id") wins over its host range; spans of one range on two streams (one
  // External id) are one op; ops without a device range keep their host range; the
  // device's ProfilerStep bounds its ranges.
  json gpu = torch_like(0, 2, 0);
  auto span = [&](const std::string& name, int stream, double ts, double dur, int external) {
    gpu["traceEvents"].push_back({{"ph", "X"}, {"cat", "gpu_user_annotation"}, {"name", name}, {"pid", 0},
                                  {"tid", stream}, {"ts", ts}, {"dur", dur}, {"args", {{"External id", external}}}});
  };
  span("ProfilerStep#2", 7, 1005, 990, 900);
  span("F0", 7, 1015, 80, 11);
  span("F0", 13, 1020, 90, 11);   // the same range's kernels on another stream
  span("F0", 7, 20, 50, 5);       // step 1's: outside step 2 on the device
  const Trace g = trace_from_kineto({{"gpu.json", gpu}});
  REQUIRE(g.events.size() == 3);
  std::map<std::string, TraceEvent> by_name;
  for (const auto& e : g.events) by_name[e.name] = e;
  CHECK(by_name.at("F0").dur_ns == 95000);  // 1015 … 1110 µs
  CHECK(by_name.at("F0").start_ns == 0);
  CHECK(by_name.at("SEND(F0>r1)").start_ns == 185000);  // host: 1200 µs
  CHECK(by_name.at("SEND(F0>r1)").dur_ns == 30250);

  // Each file's ts is relative to its baseTimeNanoseconds: the common clock is theirs.
  json early = torch_like(0, 2, 5e6), late = torch_like(1, 2, 0);
  early["baseTimeNanoseconds"] = 7'000'000'000;
  late["baseTimeNanoseconds"] = 12'000'000'000;  // 5 s later: ts 0 here is ts 5e6 µs there
  const Trace b = trace_from_kineto({{"e.json", early}, {"l.json", late}});
  std::map<std::pair<int, std::string>, TraceEvent> at;
  for (const auto& e : b.events) at[{e.rank, e.name}] = e;
  CHECK(at.at({0, "F0"}).start_ns == at.at({1, "F0"}).start_ns);

  // A file without profiler steps keeps all its ops; the others are filtered, and the
  // metadata names it.
  json plain = torch_like(1, 2, 0);
  for (auto& e : plain["traceEvents"])
    if (e["name"].get<std::string>().starts_with("ProfilerStep#")) e["name"] = "step";
  const Trace mixed = trace_from_kineto({{"s.json", torch_like(0, 2, 0)}, {"p.json", plain}});
  CHECK(mixed.metadata.at("kineto.files_without_steps") == "p.json");
  CHECK(std::count_if(mixed.events.begin(), mixed.events.end(), [](const TraceEvent& e) { return e.rank == 0; }) == 3);
  CHECK(std::count_if(mixed.events.begin(), mixed.events.end(), [](const TraceEvent& e) { return e.rank == 1; }) == 4);
}

TEST_CASE("bad Kineto input names the file and what was expected", "[traces][kineto]") {
  json a = torch_like(0, 2, 0), b = torch_like(0, 2, 0);
  CHECK_THROWS_WITH(trace_from_kineto({{"a.json", a}, {"b.json", b}}),
                    "b.json: distributedInfo.rank 0 is also a.json's; expected one file per rank");
  json no_rank = torch_like(1, 2, 0);
  no_rank.erase("distributedInfo");
  CHECK_THROWS_WITH(trace_from_kineto({{"a.json", a}, {"n.json", no_rank}}),
                    "n.json: distributedInfo.rank: missing (each of several Kineto files names its rank)");
  CHECK(trace_from_kineto({{"n.json", no_rank}}).ranks == 1);  // a single file may omit it: rank 0
  json bad_rank = torch_like(0, 1, 0);
  bad_rank["distributedInfo"]["rank"] = "zero";
  CHECK_THROWS_WITH(trace_from_kineto({{"r.json", bad_rank}}),
                    Catch::StartsWith("r.json: distributedInfo.rank: expected an integer in [0,"));
  json bad_ts = torch_like(0, 1, 0);
  bad_ts["traceEvents"][1]["ts"] = "soon";
  CHECK_THROWS_WITH(trace_from_kineto({{"t.json", bad_ts}}),
                    "t.json: traceEvents[1]: field \"ts\": expected a number of µs");
  json far_peer = torch_like(0, 1, 0);  // SEND(F0>r1) in a one-rank job
  CHECK_THROWS_WITH(trace_from_kineto({{"p.json", far_peer}}), Catch::Contains("names rank 1, but the job has 1 rank"));
  json other_steps = torch_like(1, 2, 0);
  for (auto& e : other_steps["traceEvents"])
    if (e["name"].get<std::string>().starts_with("ProfilerStep#"))
      e["name"] = "ProfilerStep#" + std::to_string(std::stoi(e["name"].get<std::string>().substr(13)) + 5);
  CHECK_THROWS_WITH(trace_from_kineto({{"a.json", a}, {"o.json", other_steps}}),
                    "a.json, o.json: no ProfilerStep#N that every rank's file has");
  json two_jobs = torch_like(1, 4, 0);
  CHECK_THROWS_WITH(trace_from_kineto({{"a.json", a}, {"w.json", two_jobs}}),
                    "w.json: distributedInfo.world_size 4, but a.json says 2: files of two jobs");
  json long_step = torch_like(0, 1, 0);
  long_step["traceEvents"][0]["name"] = "ProfilerStep#" + std::string(300000, '1');
  CHECK_THROWS_WITH(trace_from_kineto({{"l.json", long_step}}),
                    "l.json: traceEvents[0]: field \"name\": a ProfilerStep number of 300000 digits; expected at most 9");
  json negative_step = torch_like(0, 1, 0);
  negative_step["traceEvents"][0]["dur"] = -5;
  CHECK_THROWS_WITH(trace_from_kineto({{"n.json", negative_step}}),
                    "n.json: traceEvents[0]: field \"dur\": expected a duration ≥ 0");
  json no_ops = torch_like(0, 1, 0);
  for (auto& e : no_ops["traceEvents"])
    if (!e["name"].get<std::string>().starts_with("ProfilerStep#")) e["name"] = "aten::mm";
  CHECK_THROWS_WITH(trace_from_kineto({{"z.json", no_ops}}),
                    Catch::StartsWith("z.json: no ranges named like tdpipe ops in ProfilerStep#2 (8 other ranges)"));
  json huge_mb = torch_like(0, 2, 0);
  huge_mb["traceEvents"][1]["args"] = {{"op", "F0"}, {"kind", "F"}, {"mb", 18446744073709551615ull}};
  CHECK_THROWS_WITH(trace_from_kineto({{"m.json", huge_mb}}),
                    Catch::StartsWith("m.json: traceEvents[1]: field \"args.mb\": expected an integer in [-1,"));
  const std::string dir = temp_dir("empty");
  CHECK_THROWS_WITH(read_trace(dir), Catch::Contains("no .json or .json.gz files (expected one Kineto trace per rank)"));
  std::filesystem::remove_all(dir);
}

namespace {

// An Nsight Systems-shaped export: the columns tdpipe reads of NVTX_EVENTS and StringIds.
void make_nsys_db(const std::string& path) {
  std::filesystem::remove(path);
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
  const char* sql = R"(
    CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
      category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER
      REFERENCES StringIds(id), domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL,
      uint32Value INTEGER, int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT);
    INSERT INTO StringIds VALUES (1, 'F0'), (2, 'SEND(F0>r1)+RECV(B0<r1)'), (3, 'RECV(F0<r0)');
    -- process 300 (rank 1 by pid order), process 200 (rank 0); globalTid = pid << 24 | tid
    INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId) VALUES
      (5000000001, 5000100003, 59, NULL, (200 << 24) | 201, 1),
      (5000200000, 5000200777, 59, NULL, (200 << 24) | 201, 2),
      (5000000500, 5000201000, 60, NULL, (300 << 24) | 301, 3),
      (5000300000, 5000400000, 59, 'F0', (300 << 24) | 301, NULL),
      (5000000000, 5000900000, 59, 'train_step', (200 << 24) | 201, NULL),
      (5000000000, NULL, 34, 'a mark', (200 << 24) | 201, NULL);
  )";
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  INFO((err ? err : ""));
  REQUIRE(rc == SQLITE_OK);
  sqlite3_close(db);
}

}  // namespace

TEST_CASE("an Nsight Systems SQLite export: NVTX ranges named like ops, one rank per process", "[traces][nsys]") {
  const std::string dir = temp_dir("nsys");
  const std::string path = dir + "/report.sqlite";
  make_nsys_db(path);
  const Trace t = read_trace(path);
  CHECK(t.origin == "nsys");
  CHECK(t.ranks == 2);
  CHECK(t.metadata.at("nsys.other_ranges") == "1");  // train_step (the mark is not a range)
  REQUIRE(t.events.size() == 5);
  std::map<std::pair<int, std::string>, TraceEvent> by;
  for (const auto& e : t.events) by[{e.rank, e.name}] = e;
  CHECK(by.at({0, "F0"}).start_ns == 0);  // ns exact, from the first op's start
  CHECK(by.at({1, "RECV(F0<r0)"}).start_ns == 499);
  CHECK(by.at({0, "F0"}).dur_ns == 100002);
  CHECK(by.at({0, "SEND(F0>r1)"}).start_ns == 199999);
  CHECK(by.at({0, "RECV(B0<r1)"}).dur_ns == 777);
  CHECK(by.at({1, "RECV(F0<r0)"}).peer == 0);
  CHECK(by.at({1, "RECV(F0<r0)"}).stream == static_cast<int>(ir::Stream::P2P));
  CHECK(by.at({1, "F0"}).start_ns == 299999);

  // Not an Nsight export, not a database.
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open((dir + "/other.sqlite").c_str(), &db) == SQLITE_OK);
  REQUIRE(sqlite3_exec(db, "CREATE TABLE t (x INTEGER);", nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(db);
  CHECK_THROWS_WITH(read_trace(dir + "/other.sqlite"),
                    Catch::StartsWith(dir + "/other.sqlite: no NVTX_EVENTS table: expected an Nsight Systems report"));
  write_text(dir + "/torn.sqlite", std::string("SQLite format 3\0", 16) + std::string(200, 'x'));
  CHECK_THROWS_WITH(read_trace(dir + "/torn.sqlite"), Catch::StartsWith(dir + "/torn.sqlite: "));
  std::filesystem::remove_all(dir);
}
