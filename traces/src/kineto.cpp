// kineto.cpp — Trace ⇄ Kineto JSON (the PyTorch profiler's trace format), per rank.
//
// Writing follows what HTA (Holistic Trace Analysis) reads: a rank's ops are device-side
// events (`cat: kernel`, pid = the device, tid and args.stream = a stream number, as CUDA
// numbers them from 7), one stream per lane of a tdpipe stream (stream_lanes), so that a
// stream's kernels never overlap; communication ops are named as NCCL names its kernels
// and copies as CUDA names memcpys — HTA classes kernels by name (`^nccl.*Kernel` is
// communication, `^Memcpy`/`^Memset` memory, the rest computation) — with the op's own
// text form in args.op; each kernel has a zero-length host `cudaLaunchKernel` with its
// correlation id at its start (HTA puts a kernel in an iteration through its launch), and
// a host-side `ProfilerStep#N` user annotation spans the rank's ops (HTA's iterations).
// Times are µs with ns in the fraction, as Kineto writes them, from baseTimeNanoseconds 0.
// Reading keeps the ranges named like tdpipe ops; see kineto.hpp.
#include "tdpipe/traces/kineto.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string_view>
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
  const bool ok = it->is_number_integer() &&
                  (it->is_number_unsigned() ? it->get<std::uint64_t>() <= std::uint64_t(std::numeric_limits<int>::max())
                                            : it->get<std::int64_t>() >= min &&
                                                  it->get<std::int64_t>() <= std::numeric_limits<int>::max());
  if (!ok)
    throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"args.{}\": expected an integer in [{}, {}], got {}",
                                            i, key, min, std::numeric_limits<int>::max(), ir::quote_json(*it))));
  return it->get<int>();
}

// "ProfilerStep#N" (spaces allowed around '#', as HTA reads it): N, or nullopt when the
// name is not a step's; throws when N does not fit.
std::optional<int> step_number(const std::string& name, const std::string& source, std::size_t i) {
  constexpr std::string_view kPrefix = "ProfilerStep";
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return std::nullopt;
  std::size_t k = kPrefix.size();
  while (k < name.size() && name[k] == ' ') ++k;
  if (k == name.size() || name[k] != '#') return std::nullopt;
  ++k;
  while (k < name.size() && name[k] == ' ') ++k;
  const std::size_t digits = name.size() - k;
  if (digits == 0 || !std::all_of(name.begin() + std::ptrdiff_t(k), name.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  if (digits > 9)
    throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"name\": a ProfilerStep number of {} digits; "
                                            "expected at most 9", i, digits)));
  return std::stoi(name.substr(k));
}

// Kineto's device-side categories (GPU kernels, copies, and record_function's GPU span).
bool device_category(const json& ev) {
  auto c = ev.find("cat");
  if (c == ev.end() || !c->is_string()) return false;
  const auto& s = c->get_ref<const std::string&>();
  return s == "kernel" || s == "Kernel" || s == "gpu_user_annotation" || s == "gpu_memcpy" || s == "gpu_memset";
}

// Integer ns from µs, for values already bounded by micros().
std::int64_t ns_of(double us) { return std::llround(us * 1000.0); }

}  // namespace

bool is_kineto_json(const nlohmann::json& j) {
  return j.is_object() && j.contains("traceEvents") &&
         (j.contains("schemaVersion") || j.contains("distributedInfo") || j.contains("deviceProperties"));
}

