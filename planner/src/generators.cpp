// generators.cpp — the registry of schedule generators (name → compute-only plan).
//
// Parameters a schedule does not use are ignored rather than rejected: `chunks` is read
// by interleaved only (zb-v always places 2 chunks, the others 1), `slices`,
// `slice_costs` and `max_inflight` by tdpipe only. All of p, m, v, S must be ≥ 1.
#include "tdpipe/planner/generators.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>

#include "schedule_common.hpp"
#include "tdpipe/ir/error.hpp"

namespace tdpipe::planner {
namespace {

struct Generator {
  std::string_view name;
  ir::Plan (*make)(const ScheduleParams&);
};

constexpr std::array<Generator, 8> kGenerators = {{
    {"gpipe", detail::make_gpipe},
    {"1f1b", detail::make_1f1b},
    {"interleaved", detail::make_interleaved},
    {"zb-h1", detail::make_zb_h1},
    {"zb-h2", detail::make_zb_h2},
    {"zb-v", detail::make_zb_v},
    {"tdpipe", detail::make_tdpipe},
    {"auto", detail::make_auto},
}};

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& g : kGenerators) out.emplace_back(g.name);
    return out;
  }();
  return names;
}

ir::Plan make_schedule(std::string_view name, const ScheduleParams& params) {
  for (const auto& g : kGenerators) {
    if (g.name != name) continue;
    detail::check_common(name, params);
    return g.make(params);
  }
  throw Error(fmt::format("unknown schedule '{}': expected one of {}", name,
                          fmt::join(schedule_names(), ", ")));
}

}  // namespace tdpipe::planner
