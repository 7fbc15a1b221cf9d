// comparison.cpp — metrics-table rows: the numbers of `tdpipe compare`
// (traces::compare) when both traces are open, plus per-side metrics.
#include "tdpipe/viz/comparison.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <utility>

#include "tdpipe/traces/compare.hpp"

namespace tdpipe::viz {
namespace {

double ns(std::int64_t v) { return static_cast<double>(v); }

// A time row's values in the unit that makes the largest read between 1 and 1000
// (ns, µs, ms, s), so that every column shares it.
void scale_time_row(ComparisonRow& row) {
  double a = 0;
  for (const auto& v : row.values)
    if (v) a = std::max(a, std::abs(*v));
  const auto [scale, unit] = a >= 1e9 ? std::pair{1e9, "s"} : a >= 1e6 ? std::pair{1e6, "ms"}
                                 : a >= 1e3 ? std::pair{1e3, "µs"} : std::pair{1.0, "ns"};
  row.unit = unit;
  for (auto& v : row.values)
    if (v) *v /= scale;
}

template <class F>
double mean_over_ranks(const traces::Metrics& m, F f) {
  if (m.ranks.empty()) return 0;
  double sum = 0;
  for (const auto& r : m.ranks) sum += f(r);
  return sum / static_cast<double>(m.ranks.size());
}

}  // namespace

std::optional<double> relative_difference_pct(double first, double second) {
  if (second == 0) return std::nullopt;
  return 100.0 * (first - second) / second;
}

std::vector<ComparisonRow> comparison_rows(const TimelineModel& model,
                                           const std::vector<traces::Metrics>& metrics) {
  std::vector<ComparisonRow> rows;
  const int n = static_cast<int>(metrics.size());
  const bool two = n == 2 && model.count() == 2;
  std::optional<traces::Comparison> cmp;
  std::string cmp_error;
  if (two) {
    try {
      cmp = traces::compare(model.trace(0), model.trace(1));
    } catch (const std::exception& e) {
      cmp_error = e.what();  // e.g. traces of different runs: show both, compare nothing
    }
  }
  auto trace_row = [&](std::string name, std::string unit, auto value) {
    ComparisonRow row{std::move(name), std::move(unit), {}, {}, "%"};
    for (const auto& m : metrics) row.values.emplace_back(value(m));
    if (two) row.error = relative_difference_pct(*row.values[0], *row.values[1]);
    return row;
  };

  auto time_row = [&](std::string name, auto value) {
    ComparisonRow row = trace_row(std::move(name), "ns", value);
    scale_time_row(row);
    return row;
  };
  auto iter = time_row("iteration time", [](const traces::Metrics& m) { return ns(m.iteration_ns); });
  if (cmp) iter.error = 100.0 * cmp->iteration_error;
  rows.push_back(iter);
  // Bubble: the time a rank's compute stream does not run, over the iteration — exposed
  // communication is bubble too (the same meaning as the charts and `tdpipe compare`).
  auto bubble = trace_row("bubble (1 − mean compute / iteration)", "%",
                          [](const traces::Metrics& m) { return 100.0 * m.bubble_fraction; });
  bubble.error_unit = "pp";
  bubble.error = cmp ? std::optional<double>(cmp->bubble_error_pp) : std::nullopt;
  rows.push_back(bubble);
  rows.push_back(time_row("compute / rank", [](const traces::Metrics& m) {
    return mean_over_ranks(m, [](const traces::RankMetrics& r) { return ns(r.compute_ns); });
  }));
  rows.push_back(time_row("exposed comm / rank (part of the bubble)", [](const traces::Metrics& m) {
    return mean_over_ranks(m, [](const traces::RankMetrics& r) { return ns(r.exposed_comm_ns); });
  }));
  rows.push_back(time_row("hidden comm / rank", [](const traces::Metrics& m) {
    return mean_over_ranks(m, [](const traces::RankMetrics& r) { return ns(r.hidden_comm_ns); });
  }));

  // A row of the two traces' comparison: no per-trace values, or the two given.
  auto pair_row = [](std::string name, std::string unit, std::optional<double> a, std::optional<double> b,
                     std::optional<double> error, std::string error_unit) {
    ComparisonRow row{std::move(name), std::move(unit), {a, b}, error, std::move(error_unit)};
    return row;
  };
  if (cmp) {
    rows.push_back(pair_row("ops (matched)", "", double(cmp->matched + cmp->only_predicted),
                            double(cmp->matched + cmp->only_measured), double(cmp->matched), ""));
    auto dist = [&](const std::string& what, const traces::ErrorDistribution& d) {
      if (d.count == 0) return;
      rows.push_back(pair_row(what + " dur |error| median", "", {}, {}, 100.0 * d.median, "%"));
      rows.push_back(pair_row(what + " dur |error| p90", "", {}, {}, 100.0 * d.p90, "%"));
      rows.push_back(pair_row(what + " dur |error| max", "", {}, {}, 100.0 * d.max, "%"));
    };
    dist("compute op", cmp->compute_duration_error);
    dist("all op", cmp->all_duration_error);
    for (const auto& rc : cmp->ranks)
      rows.push_back(pair_row("rank " + std::to_string(rc.rank) + " bubble", "%", 100.0 * rc.predicted_idle,
                              100.0 * rc.measured_idle, rc.bubble_error_pp, "pp"));
    for (const auto& w : cmp->warnings) rows.push_back(pair_row("warning: " + w, "", {}, {}, {}, ""));
  } else {
    if (!cmp_error.empty()) rows.push_back(pair_row("not comparable: " + cmp_error, "", {}, {}, {}, ""));
    std::size_t ranks = 0;
    for (const auto& m : metrics) ranks = std::max(ranks, m.ranks.size());
    for (std::size_t r = 0; r < ranks; ++r) {
      ComparisonRow row{"rank " + std::to_string(r) + " bubble", "%", {}, {}, "pp"};
      for (const auto& m : metrics)
        row.values.push_back(r < m.ranks.size() ? std::optional<double>(100.0 * m.ranks[r].idle_fraction)
                                                : std::nullopt);
      rows.push_back(std::move(row));
    }
  }
  // Every row has a cell per trace (the pair rows' blanks included).
  for (auto& row : rows) row.values.resize(static_cast<std::size_t>(n));
  return rows;
}

}  // namespace tdpipe::viz
