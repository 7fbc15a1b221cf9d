// test_bad_input.cpp — regressions for what a reliability pass over the readers and
// writers found (issue 17 §2): JSON scenarios checked like YAML ones, bounded nesting
// and error quotes, duplicate keys, atomic writes that never leave half a file.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tdpipe/ir/atomic_file.hpp"
#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/json_read.hpp"
#include "tdpipe/ir/scenario_check.hpp"
#include "tdpipe/ir/scenario_io.hpp"

using namespace tdpipe::ir;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;
using nlohmann::json;

namespace {

const std::filesystem::path kScenarioDir = std::filesystem::path(TDPIPE_SOURCE_DIR) / "scenarios";

json gpt3_json() { return to_json(load_scenario((kScenarioDir / "gpt3-175b-a100-8x8.yaml").string())); }

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// A fresh folder under the temp dir, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "tdpipe-test-XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

}  // namespace

TEST_CASE("JSON scenarios get the rules YAML scenarios get", "[scenario][bad-input]") {
  const json good = gpt3_json();
  REQUIRE_NOTHROW(scenario_from_json(good));
  struct Case {
    std::vector<std::string> path;
    json value;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"parallel", "tensor"}, 3, "scenario.parallel: tensor*pipeline*data = 3*8*1 = 24 GPUs, but the cluster has 64"},
      {{"parallel", "pipeline"}, 0, "scenario.parallel.pipeline: expected a positive integer (pipeline stages), got 0"},
      {{"parallel", "micro_batch"}, 0, "scenario.parallel.micro_batch: expected a positive integer"},
      {{"parallel", "micro_batch"}, -2, "scenario.parallel.micro_batch: expected a positive integer"},
      {{"parallel", "global_batch"}, -64, "scenario.parallel.global_batch: expected a positive integer"},
      {{"parallel", "slices"}, 0, "scenario.parallel.slices: expected a positive integer"},
      {{"parallel", "data"}, 0, "scenario.parallel.data: expected a positive integer"},
      {{"cluster", "gpus_per_node"}, 0, "scenario.cluster.gpus_per_node: expected a positive integer"},
      {{"cluster", "ib_bytes_per_second_per_nic"}, -1.0, "scenario.cluster.ib_bytes_per_second_per_nic: expected a positive finite number"},
      {{"cluster", "nvlink_latency_seconds"}, -1e-6, "scenario.cluster.nvlink_latency_seconds: expected a finite number ≥ 0"},
      {{"cluster", "ib_latency_seconds"}, -1.0, "scenario.cluster.ib_latency_seconds: expected a finite number ≥ 0"},
      {{"cluster", "topology"}, "torus", "scenario.cluster.topology: expected one of fat-tree, rail-optimized, got \"torus\""},
      {{"model", "heads"}, 0, "scenario.model.heads: expected a positive integer"},
      {{"model", "layers"}, 95, "scenario.model.layers: 95 layers do not split evenly over pipeline*chunks"},
      {{"model", "dtype"}, "int4", "scenario.model.dtype: expected one of bf16, fp16, fp32"},
      {{"schedule"}, "fastest", "scenario.schedule: expected one of gpipe, 1f1b"},
      {{"parallel", "bucket_mb"}, 0.0, "scenario.parallel.bucket_mb: expected a positive finite number"},
      {{"parallel", "bucket_mb"}, 1e-9, "scenario.parallel.bucket_mb: expected 0.001 to 1048576 MiB"},
      {{"parallel", "bucket_mb"}, 1e12, "scenario.parallel.bucket_mb: expected 0.001 to 1048576 MiB"},
      {{"parallel", "distributed_optimizer"}, "yes", "scenario.parallel.distributed_optimizer: expected"},
      {{"parallel", "overlap_grad_reduce"}, 1, "scenario.parallel.overlap_grad_reduce: expected"},
      {{"parallel", "optimizer"}, "lamb", "scenario.parallel.optimizer: expected one of adam, onebit-adam"},
      {{"parallel", "onebit_warmup_steps"}, 0, "scenario.parallel.onebit_warmup_steps: expected a positive integer"},
      {{"parallel", "param_offload"}, "all", "scenario.parallel.param_offload: expected one of none, layers"},
      {{"parallel", "loss_scale"}, -2.0, "scenario.parallel.loss_scale: expected a finite number ≥ 0"},
      {{"parallel", "initial_loss_scale"}, 0.0, "scenario.parallel.initial_loss_scale: expected a positive"},
      {{"parallel", "initial_loss_scale"}, 1e30, "scenario.parallel.initial_loss_scale: expected a loss scale ≤ 2^64"},
      {{"parallel", "loss_scale_window"}, 0, "scenario.parallel.loss_scale_window: expected a positive integer"},
      {{"parallel", "min_loss_scale"}, 1e6, "scenario.parallel.min_loss_scale: expected ≤ initial_loss_scale"},
      {{"cluster", "host_bytes_per_second"}, -1.0, "scenario.cluster.host_bytes_per_second: expected a finite number ≥ 0"},
  };
  for (const auto& c : cases) {
    json j = good;
    json* at = &j;
    for (const auto& k : c.path) at = &(*at)[k];
    *at = c.value;
    INFO(c.message);
    REQUIRE_THROWS_WITH(scenario_from_json(j), StartsWith(c.message));
  }
  json j = good;
  j["cluster"]["groups"][0]["nodes"] = -1;
  REQUIRE_THROWS_WITH(scenario_from_json(j), StartsWith("scenario.cluster.groups[0].nodes: expected a positive integer"));
  j = good;
  j["cluster"]["groups"][0]["gpu"]["peak_flops"] = 0.0;
  REQUIRE_THROWS_WITH(scenario_from_json(j), StartsWith("scenario.cluster.groups[0].gpu.peak_flops: expected a positive"));

  // Through a file, the message starts with the file's name.
  TempDir dir;
  j = good;
  j["parallel"]["pipeline"] = 0;
  const auto file = dir.path / "zero.json";
  std::ofstream(file) << j.dump();
  REQUIRE_THROWS_WITH(load_scenario(file.string()),
                      StartsWith(file.string() + ": scenario.parallel.pipeline: expected a positive integer"));
}

