// chrome_json.cpp — Trace ⇄ Chrome Trace Event JSON.
//
// Writing (format 2, what Perfetto and chrome://tracing draw as written): pid = rank + 1;
// each stream gets as many tracks (tids ≥ 1, `M` events name and order them) as it needs
// so that no two slices of a track overlap — a p2p batch's SENDs and RECVs start together
// and end apart, so each takes a lane of its own ("p2p", "p2p 2", …); one `X` event per op
// with a `cat` (its stream), ts/dur in fractional µs (ns / 1000, so that nanoseconds
// survive the round trip: reading takes llround(µs · 1000)), op fields and its stream in
// `args`; a flow (`s` → `f`) from each SEND to the RECV it meets (the k-th SEND from rank
// a to b meets the k-th RECV on b from a, NCCL's rule); trace-level fields under
// "otherData" with "generator": "tdpipe" and "format": 2.
// Reading: tdpipe traces map pid → rank and args.stream → stream (format 1, older files:
// pid → rank and tid → stream directly); any other Chrome
// trace (Kineto, Perfetto exports, …) has its distinct pids and tids renumbered densely
// in sorted order, times shifted to start at 0, and each event's kind guessed from its
// name when the name is a tdpipe op's text form.
#include "tdpipe/traces/chrome_json.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <tuple>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tdpipe/ir/atomic_file.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/json_read.hpp"
#include "tdpipe/traces/op_name.hpp"

namespace tdpipe::traces {
namespace {
// Bounds that keep ranks allocatable and times inside int64 nanoseconds.
constexpr std::int64_t kMaxRanks = 1 << 20;
constexpr double kMaxMicros = 4e15;

using nlohmann::json;

constexpr const char* kGenerator = "tdpipe";

std::string stream_name(int stream) {
  if (stream >= 0 && stream < ir::kStreamCount)
    return std::string(ir::to_string(static_cast<ir::Stream>(stream)));
  return fmt::format("stream {}", stream);
}

constexpr int kFormat = 2;  // pid = rank + 1, tracks per stream lane, args.stream

json event_json(const TraceEvent& e, int tid) {
  json args = {{"mb", e.mb},       {"chunk", e.chunk}, {"slice", e.slice},
               {"peer", e.peer},   {"bytes", e.bytes}, {"stream", e.stream}};
  if (e.kind) args["kind"] = std::string(ir::to_string(*e.kind));
  if (e.layers_ns >= 0) args["layers_us"] = double(e.layers_ns) / 1000.0;
  return json{{"ph", "X"},
              {"cat", stream_name(e.stream)},
              {"name", e.name},
              {"pid", e.rank + 1},
              {"tid", tid},
              {"ts", double(e.start_ns) / 1000.0},
              {"dur", double(e.dur_ns) / 1000.0},
              {"args", std::move(args)}};
}

// A pid or tid: integers keep their numeric order, strings come after them.
struct Id {
  bool is_string = false;
  std::int64_t number = 0;
  std::string text;
  friend bool operator<(const Id& a, const Id& b) {
    if (a.is_string != b.is_string) return !a.is_string;
    return a.is_string ? a.text < b.text : a.number < b.number;
  }
};

class Reader {
 public:
  Reader(const json& root, std::string source) : root_(root), source_(std::move(source)) {}

