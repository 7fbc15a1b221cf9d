// profile.cpp — calibration profile lookup and JSON I/O.
#include "tdpipe/traces/profile.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tdpipe/ir/atomic_file.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/json_read.hpp"
#include "tdpipe/ir/text.hpp"

namespace tdpipe::traces {
namespace {

using nlohmann::json;

constexpr int kFormatVersion = 1;

// Bounds on what a measurement can be: a value outside them is a corrupt or hand-made
// profile, and taking it would silently change every prediction made with it.
constexpr double kMaxOpSeconds = 86400;          // one op of a day
constexpr double kMaxLatencySeconds = 3600;
constexpr double kMaxBytesPerSecond = 1e18;      // 1 EB/s: "free", as tests and what-ifs use
constexpr int kMaxCount = 1 << 20;

// Typed field access with errors that name the source and the path of the field; keys
// other than `known` are rejected, as the scenario reader does.
class Fields {
 public:
  Fields(const json& j, std::string source, std::string path, std::vector<std::string> known)
      : j_(j), source_(std::move(source)), path_(std::move(path)) {
    if (!j_.is_object()) fail("", fmt::format("expected an object, got {}", ir::quote_json(j_)));
    for (const auto& [key, value] : j_.items())
      if (std::find(known.begin(), known.end(), key) == known.end())
        fail(key, fmt::format("unknown key; known keys: {}", fmt::join(known, ", ")));
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    const std::string where = path_.empty() ? key : (key.empty() ? path_ : path_ + "." + key);
    throw Error(fmt::format("{}: {}: {}", source_, where.empty() ? "top level" : where, what));
  }
  const json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  void str(const char* key, std::string& out) const {
    if (const json* v = find(key)) {
      if (!v->is_string()) fail(key, fmt::format("expected a string, got {}", ir::quote_json(*v)));
      out = v->get<std::string>();
    }
  }
  void integer(const char* key, int& out, int min, int max = kMaxCount) const {
    if (const json* v = find(key)) {
      if (!v->is_number_integer() || v->get<std::int64_t>() < min || v->get<std::int64_t>() > max)
        fail(key, fmt::format("expected an integer in [{}, {}], got {}", min, max, ir::quote_json(*v)));
      out = v->get<int>();
    }
  }
  void number(const char* key, double& out, double max) const {
    if (const json* v = find(key)) {
      if (!v->is_number()) fail(key, fmt::format("expected a number, got {}", ir::quote_json(*v)));
      out = v->get<double>();
      if (!(out >= 0 && out <= max)) fail(key, fmt::format("expected a number ≥ 0 and ≤ {:g}, got {}", max,
                                                           ir::quote_json(*v)));
    }
  }
  Fields sub(const char* key, std::vector<std::string> known) const {
    return Fields(*find(key), source_, join(key), std::move(known));
  }
  std::string join(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const std::string& source() const { return source_; }

 private:
  const json& j_;
  std::string source_, path_;
};

json transport_json(const TransportProfile& t) {
  return {{"latency", t.latency_seconds}, {"bandwidth", t.bytes_per_second}};
}

TransportProfile read_transport(const Fields& f) {
  TransportProfile t;
  f.number("latency", t.latency_seconds, kMaxLatencySeconds);
  f.number("bandwidth", t.bytes_per_second, kMaxBytesPerSecond);
  return t;
}

}  // namespace

std::optional<double> profile_seconds(const Profile& profile, ir::OpKind kind, int virtual_stage, int slice) {
  // Rank of specificity: 3 stage+slice, 2 stage, 1 slice, 0 neither.
  int best = -1;
  double seconds = 0;
  for (const auto& op : profile.ops) {
    if (op.kind != kind) continue;
    if (op.virtual_stage != -1 && op.virtual_stage != virtual_stage) continue;
    if (op.slice != -1 && op.slice != slice) continue;
    const int rank = (op.virtual_stage != -1 ? 2 : 0) + (op.slice != -1 ? 1 : 0);
    if (rank > best) {
      best = rank;
      seconds = op.seconds;
    }
  }
  if (best >= 0) return seconds;
  if (kind == ir::OpKind::BW) {
    const auto b = profile_seconds(profile, ir::OpKind::B, virtual_stage, slice);
    const auto w = profile_seconds(profile, ir::OpKind::W, virtual_stage, slice);
    if (b && w) return *b + *w;
  }
  return std::nullopt;
}

void apply_profile_to_scenario(const Profile& profile, ir::Scenario& scenario) {
  if (!(profile.compute_efficiency > 0)) return;
  if (scenario.synthetic)
    throw Error(fmt::format("a compute-efficiency profile prices the cost model's kernels; scenario '{}' is synthetic "
                            "(its op times are given): there is nothing to apply it to", scenario.name));
  const std::string& fitted = profile.platform.device;
  const std::vector<std::string> fitted_gpus = ir::split_commas(fitted);
  auto fitted_on = [&](const std::string& gpu) {
    return std::find(fitted_gpus.begin(), fitted_gpus.end(), gpu) != fitted_gpus.end();
  };
  bool some = false;
  for (const auto& g : scenario.cluster.groups) some = some || fitted_on(g.gpu.name);
  for (const auto& g : scenario.cluster.groups) {
    if (fitted_on(g.gpu.name)) continue;
    if (some)  // a mixed cluster, part of it fitted: one efficiency holds for the whole cluster
      throw Error(fmt::format("profile's compute efficiency was fitted on {} GPUs, but scenario '{}' also has {}: "
                              "one compute_efficiency holds for a whole cluster, so a profile fitted on one GPU type "
                              "cannot price a mixed one; fit on a run of this mixed cluster, or set "
                              "cluster.compute_efficiency in the scenario if one value suits both",
                              fitted, scenario.name, g.gpu.name));
    throw Error(fmt::format("profile's compute efficiency was fitted on {} GPUs, but scenario '{}' has {}: a "
                            "software stack's speed does not carry to another GPU; calibrate from a run on {}",
                            fitted.empty() ? "unnamed" : fitted, scenario.name, g.gpu.name, g.gpu.name));
  }
  scenario.cluster.compute_efficiency = profile.compute_efficiency;
}

ProfileApplied apply_profile(const Profile& profile, ir::Plan& plan, bool ops_only) {
  if (!profile.model.empty())
    throw Error("a fitted cost-model profile prices ops from their shapes: apply it with planner::apply_profile");
  if (profile.compute_efficiency > 0) {
    if (plan.scenario.cluster.compute_efficiency != profile.compute_efficiency)
      throw Error(fmt::format("a compute-efficiency profile ({}) applies to the scenario before planning "
                              "(apply_profile_to_scenario); the plan was built with {}",
                              profile.compute_efficiency, plan.scenario.cluster.compute_efficiency));
    return {};
  }
  if (!profile.scenario.empty() && profile.scenario != plan.scenario.name)
    throw Error(fmt::format("profile was measured for scenario '{}', but the plan is for '{}'; "
                            "calibrate this scenario first (tdpipe calibrate)",
                            profile.scenario, plan.scenario.name));
  if (profile.stages > 0 && profile.stages != plan.stages)
    throw Error(fmt::format("profile was measured with p = {} pipeline stages, the plan has p = {}; "
                            "its per-chunk op times do not apply",
                            profile.stages, plan.stages));
  // A stage's measured times hold for its layers only: a profile of the same stage
  // layout but another partition (parallel.layers_per_stage) would price the plan's
  // stages with the wrong work. (Other layouts — other chunk counts — are matched by
  // stage index as before; making them transfer is calibration's own work.)
  int profiled_stages = 0;
  for (const auto& op : profile.ops) profiled_stages = std::max(profiled_stages, op.virtual_stage + 1);
  if (!plan.scenario.synthetic && plan.scenario.model.layers > 0 && profiled_stages == plan.virtual_stages())
    for (const auto& op : profile.ops) {
      if (op.virtual_stage < 0 || op.virtual_stage >= plan.virtual_stages() || op.layers <= 0) continue;
      const auto [a, b] =
          ir::layer_range(plan.stage_layers, plan.scenario.model.layers, op.virtual_stage, plan.virtual_stages());
      if (b - a != op.layers)
        throw Error(fmt::format("profile was measured with {} layers on virtual stage {}, the plan puts {} there "
                                "(parallel.layers_per_stage); calibrate with this partition first",
                                op.layers, op.virtual_stage, b - a));
    }
  // A table holds for the layout it measured — its chunks and slices — whatever schedule
  // runs it (zb-h1's B and W serve 1f1b's); another layout's per-stage times would be
  // silently wrong (a ZB-V profile priced 1F1B at half its time).
  for (const auto& [key, mine] : {std::pair<const char*, int>{"chunks", plan.chunks},
                                  std::pair<const char*, int>{"slices", std::max(1, plan.slices)}})
    if (auto it = profile.metadata.find(key); it != profile.metadata.end() && it->second != std::to_string(mine))
      throw Error(fmt::format("profile measured one layout ({} schedule, {} {}); the plan has {} {}: its op times do "
                              "not carry to another layout — calibrate without --schedule (probe layouts, a fitted "
                              "cost model for any layout), or with --schedule {}",
                              profile.metadata.count("schedule") ? profile.metadata.at("schedule") : "its",
                              it->second, key, mine, key, plan.schedule));
  // Slice times hold for the slices' lengths: a profile of S slices cut otherwise (equal
  // cost vs slices auto) is refused for a plan with the same S.
  if (auto it = profile.metadata.find("slice_tokens"); it != profile.metadata.end() && plan.slices > 1) {
    const std::string mine = fmt::format("{}", fmt::join(plan.slice_tokens, ","));
    const auto measured = static_cast<int>(std::count(it->second.begin(), it->second.end(), ',')) + 1;
    if (measured == plan.slices && it->second != mine)
      throw Error(fmt::format("profile was measured with slices of [{}] tokens, the plan cuts [{}]; calibrate "
                              "with these slices first (same --slices)", it->second, mine));
  }
  ProfileApplied applied;
  for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
    for (ir::Op& op : plan.ranks[r]) {
      if (!ir::is_compute(op.kind)) continue;
      // OPT is measured per rank, under the rank's first chunk's stage (calibrate).
      const int chunk = op.kind == ir::OpKind::OPT ? 0 : op.chunk;
      int stage = -1;
      if (r < plan.stage_of.size() && chunk >= 0 && static_cast<std::size_t>(chunk) < plan.stage_of[r].size())
        stage = plan.stage_of[r][static_cast<std::size_t>(chunk)];
      if (const auto s = profile_seconds(profile, op.kind, stage, op.slice)) {
        op.est_seconds = *s;
        ++applied.ops_from_profile;
      } else {
        ++applied.ops_kept;
      }
    }
  }
  if (!ops_only) {
    apply_profile_platform(profile, plan);
    applied.links = profile.p2p.latency_seconds > 0;
  }
  return applied;
}

void apply_profile_platform(const Profile& profile, ir::Plan& plan) {
  if (profile.p2p.latency_seconds > 0) {
    auto& c = plan.scenario.cluster;
    c.nvlink_latency_seconds = c.ib_latency_seconds = profile.p2p.latency_seconds;
    if (profile.p2p.bytes_per_second > 0)
      c.nvlink_bytes_per_second = c.ib_bytes_per_second_per_nic = profile.p2p.bytes_per_second;
  }
  plan.scenario.cluster.shared_capacity = profile.platform.shared_capacity;
}

nlohmann::json to_json(const Profile& p) {
  json ops = json::array();
  for (const auto& op : p.ops)
    ops.push_back({{"kind", std::string(ir::to_string(op.kind))},
                   {"virtual_stage", op.virtual_stage},
                   {"slice", op.slice},
                   {"layers", op.layers},
                   {"seconds", op.seconds},
                   {"samples", op.samples}});
  json j = {{"tdpipe_profile", kFormatVersion},
          {"scenario", p.scenario},
          {"platform",
           {{"backend", p.platform.backend},
            {"device", p.platform.device},
            {"description", p.platform.description},
            {"cores", p.platform.cores},
            {"ranks", p.platform.ranks},
            {"threads_per_rank", p.platform.threads_per_rank},
            {"shared_capacity", p.platform.shared_capacity}}},
          {"ops", std::move(ops)},
          {"p2p", transport_json(p.p2p)},
          {"collective", transport_json(p.collective)},
          {"metadata", p.metadata}};
  if (p.stages > 0) j["stages"] = p.stages;  // 0: unknown, left out
  if (!p.model.empty()) {
    json model = json::object();
    if (!p.model.gpu.empty()) model["gpu"] = p.model.gpu;
    for (const auto& [kind, coef] : p.model.coefficients) {
      json terms = json::object();
      for (int i = 0; i < kCostTermCount; ++i)
        if (coef.at(static_cast<std::size_t>(i)) != 0) terms[kCostTerms[i]] = coef[static_cast<std::size_t>(i)];
      model[std::string(ir::to_string(kind))] = std::move(terms);
    }
    j["model"] = std::move(model);
  }
  if (p.compute_efficiency > 0) j["compute_efficiency"] = p.compute_efficiency;
  return j;
}

Profile profile_from_json(const nlohmann::json& j, const std::string& source) {
  const Fields top(j, source, "",
                   {"tdpipe_profile", "scenario", "stages", "platform", "ops", "p2p", "collective", "metadata",
                    "compute_efficiency", "model"});
  const json* version = top.find("tdpipe_profile");
  if (!version) top.fail("tdpipe_profile", "missing (not a tdpipe calibration profile)");
  if (!version->is_number_integer() || version->get<int>() != kFormatVersion)
    top.fail("tdpipe_profile", fmt::format("expected format version {}", kFormatVersion));
  Profile p;
  top.str("scenario", p.scenario);
  top.integer("stages", p.stages, 1);  // absent: unknown (0)
  if (top.find("compute_efficiency")) {
    top.number("compute_efficiency", p.compute_efficiency, 100);
    if (p.compute_efficiency < 0.01) top.fail("compute_efficiency", "expected 0.01 to 100");
  }
  if (top.find("platform")) {
    const Fields f = top.sub("platform", {"backend", "device", "description", "cores", "ranks",
                                          "threads_per_rank", "shared_capacity"});
    f.str("backend", p.platform.backend);
    f.str("device", p.platform.device);
    f.str("description", p.platform.description);
    f.integer("cores", p.platform.cores, 0);
    f.integer("ranks", p.platform.ranks, 0);
    f.integer("threads_per_rank", p.platform.threads_per_rank, 1);
    f.number("shared_capacity", p.platform.shared_capacity, kMaxCount);
  }
  if (const json* ops = top.find("ops")) {
    if (!ops->is_array()) top.fail("ops", "expected an array");
    for (std::size_t i = 0; i < ops->size(); ++i) {
      const Fields f((*ops)[i], source, fmt::format("ops[{}]", i),
                     {"kind", "virtual_stage", "slice", "layers", "seconds", "samples"});
      ProfileOp op;
      std::string kind;
      f.str("kind", kind);
      const auto k = ir::op_kind_from_string(kind);
      if (!k || !ir::is_compute(*k)) f.fail("kind", fmt::format("expected F, B, W, BW or OPT, got \"{}\"", kind));
      op.kind = *k;
      f.integer("virtual_stage", op.virtual_stage, -1);  // -1: any stage
      f.integer("slice", op.slice, -1);                  // -1: any slice
      f.integer("layers", op.layers, 0);
      if (!f.find("seconds")) f.fail("seconds", "missing");
      f.number("seconds", op.seconds, kMaxOpSeconds);
      f.integer("samples", op.samples, 0);
      p.ops.push_back(op);
    }
  }
  if (const json* model = top.find("model")) {
    if (!model->is_object() || model->empty())
      top.fail("model", "expected an object of op kinds (F, B, W, BW, OPT), each an object of term coefficients");
    // A fitted model prices every op itself: a table, a stage count or a stack efficiency
    // beside it would be ignored or applied twice.
    for (const char* other : {"ops", "stages", "compute_efficiency"})
      if (const json* v = top.find(other); v && !(v->is_array() && v->empty()))
        top.fail(other, "not allowed with \"model\" (a fitted cost model prices every op of any layout)");
    const std::vector<std::string> terms(std::begin(kCostTerms), std::end(kCostTerms));
    const Fields m = top.sub("model", {"gpu", "F", "B", "W", "BW", "OPT"});
    m.str("gpu", p.model.gpu);
    if (p.model.gpu.empty())
      m.fail("gpu", "missing: the GPU (preset name) whose peak rates the model's terms were computed with");
    for (const auto& [kind, _] : model->items()) {
      if (kind == "gpu") continue;
      const auto k = ir::op_kind_from_string(kind);
      if (!k || !ir::is_compute(*k)) top.fail("model." + kind, "expected an op kind F, B, W, BW or OPT");
      const Fields f = m.sub(kind.c_str(), terms);
      std::vector<double> coef(kCostTermCount, 0.0);
      for (int i = 0; i < kCostTermCount; ++i) f.number(kCostTerms[i], coef[static_cast<std::size_t>(i)], kMaxOpSeconds);
      p.model.coefficients[*k] = std::move(coef);
    }
    if (p.model.coefficients.empty()) top.fail("model", "expected at least one op kind (F, B, W, BW, OPT)");
  }
  if (top.find("p2p")) p.p2p = read_transport(top.sub("p2p", {"latency", "bandwidth"}));
  if (top.find("collective")) p.collective = read_transport(top.sub("collective", {"latency", "bandwidth"}));
  if (const json* m = top.find("metadata")) {
    if (!m->is_object()) top.fail("metadata", "expected an object of strings");
    for (const auto& [k, v] : m->items()) {
      if (!v.is_string()) top.fail("metadata." + k, "expected a string");
      p.metadata[k] = v.get<std::string>();
    }
  }
  return p;
}

void write_profile(const Profile& profile, const std::string& path) {
  ir::write_file_atomic(path, to_json(profile).dump(2) + "\n", "profile");
}

Profile read_profile(const std::string& path) {
  return profile_from_json(ir::parse_json(ir::read_file(path, "profile"), path), path);
}

}  // namespace tdpipe::traces