TEST_CASE("a synthetic JSON scenario must agree with its parallel mirror", "[scenario][bad-input]") {
  json j = to_json(load_scenario((kScenarioDir / "synthetic-uniform-p4-m8.yaml").string()));
  REQUIRE_NOTHROW(scenario_from_json(j));
  j["synthetic"]["stages"] = 0;
  REQUIRE_THROWS_WITH(scenario_from_json(j), StartsWith("scenario.synthetic.stages: expected a positive integer"));
  j["synthetic"]["stages"] = 8;
  REQUIRE_THROWS_WITH(scenario_from_json(j), StartsWith("scenario.parallel.pipeline: a synthetic scenario's"));
  j["synthetic"]["stages"] = 4;
  j["synthetic"]["f_seconds"] = -1.0;
  REQUIRE_THROWS_WITH(scenario_from_json(j), StartsWith("scenario.synthetic.f_seconds: expected a positive"));
}

TEST_CASE("YAML rules checked after reading still point at their line", "[scenario][bad-input]") {
  // The cross-field rules now live in find_problem; the YAML reader maps the field back.
  const std::string yaml =
      "model: {layers: 6, hidden: 64, heads: 4, seq: 32, vocab: 64}\n"
      "cluster: {gpu: cpu, nodes: 1, gpus_per_node: 4}\n"
      "parallel:\n"
      "  pipeline: 4\n"
      "  global_batch: 8\n";
  REQUIRE_THROWS_WITH(parse_scenario(yaml, "s.yaml"),
                      StartsWith("s.yaml:1: model.layers: 6 layers do not split evenly over pipeline*chunks"));
  const std::string bucket =
      "model: {layers: 8, hidden: 64, heads: 4, seq: 32, vocab: 64}\n"
      "cluster: {gpu: cpu, nodes: 1, gpus_per_node: 4}\n"
      "parallel:\n"
      "  pipeline: 2\n"
      "  data: 2\n"
      "  global_batch: 8\n"
      "  bucket_mb: 2000000\n";
  REQUIRE_THROWS_WITH(parse_scenario(bucket, "s.yaml"),
                      StartsWith("s.yaml:7: parallel.bucket_mb: expected 0.001 to 1048576 MiB (1 KiB to 1 TiB)"));
  const std::string onebit_zero =
      "model: {layers: 8, hidden: 64, heads: 4, seq: 32, vocab: 64}\n"
      "cluster: {gpu: cpu, nodes: 1, gpus_per_node: 4}\n"
      "parallel:\n"
      "  pipeline: 2\n"
      "  data: 2\n"
      "  global_batch: 8\n"
      "  distributed_optimizer: true\n"
      "  optimizer: onebit-adam\n";
  REQUIRE_THROWS_WITH(parse_scenario(onebit_zero, "s.yaml"),
                      StartsWith("s.yaml:8: parallel.optimizer: onebit-adam all-reduces a compressed momentum"));
  REQUIRE_THROWS_WITH(parse_scenario(onebit_zero.substr(0, onebit_zero.find("  distributed")) +
                                         "  optimizer: sgd\n",
                                     "s.yaml"),
                      StartsWith("s.yaml:7: parallel.optimizer: unknown optimizer 'sgd'"));
  const std::string offload =
      "model: {layers: 8, hidden: 64, heads: 4, seq: 32, vocab: 64}\n"
      "cluster: {gpu: cpu, nodes: 1, gpus_per_node: 4, host_gbps: -3}\n"
      "parallel:\n"
      "  pipeline: 2\n"
      "  data: 2\n"
      "  global_batch: 8\n"
      "  distributed_optimizer: true\n"
      "  param_offload: layers\n";
  REQUIRE_THROWS_WITH(parse_scenario(offload, "s.yaml"), StartsWith("s.yaml:2: cluster.host_gbps: expected a positive"));
  const std::string zero1 = offload.substr(0, offload.find(", host_gbps")) + "}" +
                            offload.substr(offload.find("}\n", offload.find("host_gbps")) + 1);
  REQUIRE_THROWS_WITH(parse_scenario(zero1, "s.yaml"),
                      StartsWith("s.yaml:8: parallel.param_offload: param_offload: layers streams each layer's whole "
                                 "Adam state through OPT; it is not built for distributed_optimizer: true (ZeRO-1)"));
  REQUIRE_THROWS_WITH(parse_scenario(zero1.substr(0, zero1.find("  distributed")) + "  param_offload: weights\n", "s.yaml"),
                      StartsWith("s.yaml:7: parallel.param_offload: unknown param_offload 'weights'"));
  // A software stack's compute efficiency (calibrate --from-run): positive, and 0.01 to 100.
  const std::string efficiency =
      "model: {layers: 8, hidden: 64, heads: 4, seq: 32, vocab: 64}\n"
      "cluster: {gpu: cpu, nodes: 1, gpus_per_node: 2,\n"
      "          compute_efficiency: EFF}\n"
      "parallel: {pipeline: 2, global_batch: 4}\n";
  auto with_efficiency = [&](const std::string& v) {
    return efficiency.substr(0, efficiency.find("EFF")) + v + efficiency.substr(efficiency.find("EFF") + 3);
  };
  REQUIRE_THROWS_WITH(parse_scenario(with_efficiency("0"), "s.yaml"),
                      StartsWith("s.yaml:3: cluster.compute_efficiency: expected a positive"));
  REQUIRE_THROWS_WITH(parse_scenario(with_efficiency("1000"), "s.yaml"),
                      StartsWith("s.yaml:3: cluster.compute_efficiency: expected 0.01 to 100"));
  CHECK(parse_scenario(with_efficiency("0.85"), "s.yaml").cluster.compute_efficiency == 0.85);
  // Megatron's --tp-comm-overlap overlaps the sequence-parallel collectives: it needs them.
  const std::string tp_overlap =
      "model: {layers: 8, hidden: 64, heads: 4, seq: 32, vocab: 64}\n"
      "cluster: {gpu: cpu, nodes: 1, gpus_per_node: 4}\n"
      "parallel:\n"
      "  tensor: 2\n"
      "  pipeline: 2\n"
      "  global_batch: 4\n"
      "  tp_comm_overlap: true\n";
  REQUIRE_THROWS_WITH(parse_scenario(tp_overlap, "s.yaml"),
                      StartsWith("s.yaml:7: parallel.tp_comm_overlap: overlapping the tensor-parallel collectives"));
  CHECK(parse_scenario(tp_overlap + "  sequence_parallel: true\n", "s.yaml").parallel.tp_comm_overlap);
  const std::string chunks =
      "model: {layers: 8, hidden: 64, heads: 4, seq: 32, vocab: 64}\n"
      "cluster: {gpu: cpu, nodes: 1, gpus_per_node: 2}\n"
      "parallel:\n"
      "  pipeline: 2\n"
      "  chunks: 2\n"
      "  global_batch: 3\n";
  REQUIRE_THROWS_WITH(parse_scenario(chunks, "s.yaml"),
                      StartsWith("s.yaml:5: parallel.chunks: interleaving 2 chunks needs"));
}