  Trace read() {
    const json* events = nullptr;
    const json* other = nullptr;
    if (root_.is_array()) {
      events = &root_;  // the JSON Array Format
    } else if (root_.is_object()) {
      auto it = root_.find("traceEvents");
      if (it == root_.end())
        fail("top level: expected a \"traceEvents\" array (Chrome Trace Event format)");
      if (!it->is_array()) fail("traceEvents: expected an array");
      events = &*it;
      auto o = root_.find("otherData");
      if (o != root_.end()) {
        if (!o->is_object()) fail("otherData: expected an object");
        other = &*o;
      }
    } else {
      fail("top level: expected an object with \"traceEvents\" or an array of events");
    }

    Trace trace;
    const bool native = other && other->contains("generator") && (*other)["generator"] == kGenerator;
    if (native)
      if (auto f = other->find("format"); f != other->end()) {
        if (!f->is_number_integer() || f->get<std::int64_t>() < 1 || f->get<std::int64_t>() > kFormat)
          fail(fmt::format("otherData.format: expected a tdpipe trace format from 1 to {}, got {}", kFormat,
                           ir::quote_json(*f)));
        format_ = f->get<int>();
      }
    if (other) read_other(*other, trace);
    if (!native) trace.origin = trace.origin.empty() ? "chrome" : trace.origin;

    // Foreign traces: renumber pids and tids densely in sorted order.
    std::map<Id, int> pids, tids;
    if (!native) {
      for (std::size_t i = 0; i < events->size(); ++i) {
        const json& ev = (*events)[i];
        // (json::value would throw nlohmann's type_error on a "ph" that is not a string;
        // the loop below names that event.)
        if (!ev.is_object()) continue;
        const auto ph = ev.find("ph");
        if (ph == ev.end() || !ph->is_string() || *ph != "X") continue;
        pids.emplace(id(ev, "pid", i), 0);
        tids.emplace(id(ev, "tid", i), 0);
      }
      int n = 0;
      for (auto& [k, v] : pids) v = n++;
      n = 0;
      for (auto& [k, v] : tids) v = n++;
      // What the foreign tool called them: its pids, and its process and thread names
      // (`M` events), kept in the metadata under the renumbered rank and stream
      // ("chrome.pid.R", "chrome.tid.S", "chrome.process_name.R", "chrome.thread_name.R.S").
      for (const auto& [pid, rank] : pids)
        trace.metadata[fmt::format("chrome.pid.{}", rank)] = pid.is_string ? pid.text : std::to_string(pid.number);
      for (const auto& [tid, stream] : tids)
        trace.metadata[fmt::format("chrome.tid.{}", stream)] = tid.is_string ? tid.text : std::to_string(tid.number);
      for (std::size_t i = 0; i < events->size(); ++i) {
        const json& ev = (*events)[i];
        if (!ev.is_object()) continue;
        const auto ph = ev.find("ph"), name = ev.find("name"), args = ev.find("args");
        if (ph == ev.end() || *ph != "M" || name == ev.end() || !name->is_string() || args == ev.end() ||
            !args->is_object())
          continue;
        const auto label = args->find("name");
        if (label == args->end() || !label->is_string() || !ev.contains("pid")) continue;
        const auto p = pids.find(id(ev, "pid", i));
        if (p == pids.end()) continue;  // a process without intervals
        if (*name == "process_name") {
          trace.metadata[fmt::format("chrome.process_name.{}", p->second)] = label->get<std::string>();
        } else if (*name == "thread_name" && ev.contains("tid")) {
          const auto t = tids.find(id(ev, "tid", i));
          if (t != tids.end())
            trace.metadata[fmt::format("chrome.thread_name.{}.{}", p->second, t->second)] = label->get<std::string>();
        }
      }
    }

    std::vector<double> starts_us;
    std::vector<std::size_t> source_index;  // trace.events[k] came from traceEvents[source_index[k]]
    for (std::size_t i = 0; i < events->size(); ++i) {
      const json& ev = (*events)[i];
      if (!ev.is_object()) fail_event(i, "", "expected an object");
      auto ph = ev.find("ph");
      if (ph == ev.end()) fail_event(i, "ph", "missing (every event has a phase)");
      if (!ph->is_string()) fail_event(i, "ph", "expected a string");
      if (*ph != "X") continue;  // metadata, counters, flows, instants: not intervals
      TraceEvent e;
      auto name = ev.find("name");
      if (name == ev.end() || !name->is_string()) fail_event(i, "name", "expected a string");
      e.name = name->get<std::string>();
      if (native && format_ >= 2) {
        e.rank = int_field(ev, "pid", i) - 1;
        if (e.rank < 0) fail_event(i, "pid", "expected a rank + 1 ≥ 1 (tdpipe trace format 2)");
        auto a = ev.find("args");
        if (a == ev.end() || !a->is_object()) fail_event(i, "args", "expected an object with the stream");
        read_int_arg(*a, "stream", i, 0, e.stream);
        if (!a->contains("stream")) fail_event(i, "args.stream", "missing (tdpipe trace format 2 names each op's stream)");
      } else if (native) {
        e.rank = int_field(ev, "pid", i);
        e.stream = int_field(ev, "tid", i);
      } else {
        e.rank = pids.at(id(ev, "pid", i));
        e.stream = tids.at(id(ev, "tid", i));
      }
      // Foreign traces may carry epoch µs (~1.7e15): shift in µs, where doubles are
      // still exact, before scaling to ns.
      starts_us.push_back(micros_field(ev, "ts", i));
      e.dur_ns = std::llround(micros_field(ev, "dur", i) * 1000.0);
      if (e.dur_ns < 0) fail_event(i, "dur", "expected a duration ≥ 0");

      // Op fields: from args where present, else from the name when it is an op's text.
      const std::optional<ParsedOpName> parsed = parse_op_name(e.name);
      if (parsed) set_op_fields(e, *parsed);
      auto args = ev.find("args");
      if (args != ev.end()) {
        if (!args->is_object()) fail_event(i, "args", "expected an object");
        if (auto k = args->find("kind"); k != args->end()) {
          if (!k->is_string()) fail_event(i, "args.kind", "expected a string");
          const auto kind = ir::op_kind_from_string(k->get<std::string>());
          if (!kind)
            fail_event(i, "args.kind", fmt::format("unknown op kind \"{}\"", k->get<std::string>()));
          e.kind = kind;
        }
        read_int_arg(*args, "mb", i, -1, e.mb);  // -1: no micro-batch (OPT, collectives)
        read_int_arg(*args, "chunk", i, 0, e.chunk);
        read_int_arg(*args, "slice", i, 0, e.slice);
        read_int_arg(*args, "peer", i, -1, e.peer);  // -1: no peer; < ranks checked below
        if (auto b = args->find("bytes"); b != args->end()) {
          if (!b->is_number_integer() || b->get<std::int64_t>() < 0)
            fail_event(i, "args.bytes", fmt::format("expected an integer ≥ 0, got {}", ir::quote_json(*b)));
          e.bytes = b->get<std::int64_t>();
        }
        if (auto l = args->find("layers_us"); l != args->end()) {
          if (!l->is_number() || !(l->get<double>() >= 0) || l->get<double>() > micros_field(ev, "dur", i) + 1e-3)
            fail_event(i, "args.layers_us",
                       fmt::format("expected the µs of dur spent in layers (0 ≤ layers_us ≤ dur), got {}",
                                   ir::quote_json(*l)));
          e.layers_ns = std::min<std::int64_t>(e.dur_ns, std::llround(l->get<double>() * 1000.0));
        }
      }
      trace.events.push_back(std::move(e));
      source_index.push_back(i);
    }

    double origin_us = 0;
    if (!native && !starts_us.empty()) origin_us = *std::min_element(starts_us.begin(), starts_us.end());
    for (std::size_t k = 0; k < trace.events.size(); ++k) {
      // Start and end must stay inside int64 ns: ≤ 4e15 µs each keeps their sum there.
      const double start_us = starts_us[k] - origin_us;
      if (start_us > kMaxMicros || trace.events[k].dur_ns > std::int64_t(kMaxMicros * 1000))
        fail(fmt::format("event {} (\"{}\"): start {} µs after the first event, duration {} µs: "
                         "expected each ≤ 4e15 µs",
                         k, trace.events[k].name, start_us, trace.events[k].dur_ns / 1000.0));
      trace.events[k].start_ns = std::llround(start_us * 1000.0);
    }
    int max_rank = -1;
    for (const auto& e : trace.events) max_rank = std::max(max_rank, e.rank);
    if (!native || trace.ranks == 0) trace.ranks = std::max(trace.ranks, max_rank + 1);
    if (trace.ranks <= max_rank)
      fail(fmt::format("otherData.ranks: {} but an event is on rank {}", trace.ranks, max_rank));
    for (std::size_t k = 0; k < trace.events.size(); ++k)
      if (trace.events[k].peer >= trace.ranks)
        fail_event(source_index[k], "args.peer",
                   fmt::format("rank {} does not exist; expected -1 (none) or a rank < {}",
                               trace.events[k].peer, trace.ranks));
    return trace;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("{}: {}", source_, what));
  }
  [[noreturn]] void fail_event(std::size_t i, const std::string& field, const std::string& what) const {
    if (field.empty()) fail(fmt::format("traceEvents[{}]: {}", i, what));
    fail(fmt::format("traceEvents[{}]: field \"{}\": {}", i, field, what));
  }