namespace {

// Rank `rank`'s file, given every event's lane (stream_lanes) and the rank's events
// (`mine`, indices into trace.events): computed once for a whole folder.
json rank_json(const Trace& trace, const std::vector<int>& lane, std::vector<std::size_t> mine, int rank) {
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
    // The host's launch of the op at its start (zero length: tdpipe records no launch
    // time), correlated with it, as CUDA's runtime events are: HTA places a kernel in an
    // iteration through its launch.
    events.push_back({{"ph", "X"}, {"cat", "cuda_runtime"}, {"name", "cudaLaunchKernel"}, {"pid", host},
                      {"tid", host}, {"ts", double(e.start_ns) / 1000.0}, {"dur", 0.0},
                      {"args", {{"correlation", correlation}, {"External id", correlation}}}});
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
              {"baseTimeNanoseconds", 0},  // ts is from the trace's origin
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

}  // namespace

nlohmann::json to_kineto_json(const Trace& trace, int rank) {
  std::vector<std::size_t> mine;
  for (std::size_t i = 0; i < trace.events.size(); ++i)
    if (trace.events[i].rank == rank) mine.push_back(i);
  return rank_json(trace, stream_lanes(trace), std::move(mine), rank);
}

void write_kineto_dir(const Trace& trace, const std::string& dir, int only_rank) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot create the trace folder: {}", dir, ec.message()));
  // A folder is one job's ranks: files of ranks this trace does not have (an earlier,
  // larger run's) go, so that reading the folder back gives this trace.
  if (only_rank < 0) {
    std::vector<std::filesystem::path> stale;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      int r = -1;
      char tail[8] = {};
      if (std::sscanf(name.c_str(), "rank%d.json%7s", &r, tail) >= 1 && r >= trace.ranks &&
          (name == fmt::format("rank{}.json", r) || name == fmt::format("rank{}.json.gz", r)))
        stale.push_back(it->path());
    }
    if (ec) throw Error(fmt::format("{}: cannot list the trace folder: {}", dir, ec.message()));
    for (const auto& p : stale)
      if (!std::filesystem::remove(p, ec) || ec)
        throw Error(fmt::format("{}: cannot remove the stale {}: {}", dir, p.filename().string(), ec.message()));
  }
  const std::vector<int> lane = stream_lanes(trace);
  std::vector<std::vector<std::size_t>> of_rank(static_cast<std::size_t>(std::max(0, trace.ranks)));
  for (std::size_t i = 0; i < trace.events.size(); ++i)
    if (trace.events[i].rank >= 0 && trace.events[i].rank < trace.ranks)
      of_rank[static_cast<std::size_t>(trace.events[i].rank)].push_back(i);
  for (int r = 0; r < trace.ranks; ++r) {
    if (only_rank >= 0 && r != only_rank) continue;
    const json j = rank_json(trace, lane, std::move(of_rank[static_cast<std::size_t>(r)]), r);
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

struct KinetoImport::State {
  struct Op {
    TraceEvent event;  // all but start_ns
    std::int64_t start_ns = 0;  // on the file's clock (ts · 1000)
    bool device = false;
    std::int64_t external_id = -1;  // device spans of one host range share it
    std::size_t event_index = 0;
  };
  struct File {
    std::string source;
    int rank = 0;
    std::int64_t base_ns = 0;  // baseTimeNanoseconds: ts is relative to it
    int world = 0;
    std::map<int, std::pair<std::int64_t, std::int64_t>> host_steps, device_steps;  // N → [start, end) ns
    std::vector<Op> ops;
    std::int64_t other_events = 0;
  };
  bool single = false;
  bool native = false;  // written by tdpipe (the first file says)
  Trace meta;           // origin, schedule, scenario, metadata of a tdpipe-written set
  int native_ranks = 0;
  std::vector<File> files;
  std::map<int, std::string> rank_source;
};

KinetoImport::KinetoImport(bool single_file) : s_(std::make_unique<State>()) { s_->single = single_file; }
KinetoImport::~KinetoImport() = default;

void KinetoImport::add(const std::string& source, const nlohmann::json& root) {
  State& st = *s_;
  State::File f;
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
    if (auto w = d->find("world_size"); w != d->end()) {
      if (!w->is_number_integer() || w->get<std::int64_t>() <= f.rank || w->get<std::int64_t>() > kMaxRanks)
        throw Error(fail_at(source, fmt::format("distributedInfo.world_size: expected an integer in ({}, {}]", f.rank,
                                                kMaxRanks)));
      f.world = w->get<int>();
    }
  } else if (!st.single) {
    throw Error(fail_at(source, "distributedInfo.rank: missing (each of several Kineto files names its rank)"));
  }
  if (auto b = root.find("baseTimeNanoseconds"); b != root.end()) {
    if (!b->is_number_integer() || b->get<std::int64_t>() < 0)
      throw Error(fail_at(source, "baseTimeNanoseconds: expected an integer ≥ 0"));
    f.base_ns = b->get<std::int64_t>();
  }
  const auto t = root.find("tdpipe");
  const bool native = t != root.end() && t->is_object();
  if (st.files.empty()) {
    st.native = native;
    if (native) {
      auto str = [&](const char* key, std::string& out) {
        if (auto it = t->find(key); it != t->end() && it->is_string()) out = it->get<std::string>();
      };
      str("origin", st.meta.origin);
      str("schedule", st.meta.schedule);
      str("scenario", st.meta.scenario);
      if (auto m = t->find("metadata"); m != t->end() && m->is_object())
        for (const auto& [k, v] : m->items())
          if (v.is_string()) st.meta.metadata[k] = v.get<std::string>();
      if (auto r = t->find("ranks"); r != t->end() && r->is_number_integer() && r->get<std::int64_t>() > 0 &&
                                     r->get<std::int64_t>() <= kMaxRanks)
        st.native_ranks = r->get<int>();
    }
  }
  // One file per rank, of one job.
  if (const auto [it, fresh] = st.rank_source.emplace(f.rank, source); !fresh)
    throw Error(fmt::format("{}: distributedInfo.rank {} is also {}'s; expected one file per rank", source, f.rank,
                            it->second));
  for (const auto& other : st.files)
    if (f.world > 0 && other.world > 0 && f.world != other.world)
      throw Error(fmt::format("{}: distributedInfo.world_size {}, but {} says {}: files of two jobs", source, f.world,
                              other.source, other.world));

  for (std::size_t i = 0; i < evs->size(); ++i) {
    const json& ev = (*evs)[i];
    if (!ev.is_object()) throw Error(fail_at(source, fmt::format("traceEvents[{}]: expected an object", i)));
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
    const bool device = device_category(ev) || (args && args->contains("stream"));
    std::string text = name->get<std::string>();
    if (const auto n = step_number(text, source, i)) {
      const double ts = micros(ev, "ts", source, i), dur = micros(ev, "dur", source, i);
      if (dur < 0)
        throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"dur\": expected a duration ≥ 0", i)));
      (device ? f.device_steps : f.host_steps)[*n] = {ns_of(ts), ns_of(ts + dur)};
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
    if (dur < 0) throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"dur\": expected a duration ≥ 0", i)));
    if (native && ts < 0)
      throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"ts\": expected ≥ 0 µs (tdpipe's times "
                                              "start at its trace's origin)", i)));
    std::int64_t external = -1;
    if (args)
      if (auto x = args->find("External id"); x != args->end() && x->is_number_integer())
        external = x->get<std::int64_t>();
    for (const auto& [op_name, parsed] : group) {
      State::Op op;
      op.start_ns = ns_of(ts);
      op.device = device;
      op.external_id = external;
      op.event_index = i;
      TraceEvent& e = op.event;
      e.rank = f.rank;
      e.name = op_name;
      set_op_fields(e, parsed);
      e.stream = parsed.stream_or_default();
      e.dur_ns = ns_of(dur);
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
          const bool ok = b->is_number_unsigned() ? b->get<std::uint64_t>() <= std::uint64_t(INT64_MAX)
                                                  : b->is_number_integer() && b->get<std::int64_t>() >= 0;
          if (!ok)
            throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"args.bytes\": expected an integer ≥ 0, "
                                                    "got {}", i, ir::quote_json(*b))));
          e.bytes = b->get<std::int64_t>();
        }
        if (auto l = args->find("layers_us"); l != args->end()) {
          if (!l->is_number() || !(l->get<double>() >= 0) || l->get<double>() > dur + 1e-3)
            throw Error(fail_at(source, fmt::format("traceEvents[{}]: field \"args.layers_us\": expected the µs of "
                                                    "dur spent in layers (0 ≤ layers_us ≤ dur), got {}",
                                                    i, ir::quote_json(*l))));
          e.layers_ns = std::min<std::int64_t>(e.dur_ns, ns_of(l->get<double>()));
        }
      }
      f.ops.push_back(std::move(op));
    }
  }
  // One range per op: the device's where the file has one for that op (the GPU's time;
  // a host range's device spans on several streams, which share its External id, become
  // one span), else the host's.
  std::set<std::string> on_device;
  for (const auto& op : f.ops)
    if (op.device) on_device.insert(op.event.name);
  std::vector<State::Op> kept;
  std::map<std::pair<std::string, std::int64_t>, std::size_t> span_of;  // (name, External id) → kept
  for (auto& op : f.ops) {
    if (on_device.count(op.event.name) && !op.device) continue;
    if (op.device && op.external_id >= 0) {
      const auto [it, fresh] = span_of.emplace(std::pair{op.event.name, op.external_id}, kept.size());
      if (!fresh) {
        State::Op& span = kept[it->second];
        const std::int64_t end = std::max(span.start_ns + span.event.dur_ns, op.start_ns + op.event.dur_ns);
        span.start_ns = std::min(span.start_ns, op.start_ns);
        span.event.dur_ns = end - span.start_ns;
        continue;
      }
    }
    kept.push_back(std::move(op));
  }
  f.ops = std::move(kept);
  st.files.push_back(std::move(f));
}

