// search.hpp — `tdpipe search`: which layout and schedule to run a model with on a
// cluster. Enumerates (t, p, d, v, S, micro-batch, recompute, sequence parallelism,
// schedule, memory budget, stage partition), prunes by the memory model, bounds each
// layout's iteration time from below in closed form, and plans and evaluates with the
// analytic engine only the layouts whose bound can still beat the K-th best found
// (branch and bound: the top K it returns are exactly the analytic engine's top K over
// the whole space). Re-simulating the top K with SimGrid is the app's job (planner does
// not depend on sim).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tdpipe/ir/scenario.hpp"
#include "tdpipe/planner/build_plan.hpp"

namespace tdpipe::planner {

enum class Objective { Time, TokensPerSecond, Cost };

/// "time", "tokens_per_s", "cost" → Objective; throws tdpipe::Error naming the choices.
Objective objective_from_string(const std::string& name);
const char* to_string(Objective objective);

/// One point of the space: everything `tdpipe plan` needs besides the model.
struct Layout {
  int gpus = 0;  ///< t·p·d
  int tensor = 1, pipeline = 1, data = 1;
  int chunks = 1;  ///< v (interleaved; zb-v 2)
  int micro_batch = 1;
  int global_batch = 1;
  ir::Recompute recompute = ir::Recompute::None;
  bool sequence_parallel = false;
  std::string schedule;  ///< a planner::schedule_names() entry
  int slices = 1;        ///< S ≥ 1, or kAutoSlices (TeraPipe's cuts)
  std::string budget;    ///< auto only: parallel.memory_budget
  bool partition_auto = false;  ///< layers_per_stage: auto (false: the even split)
  /// "t8 p16 d4 mb1 1f1b", with v, S, recompute, SP, budget and partition when they apply.
  std::string label() const;
  /// build_plan's `slices` for this layout: `slices` for tdpipe and auto, else 0.
  int plan_slices() const { return schedule == "tdpipe" || schedule == "auto" ? slices : 0; }
};

/// The scenario `base` with `layout` applied (cluster resized for layout.gpus when
/// the cluster is homogeneous).
ir::Scenario apply_layout(const ir::Scenario& base, const Layout& layout);

struct SearchOptions {
  int gpus = 0;  ///< 0: the scenario's cluster
  std::vector<int> global_batches;  ///< empty: the scenario's; several only for tokens_per_s and cost
  Objective objective = Objective::Time;
  int top = 5;               ///< K: the exact top K by the analytic engine
  int max_micro_batch = 8;   ///< micro-batches 1, 2, 4, … up to this
  int max_chunks = 8;        ///< interleaved v = 2 … this
  std::vector<int> slice_counts = {2, 4, 8};  ///< tdpipe's S (and auto's with the max budget)
  bool auto_slices = true;   ///< also TeraPipe's cuts (tdpipe, auto)
  std::vector<std::string> schedules;  ///< empty: every generator
  /// Recompute modes to try; empty: none, selective (standard attention only: with flash
  /// attention it is the same plan as none) and full.
  std::vector<ir::Recompute> recomputes;
  /// Sequence parallelism (t > 1): both, or only the given setting.
  enum class Toggle { Both, Off, On } sequence_parallel = Toggle::Both;
  std::int64_t max_ops = kDefaultMaxOps;
  int threads = 0;  ///< plan this many candidates at once per worker; 0: one per core, at most 4
  /// Called while planning with the fraction of layouts decided so far (0…1).
  std::function<void(double fraction, int planned)> progress;
};

/// What became of a layout.
enum class Verdict {
  Ranked,        ///< planned, evaluated, fits
  NoFit,         ///< does not fit (before planning, by the memory model, or after)
  Bounded,       ///< its lower bound is no better than the K-th best: never planned
  TooLarge,      ///< more ops than max_ops
  Failed,        ///< the planner refused it (message in `reason`)
};
const char* to_string(Verdict verdict);

/// A layout and what the search learned of it.
struct Candidate {
  Layout layout;
  double bound_seconds = 0;        ///< lower bound on the analytic iteration time
  double bound_compute_seconds = 0;  ///< the busiest rank's compute in the bound
  double bound_score = 0;          ///< the objective at the bound (search_layouts)
  /// The bound is the rough one of a layout whose slice cuts are not made yet (slices
  /// auto: TeraPipe's solver runs only for the layouts the search gets to).
  bool rough_bound = false;
  double static_bytes = 0;         ///< weights + grads + optimizer on the fullest rank
  Verdict verdict = Verdict::Bounded;
  std::string reason;              ///< why it lost or was dropped (filled by rank_losers)
  // Planned layouts (verdict Ranked or a NoFit found after planning):
  bool planned = false;
  double iteration_seconds = 0;
  double compute_seconds = 0;  ///< busiest rank's compute
  double comm_seconds = 0;     ///< that rank's data movement while it does not compute (RECV waits excluded)
  double bubble_seconds = 0;   ///< iteration − the two (waiting for peers included)
  double tokens_per_second = 0;
  double mfu = 0;
  double peak_bytes = 0;       ///< largest per-GPU need (memory model)
  double hbm_bytes = 0;        ///< that GPU's memory
  /// Objective value, lower is better: seconds, −tokens/s, or GPU·hours per 1M tokens.
  double score = 0;
};

struct SearchResult {
  std::vector<Candidate> candidates;  ///< every layout considered, in enumeration order
  std::vector<int> top;               ///< indices of the best K Ranked layouts, best first
  int considered = 0, pruned_memory = 0, pruned_bound = 0, planned = 0;
  double seconds = 0;                 ///< wall time of the search
};

/// Every layout of the space for `base` (scenario checks passed; duplicates — the same
/// plan twice, e.g. selective recompute under flash attention — listed once), with its
/// bound and static memory, verdict Bounded (or NoFit when weights, gradients and
/// optimizer state alone overflow a GPU; Failed when the planner's inputs refuse it).
std::vector<Candidate> enumerate_layouts(const ir::Scenario& base, const SearchOptions& options);

/// Plans and evaluates one candidate with the analytic engine; fills the planned fields
/// and verdict (Ranked, NoFit, TooLarge or Failed).
void evaluate_candidate(const ir::Scenario& base, Candidate& candidate, const SearchOptions& options);

/// Exchange of a search round's outcomes between workers: called by each of `workers`
/// with the candidates it evaluated this round (their indices); returns when every
/// worker's candidates are filled in on this worker too. nullptr: one worker.
using Exchange = std::function<void(std::vector<Candidate>& candidates, const std::vector<int>& mine)>;

/// The search: enumerate_layouts, then in bound order evaluate until the next bound
/// cannot beat the K-th best score. Each round takes workers × threads candidates; the
/// k-th goes to worker k mod workers, which plans its share on `threads` threads, and
/// `exchange` shares the outcomes (every worker ends with the same result — so every
/// worker must be given the same options, threads included). Fills the losers' reasons
/// (rank_losers).
SearchResult search_layouts(const ir::Scenario& base, const SearchOptions& options, int worker = 0,
                            int workers = 1, const Exchange& exchange = nullptr);

/// Each loser's reason against the winner: planned ones by the objective (time: the
/// largest of the extra compute / bubble / communication on the busiest rank, "bubble:
/// +1.2 s (iteration +3.0 %)"; cost, tokens_per_s: the difference), bounded ones "bound:
/// at least X s (…)". Dropped ones keep theirs ("does not fit: …", "refused: …").
void rank_losers(SearchResult& result, const SearchOptions& options);

/// Lower bound on the analytic engine's iteration time of the plan build_plan makes for
/// `scenario` and `schedule` (slices as build_plan takes them), and the busiest rank's
/// compute in it; see search.cpp for the argument. Exposed for the tests.
struct TimeBound {
  double seconds = 0;
  double compute_seconds = 0;
};
TimeBound iteration_lower_bound(const ir::Scenario& scenario, const std::string& schedule, int slices);

}  // namespace tdpipe::planner