  void read_other(const json& o, Trace& trace) const {
    auto str = [&](const char* key, std::string& out) {
      if (auto it = o.find(key); it != o.end()) {
        if (!it->is_string()) fail(fmt::format("otherData.{}: expected a string", key));
        out = it->get<std::string>();
      }
    };
    str("origin", trace.origin);
    str("schedule", trace.schedule);
    str("scenario", trace.scenario);
    if (auto it = o.find("ranks"); it != o.end()) {
      if (!it->is_number_integer() || it->get<std::int64_t>() < 0 || it->get<std::int64_t>() > kMaxRanks)
        fail(fmt::format("otherData.ranks: expected an integer in [0, {}]", kMaxRanks));
      trace.ranks = it->get<int>();
    }
    if (auto it = o.find("metadata"); it != o.end()) {
      if (!it->is_object()) fail("otherData.metadata: expected an object of strings");
      for (const auto& [k, v] : it->items()) {
        if (!v.is_string()) fail(fmt::format("otherData.metadata.{}: expected a string", k));
        trace.metadata[k] = v.get<std::string>();
      }
    }
  }

  Id id(const json& ev, const char* field, std::size_t i) const {
    auto it = ev.find(field);
    if (it == ev.end()) fail_event(i, field, "missing");
    Id out;
    if (it->is_number_integer()) {
      out.number = it->get<std::int64_t>();
    } else if (it->is_number()) {
      out.number = std::llround(it->get<double>());
    } else if (it->is_string()) {
      out.is_string = true;
      out.text = it->get<std::string>();
    } else {
      fail_event(i, field, "expected a number or a string");
    }
    return out;
  }