TEST_CASE("deep nesting is refused at parse time with a short message", "[json][bad-input]") {
  for (int depth : {65, 1000, 100000}) {
    INFO(depth);
    const std::string deep = std::string(depth, '[') + std::string(depth, ']');
    try {
      parse_json(deep, "deep.json");
      FAIL("accepted");
    } catch (const tdpipe::Error& e) {
      const std::string what = e.what();
      CHECK_THAT(what, StartsWith("deep.json: nested deeper than 64 levels"));
      CHECK(what.size() < 2000);
    }
  }
  REQUIRE_NOTHROW(parse_json(std::string(64, '[') + std::string(64, ']'), "ok.json"));
  // The same depth inside a scenario value: refused before any message quotes it.
  std::string text = gpt3_json().dump();
  const std::string key = "\"name\":\"gpt3-175b\"";
  const auto at = text.find(key);
  REQUIRE(at != std::string::npos);
  text.replace(at, key.size(), "\"name\":" + std::string(50000, '[') + "1" + std::string(50000, ']'));
  CHECK_THROWS_WITH(parse_json(text, "s.json"), StartsWith("s.json: nested deeper than 64 levels (at model.name"));
}

TEST_CASE("a JSON number past double's range is refused with the file's name (fuzz finding)", "[json][bad-input]") {
  // bench/fuzz.sh's profile target: nlohmann throws out_of_range.406 for it, which every
  // reader let through as an internal error.
  CHECK_THROWS_WITH(parse_json("{\"seconds\": 738356643.280E345}", "p.json"),
                    StartsWith("p.json: not valid JSON for tdpipe:") && Contains("number overflow"));
  CHECK_THROWS_AS(parse_json("[-1e400]", "p.json"), tdpipe::Error);
}

