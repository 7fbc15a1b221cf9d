// nsys.cpp — the NVTX ranges of an Nsight Systems SQLite export as a measured trace.
//
// `nsys export --type sqlite` writes NVTX_EVENTS (start, end in ns; eventType 59 for
// push/pop ranges, 60 for start/end ranges; the text inline or through textId →
// StringIds.value; globalTid, whose bits 24–47 are the process id). Each range named like
// a tdpipe op (or several joined by '+') becomes that op's event; a process is a rank —
// ranks in ascending process id, the order in which a launcher (mpirun, torchrun)
// starts them, which the export does not record otherwise. Times keep the report's one
// clock, shifted so that the first op starts at 0. The ranges are host-side: they span
// an op's GPU time only where the backend waits for its kernels, which tdpipe's CUDA
// backend no longer does (stream order: its compute ranges cover issuing; its own trace,
// `--trace-out`, times ops with CUDA events); GPU projection of NVTX ranges is not read.
#include "tdpipe/traces/nsys.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <tuple>

#include <fmt/format.h>
#include <sqlite3.h>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/traces/op_name.hpp"

namespace tdpipe::traces {
namespace {

struct CloseDb {
  void operator()(sqlite3* db) const { sqlite3_close(db); }
};
struct Finalize {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};

constexpr int kPushPopRange = 59;
constexpr int kStartEndRange = 60;

}  // namespace

bool is_sqlite_file(const std::string& head) {
  static constexpr char kMagic[] = "SQLite format 3";  // + '\0': the first 16 bytes of every database
  return head.size() >= sizeof kMagic && head.compare(0, sizeof kMagic, kMagic, sizeof kMagic) == 0;
}

Trace trace_from_nsys_sqlite(const std::string& path) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr);
  std::unique_ptr<sqlite3, CloseDb> db(raw);
  if (rc != SQLITE_OK)
    throw Error(fmt::format("{}: cannot open as SQLite: {}", path, raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
  auto prepare = [&](const char* sql) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db.get(), sql, -1, &s, nullptr) != SQLITE_OK) {
      sqlite3_finalize(s);
      return std::unique_ptr<sqlite3_stmt, Finalize>();
    }
    return std::unique_ptr<sqlite3_stmt, Finalize>(s);
  };
  auto has_table = [&](const char* table) {
    auto s = prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1");
    if (!s) throw Error(fmt::format("{}: not a readable SQLite database: {}", path, sqlite3_errmsg(db.get())));
    sqlite3_bind_text(s.get(), 1, table, -1, SQLITE_STATIC);
    return sqlite3_step(s.get()) == SQLITE_ROW;
  };
  if (!has_table("NVTX_EVENTS"))
    throw Error(fmt::format("{}: no NVTX_EVENTS table: expected an Nsight Systems report exported with "
                            "`nsys export --type sqlite` from a run traced with NVTX (nsys profile -t nvtx,…)",
                            path));
  const bool string_ids = has_table("StringIds");
  const std::string sql = fmt::format(
      "SELECT n.start, n.end, {}, n.globalTid FROM NVTX_EVENTS n {} "
      "WHERE n.eventType IN ({}, {}) AND n.end IS NOT NULL ORDER BY n.start",
      string_ids ? "COALESCE(n.text, s.value)" : "n.text", string_ids ? "LEFT JOIN StringIds s ON n.textId = s.id" : "",
      kPushPopRange, kStartEndRange);
  auto q = prepare(sql.c_str());
  if (!q)
    throw Error(fmt::format("{}: NVTX_EVENTS lacks the columns start, end, text, textId, globalTid, eventType "
                            "of Nsight Systems' export schema: {}",
                            path, sqlite3_errmsg(db.get())));

  struct Range {
    std::int64_t start, end, pid;
    std::string text;
  };
  std::vector<Range> ranges;
  std::int64_t other = 0;
  int step;
  while ((step = sqlite3_step(q.get())) == SQLITE_ROW) {
    const unsigned char* text = sqlite3_column_text(q.get(), 2);
    const std::int64_t start = sqlite3_column_int64(q.get(), 0), end = sqlite3_column_int64(q.get(), 1);
    if (!text) {
      ++other;
      continue;
    }
    constexpr std::int64_t kMaxNs = 4'000'000'000'000'000'000;  // far beyond any report; keeps sums in int64
    if (start < 0 || end < start || end > kMaxNs)
      throw Error(fmt::format("{}: NVTX range \"{}\" from {} ns to {} ns: expected 0 ≤ start ≤ end ≤ 4e18 ns", path,
                              reinterpret_cast<const char*>(text), start, end));
    const std::int64_t global_tid = sqlite3_column_int64(q.get(), 3);
    ranges.push_back({start, end, (global_tid >> 24) & 0xFFFFFF, reinterpret_cast<const char*>(text)});
  }
  if (step != SQLITE_DONE) throw Error(fmt::format("{}: reading NVTX_EVENTS: {}", path, sqlite3_errmsg(db.get())));

  std::map<std::int64_t, int> rank_of_pid;
  std::vector<std::pair<Range*, std::vector<NamedOp>>> ops;
  for (auto& r : ranges) {
    auto group = parse_op_group(r.text);
    if (group.empty()) {
      ++other;
      continue;
    }
    rank_of_pid.emplace(r.pid, 0);
    ops.emplace_back(&r, std::move(group));
  }
  if (ops.empty())
    throw Error(fmt::format("{}: no NVTX ranges named like tdpipe ops ({} other ranges); name each op's range after "
                            "its text form, e.g. nvtxRangePushA(\"F3\"), \"SEND(F0>r1)\"",
                            path, other));
  int n = 0;
  for (auto& [pid, rank] : rank_of_pid) rank = n++;

  Trace trace;
  trace.origin = "nsys";
  trace.ranks = n;
  const std::int64_t origin = ops.empty() ? 0 : ops.front().first->start;  // ranges come in start order
  for (const auto& [r, group] : ops)
    for (const auto& [name, op] : group) {
      TraceEvent e;
      e.rank = rank_of_pid.at(r->pid);
      e.name = name;
      set_op_fields(e, op);
      e.stream = op.stream_or_default();
      e.start_ns = r->start - origin;
      e.dur_ns = r->end - r->start;
      if (e.peer >= n)
        throw Error(fmt::format("{}: NVTX range \"{}\" names rank {}, but the report has {} process(es) with "
                                "tdpipe ops",
                                path, r->text, e.peer, n));
      trace.events.push_back(std::move(e));
    }
  std::stable_sort(trace.events.begin(), trace.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return std::tie(a.rank, a.start_ns) < std::tie(b.rank, b.start_ns);
  });
  trace.metadata["nsys.other_ranges"] = std::to_string(other);  // ranges not named like ops
  return trace;
}

}  // namespace tdpipe::traces