Trace KinetoImport::finish() {
  State& st = *s_;
  if (st.files.empty()) throw Error("Kineto import: no files");
  Trace trace;
  trace.origin = "kineto";
  if (st.native) {
    trace.origin = st.meta.origin;
    trace.schedule = st.meta.schedule;
    trace.scenario = st.meta.scenario;
    trace.metadata = st.meta.metadata;
  }
  // The last ProfilerStep every file with steps has (files without steps: all their ops).
  std::optional<int> step;
  std::vector<std::string> unstepped;
  std::set<int> common;
  bool first = true;
  for (const auto& f : st.files) {
    if (f.host_steps.empty() && f.device_steps.empty()) {
      unstepped.push_back(f.source);
      continue;
    }
    std::set<int> mine;
    for (const auto& [n, span] : f.host_steps) mine.insert(n);
    for (const auto& [n, span] : f.device_steps) mine.insert(n);
    if (first) common = mine;
    else std::erase_if(common, [&](int n) { return !mine.count(n); });
    first = false;
  }
  if (!first) {
    if (common.empty()) {
      std::string with;
      for (const auto& f : st.files)
        if (!f.host_steps.empty() || !f.device_steps.empty()) with += (with.empty() ? "" : ", ") + f.source;
      throw Error(fmt::format("{}: no ProfilerStep#N that every rank's file has", with));
    }
    step = *common.rbegin();
  }
  const std::int64_t min_base =
      std::min_element(st.files.begin(), st.files.end(), [](const auto& a, const auto& b) { return a.base_ns < b.base_ns; })
          ->base_ns;
  std::int64_t other = 0;
  struct Kept {
    TraceEvent event;
    std::int64_t start_ns;
    const State::File* file;
    std::size_t index;
  };
  std::vector<Kept> kept;
  std::int64_t origin = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMaxNs = std::int64_t(kMaxMicros) * 1000;
  for (const auto& f : st.files) {
    other += f.other_events;
    const std::int64_t shift = f.base_ns - min_base;  // the files' common clock
    if (shift > kMaxNs) throw Error(fail_at(f.source, "baseTimeNanoseconds: more than 4e15 µs after another file's"));
    // The step's window: host ranges inside its host annotation; device ranges inside its
    // device annotation, or from the host step's start to the next one's (a GPU runs a
    // step's kernels after the host issued them).
    std::pair<std::int64_t, std::int64_t> host{std::numeric_limits<std::int64_t>::min(),
                                                std::numeric_limits<std::int64_t>::max()};
    auto device = host;
    if (step && (!f.host_steps.empty() || !f.device_steps.empty())) {
      if (auto h = f.host_steps.find(*step); h != f.host_steps.end()) {
        host = h->second;
        device = {h->second.first, std::next(h) == f.host_steps.end() ? std::numeric_limits<std::int64_t>::max()
                                                                      : std::next(h)->second.first};
      }
      if (auto d = f.device_steps.find(*step); d != f.device_steps.end()) device = d->second;
      if (!f.host_steps.count(*step)) host = device;
    }
    for (const auto& op : f.ops) {
      const auto& [lo, hi] = op.device ? device : host;
      if (op.start_ns < lo || op.start_ns >= hi) continue;
      kept.push_back({op.event, op.start_ns + shift, &f, op.event_index});
      origin = std::min(origin, op.start_ns + shift);
    }
  }
  if (kept.empty()) {
    std::string sources;
    for (const auto& f : st.files) sources += (sources.empty() ? "" : ", ") + f.source;
    throw Error(fmt::format("{}: no ranges named like tdpipe ops{} ({} other ranges); name each op's range after "
                            "its text form, e.g. record_function(\"F3\"), \"SEND(F0>r1)\"",
                            sources, step ? fmt::format(" in ProfilerStep#{}", *step) : std::string(), other));
  }
  if (st.native) origin = 0;  // tdpipe's times are already from its trace's origin
  // The ranks: those with files, and those their ops name as peers within the job's
  // world_size (a profile of some ranks of a larger job); tdpipe's files say theirs.
  int max_rank = -1, world = 0;
  for (const auto& f : st.files) max_rank = std::max(max_rank, f.rank), world = std::max(world, f.world);
  trace.ranks = st.native && st.native_ranks > 0 ? std::max(st.native_ranks, max_rank + 1) : max_rank + 1;
  if (!st.native)
    for (const auto& k : kept)
      if (k.event.peer >= trace.ranks && k.event.peer < world) trace.ranks = k.event.peer + 1;
  for (auto& k : kept) {
    const std::int64_t t = k.start_ns - origin;
    if (t < 0 || t > kMaxNs || k.event.dur_ns > kMaxNs)
      throw Error(fail_at(k.file->source, fmt::format("traceEvents[{}] (\"{}\"): starts {} µs after the trace's "
                                                      "origin and lasts {} µs: expected each in [0, 4e15] µs",
                                                      k.index, k.event.name, double(t) / 1000,
                                                      double(k.event.dur_ns) / 1000)));
    if (k.event.peer >= trace.ranks)
      throw Error(fail_at(k.file->source, fmt::format("traceEvents[{}] (\"{}\") on rank {} names rank {}, but the "
                                                      "job has {} rank(s) (files for ranks 0 … {})",
                                                      k.index, k.event.name, k.event.rank, k.event.peer, trace.ranks,
                                                      trace.ranks - 1)));
    k.event.start_ns = t;
    trace.events.push_back(std::move(k.event));
  }
  std::stable_sort(trace.events.begin(), trace.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return std::tie(a.rank, a.start_ns) < std::tie(b.rank, b.start_ns);
  });
  if (!st.native) {
    trace.metadata["kineto.files"] = std::to_string(st.files.size());
    trace.metadata["kineto.other_events"] = std::to_string(other);  // ranges not named like ops
    if (step) trace.metadata["kineto.step"] = fmt::format("ProfilerStep#{}", *step);
    if (step && !unstepped.empty()) {
      std::string list;
      for (const auto& u : unstepped) list += (list.empty() ? "" : ", ") + u;
      trace.metadata["kineto.files_without_steps"] = list;  // all their ops kept
    }
    if (world > 0) trace.metadata["kineto.world_size"] = std::to_string(world);
  }
  return trace;
}

Trace trace_from_kineto(const std::vector<std::pair<std::string, nlohmann::json>>& files) {
  KinetoImport in(files.size() == 1);
  for (const auto& [source, j] : files) in.add(source, j);
  return in.finish();
}

}  // namespace tdpipe::traces
