// gpu_test_util.hpp — inputs of the GPU tests: the tiny scenario from its JSON copy
// (the GPU machine has no yaml-cpp) and the tolerance arithmetic.
#pragma once

#include <cmath>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tdpipe/exec/cpu/run.hpp"
#include "tdpipe/ir/scenario_io.hpp"

namespace tdpipe::exec::cuda::test {

inline std::string source_path(const std::string& rel) { return std::string(TDPIPE_SOURCE_DIR) + "/" + rel; }

/// tiny-gpt-cpu (4 layers, hidden 64, 4 heads, seq 64, vocab 96, b = 2) on p
/// stages and d replicas with m micro-batches.
inline ir::Scenario tiny_scenario(int p, int d, int m) {
  std::ifstream in(source_path("tests/exec_cuda/data/tiny-gpt-cpu.json"));
  REQUIRE(in.good());
  ir::Scenario sc = ir::scenario_from_json(nlohmann::json::parse(in));
  sc.parallel.pipeline = p;
  sc.parallel.data = d;
  sc.parallel.global_batch = m * sc.parallel.micro_batch * d;
  sc.cluster.gpus_per_node = p * d;
  return sc;
}

inline cpu::TrainOptions train_options(int steps) {
  cpu::TrainOptions t;
  t.steps = steps;
  t.adam.lr = 1e-3;
  t.corpus_path = source_path("data/tiny_corpus.txt");
  return t;
}

/// ‖a − b‖ / max(‖b‖, floor): relative L2 error of one tensor; `floor` keeps tensors
/// whose gradient is almost zero (a bias late in training) from dominating.
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b, double floor) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

inline double norm(const cpu::ParamMap& m) {
  double s = 0;
  for (const auto& [n, v] : m)
    for (double x : v) s += x * x;
  return std::sqrt(s);
}

/// Largest per-tensor error over the map (floor: 1e-3 of the whole map's norm).
inline double max_rel_error(const cpu::ParamMap& got, const cpu::ParamMap& want, std::string* worst) {
  REQUIRE(got.size() == want.size());
  const double floor = 1e-3 * norm(want);
  double e = 0;
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    REQUIRE(it != got.end());
    REQUIRE(it->second.size() == w.size());
    const double r = rel_error(it->second, w, floor);
    if (r > e) {
      e = r;
      *worst = name;
    }
  }
  return e;
}

}  // namespace tdpipe::exec::cuda::test