  int int_field(const json& ev, const char* field, std::size_t i) const {
    auto it = ev.find(field);
    if (it == ev.end()) fail_event(i, field, "missing");
    if (!it->is_number_integer() || it->get<std::int64_t>() < 0 || it->get<std::int64_t>() > kMaxRanks)
      fail_event(i, field, fmt::format("expected an integer in [0, {}]", kMaxRanks));
    return it->get<int>();
  }

  double micros_field(const json& ev, const char* field, std::size_t i) const {
    auto it = ev.find(field);
    if (it == ev.end()) fail_event(i, field, "missing (X events need ts and dur in µs)");
    if (!it->is_number()) fail_event(i, field, "expected a number of µs");
    const double us = it->get<double>();
    if (!std::isfinite(us) || std::abs(us) > 9e15) fail_event(i, field, "out of range (|µs| ≤ 9e15)");
    return us;
  }

  void read_int_arg(const json& args, const char* key, std::size_t i, int min, int& out) const {
    auto it = args.find(key);
    if (it == args.end()) return;
    if (!it->is_number_integer() || it->get<std::int64_t>() < min ||
        it->get<std::int64_t>() > std::numeric_limits<int>::max())
      fail_event(i, fmt::format("args.{}", key),
                 fmt::format("expected an integer in [{}, {}], got {}", min, std::numeric_limits<int>::max(),
                             ir::quote_json(*it)));
    out = it->get<int>();
  }

  const json& root_;
  std::string source_;
  int format_ = 1;  // tdpipe traces: 1 (older files) or 2 (pid = rank + 1, args.stream)
};

}  // namespace