TEST_CASE("error messages quote at most a short excerpt of a value", "[json][bad-input]") {
  CHECK(quote_json(json(3)) == "3");
  CHECK(quote_json(json("abc")) == "\"abc\"");
  CHECK(quote_json(json::array({0})) == "[0]");
  CHECK(quote_json(json(std::string(1000, 'x'))) == "\"" + std::string(60, 'x') + "\"…");
  json big = json::array();
  for (int i = 0; i < 1000; ++i) big.push_back(json::array({i}));
  CHECK(quote_json(big) == "an array of 1000 values");
  json j = gpt3_json();
  j["parallel"]["tensor"] = big;
  try {
    scenario_from_json(j);
    FAIL("accepted");
  } catch (const tdpipe::Error& e) {
    CHECK(std::string(e.what()) == "scenario.parallel.tensor: expected an integer, got an array of 1000 values");
  }
}

TEST_CASE("duplicate JSON keys are refused, naming the key and where", "[json][bad-input]") {
  CHECK_THROWS_WITH(parse_json(R"({"a": 1, "a": 2})", "d.json"),
                    "d.json: top level: key \"a\" given twice; expected each key once");
  CHECK_THROWS_WITH(parse_json(R"({"m": {"x": [ {"k": 1, "k": 1} ]}})", "d.json"),
                    "d.json: m.x[0]: key \"k\" given twice; expected each key once");
  // In an array, the element: a 400k-event trace's duplicate is found by its index.
  CHECK_THROWS_WITH(parse_json(R"({"traceEvents": [{"a": 1}, {"a": 2}, {"ts": 1, "ts": 2}]})", "t.json"),
                    "t.json: traceEvents[2]: key \"ts\" given twice; expected each key once");
  // The same key in sibling objects is fine, and so are keys reused at other depths.
  CHECK_NOTHROW(parse_json(R"({"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]})", "ok.json"));

  TempDir dir;
  std::string text = gpt3_json().dump();
  text.insert(text.find("\"layers\""), "\"layers\":95,");
  const auto file = dir.path / "dup.json";
  std::ofstream(file) << text;
  CHECK_THROWS_WITH(load_scenario(file.string()),
                    file.string() + ": model: key \"layers\" given twice; expected each key once");
}

