// exec_test_util.hpp — shared helpers of the executor tests: a small scenario,
// plans through the planner, and relative comparison of parameter maps.
#pragma once

#include <cmath>
#include <string>

#include <catch2/catch.hpp>

#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/ir/scenario.hpp"
#include "tdpipe/ir/scenario_io.hpp"
#include "tdpipe/planner/build_plan.hpp"

namespace tdpipe::exec::test {

inline std::string source_path(const std::string& rel) {
  return std::string(TDPIPE_SOURCE_DIR) + "/" + rel;
}

/// A GPT small enough to run 24 layouts × 3 steps in seconds: 8 layers (p · v = 8
/// stages at most), hidden 16, 2 heads, 16 tokens.
inline ir::Scenario small_scenario(int p, int d, int m, int b) {
  ir::Scenario sc = ir::load_scenario(source_path("scenarios/tiny-gpt-cpu.yaml"));
  sc.model.layers = 8;
  sc.model.hidden = 16;
  sc.model.heads = 2;
  sc.model.ffn = 32;
  sc.model.seq = 16;
  sc.model.vocab = 32;
  sc.parallel.pipeline = p;
  sc.parallel.data = d;
  sc.parallel.micro_batch = b;
  sc.parallel.global_batch = m * b * d;
  sc.cluster.gpus_per_node = p * d;
  return sc;
}

inline cpu::TrainOptions train_options(int steps) {
  cpu::TrainOptions t;
  t.steps = steps;
  t.adam.lr = 1e-2;
  t.corpus_path = source_path("data/tiny_corpus.txt");
  return t;
}

/// ‖a − b‖ / ‖b‖ over one tensor (absolute when b is zero).
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// Largest per-tensor relative error; both maps must hold the same tensors.
inline double max_rel_error(const cpu::ParamMap& got, const cpu::ParamMap& want, std::string* worst) {
  REQUIRE(got.size() == want.size());
  double e = 0;
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    REQUIRE(it != got.end());
    REQUIRE(it->second.size() == w.size());
    const double r = rel_error(it->second, w);
    if (r > e) {
      e = r;
      if (worst) *worst = name;
    }
  }
  return e;
}

}  // namespace tdpipe::exec::test
