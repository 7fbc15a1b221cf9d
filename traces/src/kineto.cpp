// kineto.cpp — Trace ⇄ Kineto JSON (the PyTorch profiler's trace format), per rank.
//
// Writing follows what HTA (Holistic Trace Analysis) reads: a rank's ops are device-side
// events (`cat: kernel`, pid = the device, tid and args.stream = a stream number, as CUDA
// numbers them from 7), one stream per lane of a tdpipe stream (stream_lanes), so that a
// stream's kernels never overlap; communication ops are named as NCCL names its kernels
// and copies as CUDA names memcpys — HTA classes kernels by name (`^nccl.*Kernel` is
// communication, `^Memcpy`/`^Memset` memory, the rest computation) — with the op's own
// text form in args.op; a host-side `ProfilerStep#N` user annotation spans the rank's
// ops (HTA groups iterations by it). Times are µs with ns in the fraction, as Kineto
// writes them.
// Reading keeps the ranges named like tdpipe ops; see kineto.hpp.
#include "tdpipe/traces/kineto.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tdpipe/ir/atomic_file.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/json_read.hpp"
#include "tdpipe/traces/op_name.hpp"

namespace tdpipe::traces {
namespace {

using nlohmann::json;

constexpr int kFirstStream = 7;       // CUDA's first non-default stream number in Kineto traces
constexpr std::int64_t kHostPid = 1'000'000;  // + rank: the host process (device pids are the rank)
constexpr int kMaxRanks = 1 << 20;
constexpr double kMaxMicros = 4e15;

// The kernel name and category HTA classes the op by.
std::pair<std::string, const char*> kernel_of(const TraceEvent& e) {
  if (!e.kind) return {e.name, "kernel"};
  switch (*e.kind) {
    case ir::OpKind::SEND:
    case ir::OpKind::RECV:
      return {"ncclDevKernel_SendRecv", "kernel"};
    case ir::OpKind::ALLREDUCE:
    case ir::OpKind::COMPRESSED_ALLREDUCE:
      return {"ncclDevKernel_AllReduce_Sum", "kernel"};
    case ir::OpKind::REDUCE_SCATTER:
      return {"ncclDevKernel_ReduceScatter_Sum", "kernel"};
    case ir::OpKind::ALL_GATHER:
      return {"ncclDevKernel_AllGather", "kernel"};
    case ir::OpKind::LOAD:
      return {"Memcpy HtoD (Pinned -> Device)", "gpu_memcpy"};
    case ir::OpKind::OFFLOAD:
      return {"Memcpy DtoH (Device -> Pinned)", "gpu_memcpy"};
    default:
      return {e.name, "kernel"};
  }
}

std::string fail_at(const std::string& source, const std::string& what) { return fmt::format("{}: {}", source, what); }

// One file's view while reading.
struct FileOps {
  std::string source;
  int rank = 0;
  struct Op {
    TraceEvent event;  // rank, name, kind, fields, stream, dur_ns; start below
    double start_us = 0;
    bool device = false;
  };
  std::vector<Op> ops;
  std::map<int, std::pair<double, double>> steps;  // ProfilerStep#N → [start, end) µs
  std::int64_t other_events = 0;
};

double micros(const json& ev, const char* field, const std::string& source, std::size_t i) {
  auto it = ev.find(field);
  if (it == ev.end() || !it->is_number())
    throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"{}\": expected a number of µs", i, field)));
  const double us = it->get<double>();
  if (!std::isfinite(us) || std::abs(us) > 9e15)
    throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"{}\": out of range (|µs| ≤ 9e15)", i, field)));
  return us;
}

int int_arg(const json& args, const char* key, int min, int fallback, const std::string& source, std::size_t i) {
  auto it = args.find(key);
  if (it == args.end()) return fallback;
  if (!it->is_number_integer() || it->get<std::int64_t>() < min ||
      it->get<std::int64_t>() > std::numeric_limits<int>::max())
    throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"args.{}\": expected an integer ≥ {}, got {}", i,
                                            key, min, ir::quote_json(*it))));
  return it->get<int>();
}

