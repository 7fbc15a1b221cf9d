// exec_common.cpp — the backend-independent halves of `tdpipe exec` / `calibrate`.
#ifdef TDPIPE_HAVE_EXEC

#include "exec_common.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "commands.hpp"

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/ir/text.hpp"
#include "tdpipe/traces/metrics.hpp"

namespace tdpipe::apps {

using traces::median;

void check_cpu_backend(const std::string& backend) {
#ifdef TDPIPE_CUDA_BINARY
  if (backend == "cuda") {
    // The same command, run by the binary that has the CUDA backend (it replaces this process).
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    const std::filesystem::path cuda = self.parent_path() / TDPIPE_CUDA_BINARY;
    if (ec || !std::filesystem::exists(cuda))
      throw Error(fmt::format("--backend cuda: {} is not next to this tdpipe ({}): it runs the CUDA backend; "
                              "build it (the default or gpu preset on a machine with nvcc and NCCL) or install both",
                              TDPIPE_CUDA_BINARY, ec ? std::string("unknown location") : self.parent_path().string()));
    std::vector<std::string> args = invocation();
    if (args.empty()) args.push_back("tdpipe");
    args[0] = cuda.string();
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(stdout);
    std::fflush(stderr);
    ::execv(cuda.c_str(), argv.data());
    throw Error(fmt::format("--backend cuda: could not start {}: {}", cuda.string(), std::strerror(errno)));
  }
#endif
  if (backend == "cuda")
    throw Error("--backend cuda: this tdpipe was built without the CUDA backend (configure with "
                "-DTDPIPE_WITH_CUDA=ON on a machine with nvcc and NCCL, e.g. the `gpu` preset)");
  if (backend != "cpu") throw Error(fmt::format("--backend {}: expected cpu or cuda", backend));
}

exec::cpu::TrainOptions train_options(int steps, double lr, std::uint64_t seed, const std::string& corpus) {
  exec::cpu::TrainOptions t;
  t.steps = steps;
  t.adam.lr = lr;
  t.data_seed = seed;
  t.corpus_path = corpus;
  return t;
}

bool bf16_wire(const std::string& wire, bool cuda, const ir::Scenario& sc) {
  if (wire == "auto") return cuda && sc.model.dtype == "bf16";
  if (wire == "bf16" || wire == "fp32") return wire == "bf16";
  throw Error("--wire " + wire + ": expected auto, bf16 or fp32");
}

double steady_iteration_seconds(const std::vector<double>& its) {
  return median(std::vector<double>(its.begin() + (its.size() > 1 ? 1 : 0), its.end()));
}

double max_rel(const exec::cpu::ParamMap& got, const exec::cpu::ParamMap& want, bool skip_missing) {
  double worst = 0;
  for (const auto& [name, w] : want) {
    const auto it = got.find(name);
    if (it == got.end() && skip_missing) continue;
    const auto& g = it == got.end() ? got.at(name) : it->second;  // at() throws the missing name
    if (g.size() != w.size())
      throw Error(fmt::format("--check: parameter {} has {} values in this run but {} in the single-device "
                              "reference: the two models differ", name, g.size(), w.size()));
    double num = 0, den = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      num += (g[i] - w[i]) * (g[i] - w[i]);
      den += w[i] * w[i];
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

nlohmann::json run_report(const ir::Scenario& scenario, const ir::Plan& plan, int steps,
                          const exec::cpu::RunResult& run, double weights_l2, double iteration_seconds,
                          const std::string& trace_out) {
  nlohmann::json j;
  j["scenario"] = scenario.name;
  j["schedule"] = plan.schedule;
  j["pipeline"] = plan.stages;
  j["data"] = plan.data;
  j["microbatches"] = plan.microbatches;
  j["chunks"] = plan.chunks;
  j["slices"] = plan.slices;
  j["steps"] = steps;
  j["loss_per_step"] = run.loss_per_step;
  j["final_loss"] = run.loss_per_step.empty() ? 0.0 : run.loss_per_step.back();
  j["weights_l2"] = weights_l2;
  j["iteration_time"] = iteration_seconds;
  j["iteration_times"] = run.iteration_seconds;
  j["trace_iteration_times"] = run.span_seconds;  // each step's span, as traces and compare measure it
  j["optimizer"] = scenario.parallel.optimizer;
  if (scenario.parallel.onebit()) j["onebit_warmup_steps"] = scenario.parallel.onebit_warmup_steps;
  if (!run.dp_wire_bytes.empty()) j["dp_wire_bytes"] = run.dp_wire_bytes;  // (the CPU backend counts them)
  if (!run.param_state_peak_bytes.empty()) j["param_state_peak_bytes"] = run.param_state_peak_bytes;
  j["param_offload"] = scenario.parallel.param_offload;
  j["first_step"] = run.state.steps_done - static_cast<int>(run.loss_per_step.size());  // > 0 when resumed
  j["dtype"] = scenario.model.dtype;
  if (!run.loss_scale.empty()) {
    nlohmann::json steps_json = nlohmann::json::array();
    for (const auto& st : run.loss_scale)
      steps_json.push_back({{"scales", st.scales}, {"overflow", st.overflow}, {"skipped", st.skipped}});
    j["loss_scale"] = steps_json;
    j["skipped_steps"] = std::count_if(run.loss_scale.begin(), run.loss_scale.end(), [](const auto& st) { return st.skipped; });
    j["loss_scale_next"] = run.state.loss_scale.scales;
  }
  if (!run.earlier_loss_per_step.empty()) j["earlier_loss_per_step"] = run.earlier_loss_per_step;
  if (!run.faults.empty() || run.restarts > 0 || !run.unfired_faults.empty()) {
    nlohmann::json faults = nlohmann::json::array();
    for (const auto& f : run.faults)
      faults.push_back({{"kind", f.kind}, {"step", f.step}, {"rank", f.rank}, {"detail", f.detail},
                        {"restart_from", f.restart_from}, {"detect_seconds", f.detect_seconds},
                        {"partial_seconds", f.partial_seconds}, {"restart_seconds", f.restart_seconds},
                        {"redo_seconds", f.redo_seconds}, {"redone_steps", f.redone_steps},
                        {"lost_seconds", f.lost_seconds()}});
    j["faults"] = faults;
    j["unfired_faults"] = run.unfired_faults;
  }
  j["restarts"] = run.restarts;
  j["retries"] = run.retries;
  j["retry_seconds"] = run.retry_seconds;
  if (run.checkpoints_written > 0)
    j["checkpoints"] = {{"written", run.checkpoints_written}, {"bytes", run.checkpoint_bytes},
                        {"seconds", run.checkpoint_seconds}};
  if (!run.rank_compute_seconds.empty()) j["rank_compute_seconds"] = run.rank_compute_seconds;
  if (!trace_out.empty()) j["trace"] = trace_out;
  return j;
}

namespace {
// Faults, retries, restarts, checkpoints and the slowest rank, as lines.
void print_faults(const exec::cpu::RunResult& r) {
  for (const auto& f : r.faults) {
    std::string cost;
    if (f.restart_from >= 0)
      cost = fmt::format("; {}restarted from {} in {:.3f} s, {} step{} redone ({:.3f} s): {:.2f} s lost",
                         f.rank >= 0 ? fmt::format("detected after {:.2f} s, ", f.detect_seconds) : std::string(),
                         f.restart_from == 0 ? std::string("the start")
                                             : fmt::format("the checkpoint after step {}", f.restart_from - 1),
                         f.restart_seconds, f.redone_steps, f.redone_steps == 1 ? "" : "s", f.redo_seconds,
                         f.lost_seconds());
    fmt::print("fault at step {}{}: {}: {}{}\n", f.step, f.rank >= 0 ? fmt::format(", rank {}", f.rank) : "", f.kind,
               f.detail, cost);
  }
  for (const auto& u : r.unfired_faults) fmt::print("WARNING: injected fault {} never fired\n", u);
  if (r.restarts > 0 || r.retries > 0)
    fmt::print("recovery: {} restart{}, {} retried transfer{} ({:.3f} s waiting)\n", r.restarts,
               r.restarts == 1 ? "" : "s", r.retries, r.retries == 1 ? "" : "s", r.retry_seconds);
  if (r.checkpoints_written > 0)
    fmt::print("checkpoints: {} written, {:.1f} KiB, {:.3f} s in all\n", r.checkpoints_written,
               static_cast<double>(r.checkpoint_bytes) / 1024.0, r.checkpoint_seconds);
  const auto& busy = r.rank_compute_seconds;
  if (busy.size() > 1) {
    std::vector<double> sorted = busy;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    const auto slowest = std::max_element(busy.begin(), busy.end()) - busy.begin();
    const double ratio = median > 0 ? busy[static_cast<std::size_t>(slowest)] / median : 0;
    if (ratio >= 2)
      fmt::print("straggler: rank {} computed {:.2f} s, {:.1f}x the median rank's {:.2f} s\n", slowest,
                 busy[static_cast<std::size_t>(slowest)], ratio, median);
  }
}
}  // namespace

void add_reference_errors(nlohmann::json& report, const exec::cpu::RunResult& run,
                          const exec::cpu::RunResult& ref, bool skip_missing) {
  double loss_err = 0;
  for (std::size_t i = 0; i < ref.loss_per_step.size(); ++i)
    loss_err = std::max(loss_err, std::abs(run.loss_per_step[i] - ref.loss_per_step[i]) /
                                      std::abs(ref.loss_per_step[i]));
  report["reference"] = {{"max_rel_loss_error", loss_err},
                         {"max_rel_weight_error", max_rel(run.weights, ref.weights, skip_missing)},
                         {"max_rel_grad_error", max_rel(run.grads, ref.grads, skip_missing)}};
}

void print_run_report(const nlohmann::json& j, const exec::cpu::RunResult& r, double weights_l2,
                      double iteration_seconds, int ms_digits, const std::string& reference_label,
                      const std::string& trace_out) {
  for (std::size_t i = 0; i < r.loss_per_step.size(); ++i) {
    const bool skipped = i < r.loss_scale.size() && r.loss_scale[i].skipped;
    if (!(i < 5 || i + 5 >= r.loss_per_step.size() || i % 50 == 0 || skipped)) continue;
    std::string scale;
    if (i < r.loss_scale.size()) {
      scale = "  loss scale " + exec::scales_text(r.loss_scale[i].scales);
      std::string slices;
      for (std::size_t k = 0; k < r.loss_scale[i].overflow.size(); ++k)
        if (r.loss_scale[i].overflow[k]) slices += fmt::format("{}{}", slices.empty() ? "" : ",", k);
      if (skipped) scale += fmt::format("  SKIPPED: overflow in slice {}", slices);
    }
    fmt::print("  step {:>4}  loss {:.6f}  {:.{}f} ms{}\n", r.first_step + static_cast<int>(i), r.loss_per_step[i],
               r.iteration_seconds[i] * 1e3, ms_digits, scale);
  }
  if (!r.earlier_loss_per_step.empty())
    fmt::print("(resumed at step {}: steps {}-{} ran before, final loss then {:.6f})\n", r.first_step,
               r.first_step - static_cast<int>(r.earlier_loss_per_step.size()), r.first_step - 1,
               r.earlier_loss_per_step.back());
  print_faults(r);
  if (!r.loss_scale.empty())
    fmt::print("fp16 loss scaling per slice: {} of {} steps skipped, scales now {}\n",
               j["skipped_steps"].get<int>(), r.loss_scale.size(), exec::scales_text(r.state.loss_scale.scales));
  fmt::print("final loss {:.6f}, weights L2 {:.9g}, iteration time {:.3f} ms (median after step 0)\n",
             j["final_loss"].get<double>(), weights_l2, iteration_seconds * 1e3);
  if (j.contains("reference"))
    fmt::print("vs {}: loss {:.2e}, weights {:.2e}, grads {:.2e} (max relative)\n", reference_label,
               j["reference"]["max_rel_loss_error"].get<double>(),
               j["reference"]["max_rel_weight_error"].get<double>(),
               j["reference"]["max_rel_grad_error"].get<double>());
  if (j.contains("dp_wire_bytes") && j["data"].get<int>() > 1) {
    // Bytes between replicas per step; with 1-bit Adam, the warm-up's beside the compressed steps'.
    const auto wire = j["dp_wire_bytes"].get<std::vector<std::int64_t>>();
    const int warmup = j.value("onebit_warmup_steps", 0), first = j.value("first_step", 0);
    std::vector<double> adam, packed;
    for (std::size_t i = 0; i < wire.size(); ++i)  // by the training step, not the run's
      (warmup > 0 && first + static_cast<int>(i) >= warmup ? packed : adam).push_back(static_cast<double>(wire[i]));
    auto mean = [](const std::vector<double>& v) {
      double s = 0;
      for (double x : v) s += x;
      return v.empty() ? 0.0 : s / static_cast<double>(v.size());
    };
    if (warmup == 0)
      fmt::print("data-parallel wire: {:.0f} bytes per step\n", mean(adam));
    else if (adam.empty())
      fmt::print("1-bit Adam, past its {}-step warm-up: {:.0f} bytes per step on the data-parallel wire\n", warmup,
                 mean(packed));
    else if (packed.empty())
      fmt::print("1-bit Adam: every step was warm-up (Adam; compression from step {}): {:.0f} bytes per step on the "
                 "data-parallel wire\n", warmup, mean(adam));
    else
      fmt::print("1-bit Adam: steps 0-{} Adam ({:.0f} bytes per step on the data-parallel wire, mean), then "
                 "compressed ({:.0f} bytes per step{})\n",
                 warmup - 1, mean(adam), mean(packed),
                 mean(packed) <= 0 ? std::string() : fmt::format(", 1/{:.1f}", mean(adam) / mean(packed)));
  }
  if (j.contains("param_state_peak_bytes")) {
    // Weights and Adam state on each rank's device at most (what parameter offload moves).
    const auto peak = j["param_state_peak_bytes"].get<std::vector<std::int64_t>>();
    std::string ranks;
    for (std::size_t r = 0; r < peak.size(); ++r) ranks += fmt::format("{}{:.1f}", r ? " " : "", peak[r] / 1024.0);
    fmt::print("weights + Adam state on the device, peak per rank (KiB, param_offload: {}): {}\n",
               j.value("param_offload", std::string("none")), ranks);
  }
  if (!trace_out.empty()) fmt::print("measured trace (last step): {}\n", trace_out);
}

std::vector<double> parse_rank_speed(const std::string& text, int ranks) {
  std::vector<double> out(static_cast<std::size_t>(ranks), 1.0);
  if (text.empty()) return out;
  std::set<int> seen;
  for (const std::string& item : ir::split_commas(text)) {
    const std::size_t colon = item.find(':');
    int rank = -1;
    double speed = 0;
    std::size_t used_r = 0, used_s = 0;
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      rank = std::stoi(item.substr(0, colon), &used_r);
      speed = std::stod(item.substr(colon + 1), &used_s);
    } catch (const std::exception&) {
      used_r = used_s = 0;
    }
    if (colon == std::string::npos || used_r != colon || used_s != item.size() - colon - 1 || used_s == 0)
      throw Error(fmt::format("--rank-speed {}: '{}' is not RANK:SPEED (e.g. 1:0.5)", text, item));
    if (rank < 0 || rank >= ranks)
      throw Error(fmt::format("--rank-speed {}: rank {} is not one of the plan's {} pipeline ranks", text, rank, ranks));
    if (!(speed >= 0.01 && speed <= 1))
      throw Error(fmt::format("--rank-speed {}: speed {} of rank {}; expected 0.01 ≤ speed ≤ 1", text, speed, rank));
    if (seen.count(rank)) throw Error(fmt::format("--rank-speed {}: rank {} is given twice", text, rank));
    seen.insert(rank);
    out[static_cast<std::size_t>(rank)] = speed;
  }
  return out;
}

}  // namespace tdpipe::apps

#endif  // TDPIPE_HAVE_EXEC