nlohmann::json to_chrome_json(const Trace& trace) {
  json events = json::array();
  const std::vector<int> lane = stream_lanes(trace);
  // rank → its (stream, lane) tracks in order; a track's tid is its place + 1.
  std::map<int, std::vector<std::pair<int, int>>> tracks;
  for (int r = 0; r < trace.ranks; ++r) tracks[r];
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    auto& t = tracks[trace.events[i].rank];
    const std::pair<int, int> key{trace.events[i].stream, lane[i]};
    if (std::find(t.begin(), t.end(), key) == t.end()) t.push_back(key);
  }
  auto tid_of = [&](int rank, int stream, int l) {
    const auto& t = tracks.at(rank);
    return static_cast<int>(std::find(t.begin(), t.end(), std::pair{stream, l}) - t.begin()) + 1;
  };
  for (auto& [rank, ts] : tracks) {
    std::sort(ts.begin(), ts.end());
    events.push_back({{"ph", "M"}, {"cat", "__metadata"}, {"name", "process_name"}, {"pid", rank + 1}, {"tid", 1},
                      {"args", {{"name", fmt::format("rank {}", rank)}}}});
    events.push_back({{"ph", "M"}, {"cat", "__metadata"}, {"name", "process_sort_index"}, {"pid", rank + 1},
                      {"tid", 1}, {"args", {{"sort_index", rank}}}});
    for (std::size_t k = 0; k < ts.size(); ++k) {
      const auto [s, l] = ts[k];
      const int tid = static_cast<int>(k) + 1;
      events.push_back({{"ph", "M"}, {"cat", "__metadata"}, {"name", "thread_name"}, {"pid", rank + 1}, {"tid", tid},
                        {"args", {{"name", l == 0 ? stream_name(s) : fmt::format("{} {}", stream_name(s), l + 1)}}}});
      events.push_back({{"ph", "M"}, {"cat", "__metadata"}, {"name", "thread_sort_index"}, {"pid", rank + 1},
                        {"tid", tid}, {"args", {{"sort_index", tid}}}});
    }
  }
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const auto& e = trace.events[i];
    events.push_back(event_json(e, tid_of(e.rank, e.stream, lane[i])));
  }
  // Flows: the k-th SEND from a to b meets the k-th RECV on b from a (in start order).
  std::map<std::pair<int, int>, std::vector<std::size_t>> sends, recvs;  // (from, to) → events
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const auto& e = trace.events[i];
    if (!e.kind || e.peer < 0) continue;
    if (*e.kind == ir::OpKind::SEND) sends[{e.rank, e.peer}].push_back(i);
    if (*e.kind == ir::OpKind::RECV) recvs[{e.peer, e.rank}].push_back(i);
  }
  auto by_start = [&](std::size_t a, std::size_t b) { return trace.events[a].start_ns < trace.events[b].start_ns; };
  int flow = 0;
  for (auto& [pair, s] : sends) {
    auto it = recvs.find(pair);
    if (it == recvs.end()) continue;
    auto& r = it->second;
    std::stable_sort(s.begin(), s.end(), by_start);
    std::stable_sort(r.begin(), r.end(), by_start);
    for (std::size_t k = 0; k < std::min(s.size(), r.size()); ++k) {
      const auto& a = trace.events[s[k]];
      const auto& b = trace.events[r[k]];
      // Each end inside its slice (the middle), so that it binds to it.
      const double at_a = (double(a.start_ns) + double(a.dur_ns) / 2) / 1000.0;
      const double at_b = (double(b.start_ns) + double(b.dur_ns) / 2) / 1000.0;
      ++flow;
      events.push_back({{"ph", "s"}, {"cat", "p2p"}, {"name", "p2p"}, {"id", flow}, {"pid", a.rank + 1},
                        {"tid", tid_of(a.rank, a.stream, lane[s[k]])}, {"ts", at_a}});
      events.push_back({{"ph", "f"}, {"bp", "e"}, {"cat", "p2p"}, {"name", "p2p"}, {"id", flow}, {"pid", b.rank + 1},
                        {"tid", tid_of(b.rank, b.stream, lane[r[k]])}, {"ts", std::max(at_a, at_b)}});
    }
  }
  json other = {{"generator", kGenerator},
                {"format", kFormat},
                {"origin", trace.origin},
                {"schedule", trace.schedule},
                {"scenario", trace.scenario},
                {"ranks", trace.ranks},
                {"metadata", trace.metadata}};
  return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ns"}, {"otherData", std::move(other)}};
}

Trace trace_from_chrome_json(const nlohmann::json& j, const std::string& source) {
  return Reader(j, source).read();
}

void write_chrome_trace(const Trace& trace, const std::string& path) {
  const json j = to_chrome_json(trace);
  // One event per line: large traces stay diffable and greppable.
  std::string out = "{\"traceEvents\": [\n";
  const json& events = j["traceEvents"];
  for (std::size_t i = 0; i < events.size(); ++i) out += events[i].dump() + (i + 1 < events.size() ? ",\n" : "\n");
  out += "],\n\"displayTimeUnit\": \"ns\",\n\"otherData\": " + j["otherData"].dump() + "}\n";
  ir::write_file_atomic(path, out, "trace");
}

}  // namespace tdpipe::traces