FileOps read_file_ops(const std::string& source, const json& root, bool single) {
  FileOps f;
  f.source = source;
  if (!root.is_object()) throw Error(fail_at(source, "top level: expected a Kineto trace object"));
  auto evs = root.find("traceEvents");
  if (evs == root.end() || !evs->is_array())
    throw Error(fail_at(source, "top level: expected a \"traceEvents\" array (Kineto trace)"));
  if (auto d = root.find("distributedInfo"); d != root.end()) {
    if (!d->is_object()) throw Error(fail_at(source, "distributedInfo: expected an object"));
    auto r = d->find("rank");
    if (r == d->end() || !r->is_number_integer() || r->get<std::int64_t>() < 0 || r->get<std::int64_t>() >= kMaxRanks)
      throw Error(fail_at(source, fmt::format("distributedInfo.rank: expected an integer in [0, {})", kMaxRanks)));
    f.rank = r->get<int>();
  } else if (!single) {
    throw Error(fail_at(source, "distributedInfo.rank: missing (each of several Kineto files names its rank)"));
  }
  static const std::regex step_re(R"(ProfilerStep\s*#\s*(\d+))");
  for (std::size_t i = 0; i < evs->size(); ++i) {
    const json& ev = (*evs)[i];
    if (!ev.is_object())
      throw Error(fail_at(source, fmt::format("traceEvents[{}]: expected an object", i)));
    auto ph = ev.find("ph");
    if (ph == ev.end() || !ph->is_string() || *ph != "X") continue;
    auto name = ev.find("name");
    if (name == ev.end() || !name->is_string())
      throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"name\": expected a string", i)));
    const json* args = nullptr;
    if (auto a = ev.find("args"); a != ev.end()) {
      if (!a->is_object())
        throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"args\": expected an object", i)));
      args = &*a;
    }
    std::string text = name->get<std::string>();
    std::smatch m;
    if (std::regex_match(text, m, step_re)) {
      const double ts = micros(ev, "ts", source, i);
      f.steps[std::stoi(m[1].str())] = {ts, ts + micros(ev, "dur", source, i)};
      continue;
    }
    if (args)
      if (auto op = args->find("op"); op != args->end() && op->is_string()) text = op->get<std::string>();
    const std::vector<NamedOp> group = parse_op_group(text);
    if (group.empty()) {
      ++f.other_events;
      continue;
    }
    const double ts = micros(ev, "ts", source, i);
    const double dur = micros(ev, "dur", source, i);
    if (dur < 0) throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"dur\": expected ≥ 0", i)));
    const bool device = args && args->contains("stream");
    for (const auto& [op_name, parsed] : group) {
      FileOps::Op op;
      op.start_us = ts;
      op.device = device;
      TraceEvent& e = op.event;
      e.rank = f.rank;
      e.name = op_name;
      e.kind = parsed.kind;
      e.mb = parsed.mb;
      e.chunk = parsed.chunk;
      e.slice = parsed.slice;
      e.peer = parsed.peer;
      e.stream = static_cast<int>(parsed.stream ? *parsed.stream : ir::default_stream(parsed.kind));
      e.dur_ns = std::llround(dur * 1000.0);
      if (args && group.size() == 1) {  // tdpipe's own fields (its Kineto files)
        if (auto k = args->find("kind"); k != args->end() && k->is_string()) {
          const auto kind = ir::op_kind_from_string(k->get<std::string>());
          if (!kind)
            throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"args.kind\": unknown op kind \"{}\"", i,
                                                    k->get<std::string>())));
          e.kind = kind;
          e.mb = int_arg(*args, "mb", -1, e.mb, source, i);
          e.chunk = int_arg(*args, "chunk", 0, e.chunk, source, i);
          e.slice = int_arg(*args, "slice", 0, e.slice, source, i);
          e.peer = int_arg(*args, "peer", -1, e.peer, source, i);
        }
        e.stream = int_arg(*args, "tdpipe_stream", 0, e.stream, source, i);
        if (auto b = args->find("bytes"); b != args->end()) {
          if (!b->is_number_integer() || b->get<std::int64_t>() < 0)
            throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"args.bytes\": expected an integer ≥ 0, "
                                                    "got {}", i, ir::quote_json(*b))));
          e.bytes = b->get<std::int64_t>();
        }
        if (auto l = args->find("layers_us"); l != args->end() && l->is_number() && l->get<double>() >= 0)
          e.layers_ns = std::min<std::int64_t>(e.dur_ns, std::llround(l->get<double>() * 1000.0));
      }
      f.ops.push_back(std::move(op));
    }
  }
  // Device-side ranges where the file has them (the GPU's time), else the host's.
  if (std::any_of(f.ops.begin(), f.ops.end(), [](const FileOps::Op& o) { return o.device; }))
    std::erase_if(f.ops, [](const FileOps::Op& o) { return !o.device; });
  return f;
}

}  // namespace

bool is_kineto_json(const nlohmann::json& j) {
  return j.is_object() && j.contains("traceEvents") &&
         (j.contains("schemaVersion") || j.contains("distributedInfo") || j.contains("deviceProperties"));
}