TEST_CASE("write_file_atomic: all or nothing, errors say why", "[io][bad-input]") {
  TempDir dir;
  const auto file = dir.path / "out.txt";
  write_file_atomic(file.string(), "first\n", "plan");
  CHECK(slurp(file) == "first\n");
  write_file_atomic(file.string(), "second\n", "plan");
  CHECK(slurp(file) == "second\n");
  CHECK(dir.entries() == std::vector<std::string>{"out.txt"});  // no temporary left behind
  // The mode a plain open would give (0666 less the umask), not mkstemp's 0600.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  CHECK((std::filesystem::status(file).permissions() & std::filesystem::perms::all) ==
        static_cast<std::filesystem::perms>(0666 & ~mask));

  CHECK_THROWS_WITH(write_file_atomic("/dev/full", "x", "plan"),
                    "cannot write plan '/dev/full': write: No space left on device");
  CHECK_THROWS_WITH(write_file_atomic((dir.path / "no" / "such" / "x").string(), "x", "trace"),
                    StartsWith("cannot write trace '" + (dir.path / "no/such/x").string() +
                               "': cannot create a temporary file in"));
  CHECK_THROWS_WITH(write_file_atomic(dir.path.string(), "x", "trace"), Contains("it is a directory"));

  // A write that fails half-way (here: the file size limit, as a full disk would) leaves
  // the old file whole and no temporary behind.
  const std::string big(1 << 20, 'y');
  struct rlimit old {};
  ::getrlimit(RLIMIT_FSIZE, &old);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string error;
  try {
    write_file_atomic(file.string(), big, "profile");
  } catch (const tdpipe::Error& e) {
    error = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  CHECK_THAT(error, StartsWith("cannot write profile '" + file.string() + "': write: File too large"));
  CHECK(slurp(file) == "second\n");
  CHECK(dir.entries() == std::vector<std::string>{"out.txt"});
}

TEST_CASE("fp16 loss-scaling keys: defaults, dynamic or static, and errors at their line", "[scenario][bad-input]") {
  const std::string base =
      "model: {layers: 8, hidden: 64, heads: 4, seq: 32, vocab: 64, dtype: fp16}\n"
      "cluster: {gpu: cpu, nodes: 1, gpus_per_node: 2}\n"
      "parallel:\n"
      "  pipeline: 2\n"
      "  global_batch: 8\n";
  const Scenario d = parse_scenario(base, "s.yaml");
  CHECK(d.parallel.loss_scale == 0);  // dynamic
  CHECK(d.parallel.initial_loss_scale == 65536);
  CHECK(d.parallel.loss_scale_window == 1000);
  CHECK(d.parallel.min_loss_scale == 1);
  const Scenario g = parse_scenario(base + "  loss_scale: dynamic\n  initial_loss_scale: 4096\n"
                                           "  loss_scale_window: 50\n  min_loss_scale: 0.5\n", "s.yaml");
  CHECK(g.parallel.loss_scale == 0);
  CHECK(g.parallel.initial_loss_scale == 4096);
  CHECK(g.parallel.loss_scale_window == 50);
  CHECK(g.parallel.min_loss_scale == 0.5);
  CHECK(scenario_from_json(to_json(g)) == g);
  CHECK(parse_scenario(base + "  loss_scale: 128\n", "s.yaml").parallel.loss_scale == 128);
  REQUIRE_THROWS_WITH(parse_scenario(base + "  loss_scale: automatic\n", "s.yaml"),
                      "s.yaml:6: parallel.loss_scale: expected a non-negative number ('dynamic', or a static fp16 "
                      "loss scale > 0), got 'automatic'");
  REQUIRE_THROWS_WITH(parse_scenario(base + "  loss_scale: -4\n", "s.yaml"),
                      EndsWith("s.yaml:6: parallel.loss_scale: expected a non-negative number ('dynamic', or a "
                               "static fp16 loss scale > 0), got -4"));
  REQUIRE_THROWS_WITH(parse_scenario(base + "  loss_scale_window: 0\n", "s.yaml"),
                      "s.yaml:6: parallel.loss_scale_window: expected a positive integer (steps without overflow before a "
                      "loss scale doubles), got 0");
  REQUIRE_THROWS_WITH(parse_scenario(base + "  initial_loss_scale: 8\n  min_loss_scale: 16\n", "s.yaml"),
                      StartsWith("s.yaml:7: parallel.min_loss_scale: expected ≤ initial_loss_scale (8), got 16"));
}