nlohmann::json to_kineto_json(const Trace& trace, int rank) {
  const std::vector<int> lane = stream_lanes(trace);
  std::vector<std::size_t> mine;
  for (std::size_t i = 0; i < trace.events.size(); ++i)
    if (trace.events[i].rank == rank) mine.push_back(i);
  std::stable_sort(mine.begin(), mine.end(), [&](std::size_t a, std::size_t b) {
    return trace.events[a].start_ns < trace.events[b].start_ns;
  });
  std::vector<std::pair<int, int>> tracks;  // (tdpipe stream, lane), sorted: its index + 7 is the stream
  for (std::size_t i : mine) tracks.emplace_back(trace.events[i].stream, lane[i]);
  std::sort(tracks.begin(), tracks.end());
  tracks.erase(std::unique(tracks.begin(), tracks.end()), tracks.end());
  auto stream_of = [&](std::size_t i) {
    const auto it = std::lower_bound(tracks.begin(), tracks.end(), std::pair{trace.events[i].stream, lane[i]});
    return kFirstStream + static_cast<int>(it - tracks.begin());
  };

  json events = json::array();
  const std::int64_t host = kHostPid + rank;
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"tid", 0},
                    {"args", {{"name", fmt::format("rank {} device", rank)}}}});
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", host}, {"tid", 0},
                    {"args", {{"name", fmt::format("rank {} host", rank)}}}});
  for (std::size_t k = 0; k < tracks.size(); ++k) {
    const auto [s, l] = tracks[k];
    const std::string stream = s >= 0 && s < ir::kStreamCount ? std::string(ir::to_string(static_cast<ir::Stream>(s)))
                                                               : fmt::format("stream {}", s);
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", kFirstStream + int(k)},
                      {"args", {{"name", l == 0 ? stream : fmt::format("{} {}", stream, l + 1)}}}});
  }
  if (!mine.empty()) {
    std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = std::numeric_limits<std::int64_t>::min();
    for (std::size_t i : mine) {
      first = std::min(first, trace.events[i].start_ns);
      last = std::max(last, trace.events[i].end_ns());
    }
    int step = 0;
    if (auto it = trace.metadata.find("step"); it != trace.metadata.end()) {
      try {
        step = std::max(0, std::stoi(it->second));
      } catch (const std::exception&) {
        step = 0;
      }
    }
    events.push_back({{"ph", "X"}, {"cat", "user_annotation"}, {"name", fmt::format("ProfilerStep#{}", step)},
                      {"pid", host}, {"tid", host}, {"ts", double(first) / 1000.0},
                      {"dur", double(last - first) / 1000.0}, {"args", {{"External id", 0}}}});
  }
  int correlation = 0;
  for (std::size_t i : mine) {
    const TraceEvent& e = trace.events[i];
    const auto [kernel, cat] = kernel_of(e);
    const int stream = stream_of(i);
    ++correlation;
    json args = {{"device", rank}, {"stream", stream},    {"correlation", correlation}, {"External id", correlation},
                 {"op", e.name},   {"mb", e.mb},          {"chunk", e.chunk},           {"slice", e.slice},
                 {"peer", e.peer}, {"bytes", e.bytes},    {"tdpipe_stream", e.stream}};
    if (e.kind) args["kind"] = std::string(ir::to_string(*e.kind));
    if (e.layers_ns >= 0) args["layers_us"] = double(e.layers_ns) / 1000.0;
    events.push_back({{"ph", "X"}, {"cat", cat}, {"name", kernel}, {"pid", rank}, {"tid", stream},
                      {"ts", double(e.start_ns) / 1000.0}, {"dur", double(e.dur_ns) / 1000.0},
                      {"args", std::move(args)}});
  }
  return json{{"schemaVersion", 1},
              {"distributedInfo", {{"backend", "tdpipe"}, {"rank", rank}, {"world_size", trace.ranks}}},
              {"traceName", trace.scenario.empty() ? "tdpipe" : trace.scenario},
              {"displayTimeUnit", "ms"},
              {"tdpipe",
               {{"generator", "tdpipe"},
                {"origin", trace.origin},
                {"schedule", trace.schedule},
                {"scenario", trace.scenario},
                {"ranks", trace.ranks},
                {"metadata", trace.metadata}}},
              {"traceEvents", std::move(events)}};
}

void write_kineto_dir(const Trace& trace, const std::string& dir, int only_rank) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot create the trace folder: {}", dir, ec.message()));
  for (int r = 0; r < trace.ranks; ++r) {
    if (only_rank >= 0 && r != only_rank) continue;
    const json j = to_kineto_json(trace, r);
    // One event per line, as write_trace does: diffable and greppable.
    // distributedInfo indented: HTA finds a file's rank by the text `"rank": N` (with the
    // space Kineto writes), line by line, before it parses the file.
    std::string out = "{";
    for (const auto& [k, v] : j.items())
      if (k != "traceEvents") out += json(k).dump() + ": " + v.dump(k == "distributedInfo" ? 1 : -1) + ",\n";
    out += "\"traceEvents\": [\n";
    const json& evs = j["traceEvents"];
    for (std::size_t i = 0; i < evs.size(); ++i) out += evs[i].dump() + (i + 1 < evs.size() ? ",\n" : "\n");
    out += "]}\n";
    ir::write_file_atomic((std::filesystem::path(dir) / fmt::format("rank{}.json", r)).string(), out, "trace");
  }
}

Trace trace_from_kineto(const std::vector<std::pair<std::string, nlohmann::json>>& files) {
  if (files.empty()) throw Error("Kineto import: no files");
  std::vector<FileOps> ranks;
  std::map<int, std::string> seen;
  for (const auto& [source, j] : files) {
    ranks.push_back(read_file_ops(source, j, files.size() == 1));
    const auto [it, fresh] = seen.emplace(ranks.back().rank, source);
    if (!fresh)
      throw Error(fmt::format("{}: distributedInfo.rank {} is also {}'s; expected one file per rank", source,
                              ranks.back().rank, it->second));
  }
  Trace trace;
  trace.origin = "kineto";
  const json& first = files.front().second;
  const auto t = first.find("tdpipe");
  const bool native = t != first.end() && t->is_object();  // written by tdpipe: its fields round-trip
  if (native) {
    auto str = [&](const char* key, std::string& out) {
      if (auto it = t->find(key); it != t->end() && it->is_string()) out = it->get<std::string>();
    };
    str("origin", trace.origin);
    str("schedule", trace.schedule);
    str("scenario", trace.scenario);
    if (auto m = t->find("metadata"); m != t->end() && m->is_object())
      for (const auto& [k, v] : m->items())
        if (v.is_string()) trace.metadata[k] = v.get<std::string>();
  }
  int world = 0;
  for (const auto& [source, j] : files)
    if (auto d = j.find("distributedInfo"); d != j.end())
      if (auto w = d->find("world_size"); w != d->end() && w->is_number_integer() && w->get<std::int64_t>() > 0 &&
                                          w->get<std::int64_t>() <= kMaxRanks)
        world = std::max(world, w->get<int>());

  // The last ProfilerStep every file has, when they have steps.
  std::optional<int> step;
  if (std::all_of(ranks.begin(), ranks.end(), [](const FileOps& f) { return !f.steps.empty(); })) {
    std::set<int> common;
    for (const auto& [n, span] : ranks.front().steps) common.insert(n);
    for (const auto& f : ranks)
      std::erase_if(common, [&](int n) { return !f.steps.contains(n); });
    if (common.empty())
      throw Error(fmt::format("{}: no ProfilerStep#N that every rank's file has", files.front().first));
    step = *common.rbegin();
    if (!native) trace.metadata["kineto.step"] = fmt::format("ProfilerStep#{}", *step);
  }
  std::int64_t other = 0;
  double origin = std::numeric_limits<double>::infinity();
  std::vector<std::pair<TraceEvent, double>> kept;
  for (const auto& f : ranks) {
    other += f.other_events;
    // A step's ops: host ranges inside its annotation; device ranges from its start to the
    // next step's (a GPU runs a step's kernels after the host issued them).
    double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
    if (step) {
      const auto it = f.steps.find(*step);
      lo = it->second.first;
      hi = it->second.second;
      const bool device = !f.ops.empty() && f.ops.front().device;
      if (device) hi = std::next(it) == f.steps.end() ? std::numeric_limits<double>::infinity() : std::next(it)->second.first;
    }
    for (const auto& op : f.ops) {
      if (op.start_us < lo || op.start_us >= hi) continue;
      kept.emplace_back(op.event, op.start_us);
      origin = std::min(origin, op.start_us);
    }
  }
  if (native) origin = 0;  // tdpipe's times are already from its trace's origin
  for (auto& [e, start_us] : kept) {
    const double t = start_us - origin;
    if (t > kMaxMicros || e.dur_ns > std::int64_t(kMaxMicros * 1000))
      throw Error(fmt::format("{}: op \"{}\" starts {} µs after the first: expected ≤ 4e15 µs", files.front().first,
                              e.name, t));
    e.start_ns = std::llround(t * 1000.0);
    trace.events.push_back(std::move(e));
  }
  std::stable_sort(trace.events.begin(), trace.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return std::tie(a.rank, a.start_ns) < std::tie(b.rank, b.start_ns);
  });
  int max_rank = -1;
  for (const auto& f : ranks) max_rank = std::max(max_rank, f.rank);
  trace.ranks = std::max(world, max_rank + 1);
  for (const auto& e : trace.events)
    if (e.peer >= trace.ranks)
      throw Error(fmt::format("{}: op \"{}\" on rank {} names rank {}, but the job has {} rank(s)",
                              files.front().first, e.name, e.rank, e.peer, trace.ranks));
  if (!native) {
    trace.metadata["kineto.files"] = std::to_string(files.size());
    trace.metadata["kineto.other_events"] = std::to_string(other);  // ranges not named like ops
  }
  return trace;
}

}  // namespace tdpipe::traces
