// test_scenario.cpp — scenario files: shipped scenarios, presets, overrides, units,
// every kind of bad scenario with its exact "file:line: field:" message, JSON round trip.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tdpipe/ir/error.hpp"
#include "tdpipe/ir/scenario_io.hpp"

using namespace tdpipe::ir;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

const std::filesystem::path kScenarioDir = std::filesystem::path(TDPIPE_SOURCE_DIR) / "scenarios";

std::vector<std::filesystem::path> shipped_scenarios() {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(kScenarioDir))
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A valid scenario in block style, one key per line, so each error's line is known.
const std::vector<std::string> kBase = {
    "model:",              // 1
    "  name: tiny",        // 2
    "  layers: 8",         // 3
    "  hidden: 64",        // 4
    "  ffn: 256",          // 5
    "  heads: 4",          // 6
    "  seq: 128",          // 7
    "  vocab: 100",        // 8
    "  dtype: bf16",       // 9
    "cluster:",            // 10
    "  gpu: a100-80g",     // 11
    "  nodes: 1",          // 12
    "  gpus_per_node: 8",  // 13
    "parallel:",           // 14
    "  tensor: 2",         // 15
    "  pipeline: 4",       // 16
    "  data: 1",           // 17
    "  chunks: 1",         // 18
    "  micro_batch: 1",    // 19
    "  global_batch: 8",   // 20
    "  recompute: none",   // 21
    "  slices: 1",         // 22
    "schedule: 1f1b",      // 23
};

std::string text_of(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

/// kBase with 1-based line `n` replaced ("" keeps the line count but empties it).
std::string base_with(std::map<int, std::string> changes) {
  auto lines = kBase;
  for (const auto& [n, text] : changes) lines.at(n - 1) = text;
  return text_of(lines);
}

Scenario parse(const std::string& text) { return parse_scenario(text, "bad.yaml"); }

}  // namespace

TEST_CASE("every shipped scenario loads and is what its name says", "[scenario]") {
  const auto files = shipped_scenarios();
  REQUIRE(files.size() >= 12);
  for (const auto& f : files) {
    INFO(f.string());
    Scenario s;
    REQUIRE_NOTHROW(s = load_scenario(f.string()));
    CHECK(s.name == f.stem().string());
    CHECK(s.source_file == f.string());
    CHECK(s.stages() >= 1);
    CHECK(s.microbatches() >= 1);
    if (!s.synthetic) {
      CHECK(s.parallel.tensor * s.parallel.pipeline * s.parallel.data == s.cluster.gpus());
      CHECK(s.model.layers % (s.parallel.pipeline * s.parallel.chunks) == 0);
    }
  }
}

TEST_CASE("the default GPT-3 scenario has the issue's layout in SI units", "[scenario]") {
  const Scenario s = load_scenario((kScenarioDir / "gpt3-175b-a100-8x8.yaml").string());
  // Megatron's published run: multi-head attention, GeLU, no flash attention.
  CHECK(s.model == ModelConfig{"gpt3-175b", 96, 12288, 49152, 96, 2048, 51200, "bf16", 0, "gelu", "standard"});
  REQUIRE(s.cluster.groups.size() == 1);
  CHECK(s.cluster.groups[0].gpu == gpu_preset("a100-80g"));
  CHECK(s.cluster.groups[0].nodes == 8);
  CHECK(s.cluster.gpus() == 64);
  CHECK(s.cluster.nvlink_bytes_per_second == 300e9);        // 2400 Gb/s
  CHECK(s.cluster.ib_bytes_per_second_per_nic == 25e9);     // 200 Gb/s
  CHECK(s.cluster.topology == "fat-tree");
  CHECK(s.parallel.tensor == 8);
  CHECK(s.parallel.pipeline == 8);
  CHECK(s.parallel.microbatches() == 64);
  CHECK(s.parallel.recompute == Recompute::Selective);
  CHECK(s.parallel.sequence_parallel);
  CHECK(s.schedule == "1f1b");
  CHECK_FALSE(s.synthetic);
}

TEST_CASE("other shipped scenarios: 530B interleaved, mixed groups, tiny CPU", "[scenario]") {
  const Scenario t = load_scenario((kScenarioDir / "turing-530b-a100-35x8.yaml").string());
  CHECK(t.cluster.gpus() == 280);
  CHECK(t.chunks() == 3);
  CHECK(t.microbatches() == 280);
  CHECK(t.model.dtype == "fp16");
  CHECK(t.parallel.recompute == Recompute::Full);

  const Scenario m = load_scenario((kScenarioDir / "mixed-a100-h100.yaml").string());
  REQUIRE(m.cluster.groups.size() == 2);
  CHECK(m.cluster.groups[0].gpu.name == "a100-80g");
  CHECK(m.cluster.groups[1].gpu.name == "h100-80g");
  CHECK(m.cluster.groups[1].gpu.peak_flops == 989e12);
  CHECK(m.cluster.nodes() == 4);
  CHECK(m.cluster.gpus() == 32);

  const Scenario c = load_scenario((kScenarioDir / "tiny-gpt-cpu.yaml").string());
  CHECK(c.cluster.groups[0].gpu.name == "cpu");
  CHECK(c.cluster.gpus() == 2);
  CHECK(c.microbatches() == 4);
  CHECK(c.model.vocab == 96);
}

TEST_CASE("Llama-2 and long-context scenarios: GQA - SwiGLU - flash attention", "[scenario]") {
  const Scenario l = load_scenario((kScenarioDir / "llama2-70b-a100-4x8.yaml").string());
  CHECK(l.model == ModelConfig{"llama2-70b", 80, 8192, 28672, 64, 4096, 32000, "bf16", 8, "swiglu", "flash"});
  CHECK(l.model.kv_heads_or_heads() == 8);
  // Megatron's published runs keep the unfused attention they were measured with.
  for (const char* megatron : {"gpt3-175b-a100-8x8", "turing-530b-a100-35x8", "megatron-22b-a100-1x8"}) {
    INFO(megatron);
    CHECK(load_scenario((kScenarioDir / (std::string(megatron) + ".yaml")).string()).model.attention == "standard");
  }
  // Llama-2 7B at 32k, 64k and 128k tokens on 4–8 DGX A100 nodes, tensor 8 with SP.
  const std::pair<const char*, int> long_context[] = {
      {"llama7b-32k-a100-4x8", 32768}, {"llama7b-64k-a100-8x8", 65536}, {"llama7b-128k-a100-8x8", 131072}};
  for (auto [stem, seq] : long_context) {
    INFO(stem);
    const Scenario s = load_scenario((kScenarioDir / (std::string(stem) + ".yaml")).string());
    CHECK(s.model == ModelConfig{"llama2-7b", 32, 4096, 11008, 32, seq, 32000, "bf16", 32, "swiglu", "flash"});
    CHECK(s.cluster.groups[0].gpu.name == "a100-80g");
    CHECK(s.cluster.gpus() >= 32);
    CHECK(s.cluster.gpus() <= 64);
    CHECK(s.parallel.tensor == 8);
    CHECK(s.parallel.sequence_parallel);
    CHECK(s.microbatches() <= 16);
  }
}

TEST_CASE("model keys kv_heads - mlp - attention: defaults and what they accept", "[scenario]") {
  const Scenario d = parse(text_of(kBase));
  CHECK(d.model.kv_heads == 0);  // left out: as many as heads
  CHECK(d.model.kv_heads_or_heads() == 4);
  CHECK(d.model.mlp == "gelu");
  CHECK(d.model.attention == "flash");
  const Scenario g = parse(base_with({{9, "  dtype: bf16\n  kv_heads: 2\n  mlp: swiglu\n  attention: standard"}}));
  CHECK(g.model.kv_heads == 2);
  CHECK(g.model.kv_heads_or_heads() == 2);
  CHECK(g.model.mlp == "swiglu");
  CHECK(g.model.attention == "standard");
  CHECK(parse(base_with({{9, "  dtype: bf16\n  kv_heads: 4"}})).model.kv_heads == 4);  // = heads: MHA
  // Multi-query attention (one K/V head) without tensor parallelism.
  CHECK(parse(base_with({{9, "  dtype: bf16\n  kv_heads: 1"}, {15, "  tensor: 1"}, {16, "  pipeline: 8"}}))
            .model.kv_heads == 1);
}

TEST_CASE("bad kv_heads - mlp - attention are rejected with file:line: field:", "[scenario]") {
  // kBase: heads 4, tensor 2; the new key goes on line 10.
  REQUIRE_THROWS_WITH(parse(base_with({{9, "  dtype: bf16\n  kv_heads: 3"}})),
                      "bad.yaml:10: model.kv_heads: expected a divisor of heads (4), got 3");
  REQUIRE_THROWS_WITH(parse(base_with({{9, "  dtype: bf16\n  kv_heads: 8"}})),
                      "bad.yaml:10: model.kv_heads: expected a divisor of heads (4), got 8");
  REQUIRE_THROWS_WITH(parse(base_with({{9, "  dtype: bf16\n  kv_heads: 1"}})),
                      "bad.yaml:10: model.kv_heads: kv_heads 1 is not divisible by tensor = 2; expected a "
                      "multiple of 2");
  REQUIRE_THROWS_WITH(parse(base_with({{9, "  dtype: bf16\n  kv_heads: 0"}})),
                      "bad.yaml:10: model.kv_heads: expected a positive integer (key/value heads; default heads), "
                      "got 0");
  REQUIRE_THROWS_WITH(parse(base_with({{9, "  dtype: bf16\n  kv_heads: eight"}})),
                      StartsWith("bad.yaml:10: model.kv_heads: expected a positive integer"));
  REQUIRE_THROWS_WITH(parse(base_with({{9, "  dtype: bf16\n  mlp: relu"}})),
                      "bad.yaml:10: model.mlp: unknown mlp 'relu'; did you mean 'gelu'? expected one of: gelu, swiglu");
  REQUIRE_THROWS_WITH(parse(base_with({{9, "  dtype: bf16\n  attention: sparse"}})),
                      "bad.yaml:10: model.attention: unknown attention 'sparse'; expected one of: flash, standard");
  REQUIRE_THROWS_WITH(parse(base_with({{9, "  dtype: bf16\n  attentoin: flash"}})),
                      StartsWith("bad.yaml:10: model.attentoin: unknown key; did you mean 'attention'?"));
}

TEST_CASE("synthetic scenarios: microseconds become seconds, shape mirrored", "[scenario]") {
  const Scenario s = load_scenario((kScenarioDir / "synthetic-zb-p8-m24.yaml").string());
  REQUIRE(s.synthetic);
  CHECK(s.synthetic->stages == 8);
  CHECK(s.synthetic->microbatches == 24);
  CHECK(s.synthetic->chunks == 1);
  CHECK(s.synthetic->f_seconds == 18522 / 1e6);
  CHECK(s.synthetic->b_seconds == 18086 / 1e6);
  CHECK(s.synthetic->w_seconds == 9337 / 1e6);
  CHECK(s.synthetic->p2p_latency_seconds == 601 / 1e6);
  CHECK(s.stages() == 8);
  CHECK(s.microbatches() == 24);
  CHECK(s.parallel.pipeline == 8);
  CHECK(s.parallel.global_batch == 24);
  CHECK(s.schedule == "zb-h1");

  const Scenario v = load_scenario((kScenarioDir / "synthetic-interleaved-p4-m8-v2.yaml").string());
  CHECK(v.chunks() == 2);
  CHECK(v.parallel.chunks == 2);
  const Scenario u = load_scenario((kScenarioDir / "synthetic-uniform-p4-m8.yaml").string());
  CHECK(u.synthetic->activation_bytes == 1048576);

  const Scenario sl = parse(
      "synthetic: {stages: 2, microbatches: 4, slices: 3, time: {F: 1, B: 2, W: 0}}\nschedule: tdpipe\n");
  CHECK(sl.parallel.slices == 3);
  CHECK(sl.synthetic->w_seconds == 0);
  CHECK(sl.synthetic->p2p_latency_seconds == 0);
  CHECK(sl.name == "bad");  // file stem of the source name
}

TEST_CASE("GPU presets and their names", "[scenario]") {
  CHECK(gpu_preset_names() == std::vector<std::string>{"a100-80g", "a100-40g", "h100-80g", "h200", "l20", "cpu"});
  const GpuSpec a = gpu_preset("a100-80g");
  CHECK(a.peak_flops == 312e12);
  CHECK(a.hbm_bytes == 80.0 * (1 << 30));
  CHECK(a.hbm_bytes_per_second == 2039e9);
  CHECK(a.nvlink_bytes_per_second == 300e9);
  CHECK(gpu_preset("a100-40g").hbm_bytes == 40.0 * (1 << 30));
  CHECK(gpu_preset("h100-80g").peak_flops == 989e12);
  CHECK(gpu_preset("h100-80g").nvlink_bytes_per_second == 450e9);
  CHECK(gpu_preset("h200").hbm_bytes_per_second == 4800e9);
  CHECK(gpu_preset("h200").hbm_bytes > 140e9);
  // L20: PCIe only, its GPU-to-GPU link PCIe Gen4 x16 as achieved.
  CHECK(gpu_preset("l20").peak_flops == 119.5e12);
  CHECK(gpu_preset("l20").hbm_bytes_per_second == 864e9);
  CHECK(gpu_preset("l20").nvlink_bytes_per_second == 25e9);
  REQUIRE_THROWS_WITH(gpu_preset("v100"),
                      "unknown GPU 'v100'; expected one of: a100-80g, a100-40g, h100-80g, h200, l20, cpu");
}

TEST_CASE("explicit keys override presets", "[scenario]") {
  SECTION("cluster-level overrides of the one group's GPU") {
    const Scenario s = parse(base_with({{13, "  gpus_per_node: 8\n  peak_tflops: 250\n  hbm_gib: 40\n"
                                             "  hbm_gbytes_per_s: 1000\n  nvlink_gbps: 800\n"
                                             "  ib_gbps_per_nic: 100\n  nvlink_latency_us: 2\n"
                                             "  ib_latency_us: 5.5\n  topology: rail-optimized"}}));
    const GpuSpec& g = s.cluster.groups[0].gpu;
    CHECK(g.name == "a100-80g");
    CHECK(g.peak_flops == 250e12);
    CHECK(g.hbm_bytes == 40.0 * (1 << 30));
    CHECK(g.hbm_bytes_per_second == 1000e9);
    CHECK(g.nvlink_bytes_per_second == 300e9);  // the preset's: nvlink_gbps is the fabric's
    CHECK(s.cluster.nvlink_bytes_per_second == 100e9);
    CHECK(s.cluster.ib_bytes_per_second_per_nic == 12.5e9);
    CHECK(s.cluster.nvlink_latency_seconds == 2 / 1e6);
    CHECK(s.cluster.ib_latency_seconds == 5.5 / 1e6);
    CHECK(s.cluster.topology == "rail-optimized");
  }
  SECTION("defaults when not given") {
    const Scenario s = parse(text_of(kBase));
    CHECK(s.cluster.groups[0].gpu == gpu_preset("a100-80g"));
    CHECK(s.cluster.nvlink_bytes_per_second == 0);         // 0 = take the GPU's
    CHECK(s.cluster.ib_bytes_per_second_per_nic == 25e9);  // DGX A100: HDR 200 Gb/s
    CHECK(s.cluster.nics_per_node == 8);
    CHECK(s.cluster.nvlink_latency_seconds == 3.4 / 1e6);
    CHECK(s.cluster.ib_latency_seconds == 14 / 1e6);
    CHECK(s.model.dtype == "bf16");
    CHECK_FALSE(s.parallel.sequence_parallel);
    CHECK(s.name == "bad");
  }
  SECTION("ffn defaults to 4*hidden") {
    const Scenario s = parse(base_with({{5, ""}}));
    CHECK(s.model.ffn == 256);
  }
  SECTION("groups: cluster-wide overrides apply to all, a group's own win") {
    const Scenario s = parse(base_with(
        {{11, "  groups:\n    - {gpu: a100-40g, nodes: 1, peak_tflops: 100}\n"
              "    - {gpu: h200, nodes: 1, nvlink_gbps: 1600}\n  hbm_gib: 20"},
         {12, ""},
         {15, "  tensor: 4"}}));
    REQUIRE(s.cluster.groups.size() == 2);
    CHECK(s.cluster.groups[0].gpu.peak_flops == 100e12);
    CHECK(s.cluster.groups[0].gpu.hbm_bytes == 20.0 * (1 << 30));
    CHECK(s.cluster.groups[1].gpu.peak_flops == 989e12);
    CHECK(s.cluster.groups[1].gpu.hbm_bytes == 20.0 * (1 << 30));
    CHECK(s.cluster.groups[1].gpu.nvlink_bytes_per_second == 200e9);
    CHECK(s.cluster.gpus() == 16);
    CHECK(s.cluster.ib_bytes_per_second_per_nic == 25e9);  // the slower kind's NIC
  }
}

TEST_CASE("bad scenarios are rejected with file:line: field: what was expected", "[scenario]") {
  SECTION("unknown keys, at any level, with the closest known key") {
    REQUIRE_THROWS_WITH(parse(base_with({{16, "  pipelin: 4"}})),
                        StartsWith("bad.yaml:16: parallel.pipelin: unknown key; did you mean 'pipeline'?"));
    REQUIRE_THROWS_WITH(parse(base_with({{23, "schedul: 1f1b"}})),
                        StartsWith("bad.yaml:23: schedul: unknown key; did you mean 'schedule'?"));
    REQUIRE_THROWS_WITH(parse(base_with({{4, "  hiden: 64"}})),
                        StartsWith("bad.yaml:4: model.hiden: unknown key; did you mean 'hidden'?"));
    REQUIRE_THROWS_WITH(parse(base_with({{13, "  gpus_per_nod: 8"}})),
                        StartsWith("bad.yaml:13: cluster.gpus_per_nod: unknown key; did you mean 'gpus_per_node'?"));
    REQUIRE_THROWS_WITH(parse(base_with({{13, "  colour: blue"}})),
                        "bad.yaml:13: cluster.colour: unknown key; known keys: gpu, nodes, groups, gpus_per_node, "
                        "nvlink_gbps, ib_gbps_per_nic, nics_per_node, topology, nvlink_latency_us, "
                        "ib_latency_us, host_gbps, compute_efficiency, peak_tflops, hbm_gib, hbm_gbytes_per_s");
    REQUIRE_THROWS_WITH(parse("synthetic: {stages: 2, microbatches: 2, time: {F: 1, B: 1, Wg: 1}}\n"),
                        StartsWith("bad.yaml:1: synthetic.time.Wg: unknown key; did you mean 'W'?"));
    REQUIRE_THROWS_WITH(
        parse(base_with({{11, "  groups:\n    - {gpu: a100-80g, nodes: 1}\n    - {gpu: h100-80g, node: 1}"},
                         {12, ""}})),
        StartsWith("bad.yaml:13: cluster.groups[1].node: unknown key; did you mean 'nodes'?"));
  }
  SECTION("wrong types") {
    REQUIRE_THROWS_WITH(parse(base_with({{15, "  tensor: two"}})),
                        "bad.yaml:15: parallel.tensor: expected a positive integer (tensor-parallel size), got 'two'");
    REQUIRE_THROWS_WITH(parse(base_with({{15, "  tensor: \"2\""}})),
                        Contains("bad.yaml:15: parallel.tensor: expected a positive integer") &&
                            Contains("got the string \"2\""));
    REQUIRE_THROWS_WITH(parse(base_with({{15, "  tensor: 2.5"}})),
                        Contains("bad.yaml:15: parallel.tensor: expected a positive integer"));
    REQUIRE_THROWS_WITH(parse(base_with({{15, "  tensor: [2]"}})),
                        Contains("bad.yaml:15: parallel.tensor:") && Contains("got a list"));
    REQUIRE_THROWS_WITH(parse(base_with({{15, "  tensor:"}})),
                        Contains("bad.yaml:15: parallel.tensor:") && Contains("got nothing"));
    REQUIRE_THROWS_WITH(parse(base_with({{22, "  sequence_parallel: maybe"}})),
                        "bad.yaml:22: parallel.sequence_parallel: expected true or false, got 'maybe'");
    REQUIRE_THROWS_WITH(parse(base_with({{13, "  gpus_per_node: 8\n  nvlink_gbps: fast"}})),
                        StartsWith("bad.yaml:14: cluster.nvlink_gbps: expected a positive number"));
    REQUIRE_THROWS_WITH(parse(base_with({{1, "model: 5"}, {2, ""}, {3, ""}, {4, ""}, {5, ""}, {6, ""}, {7, ""},
                                         {8, ""}, {9, ""}})),
                        StartsWith("bad.yaml:1: model: expected a map with keys (name, layers"));
    REQUIRE_THROWS_WITH(parse("- a\n- b\n"), StartsWith("bad.yaml:1: scenario: expected a map with keys"));
    REQUIRE_THROWS_WITH(parse(""), StartsWith("bad.yaml:1: scenario: expected a map with keys") &&
                                       Contains("got nothing"));
    REQUIRE_THROWS_WITH(parse(base_with({{11, "  groups: a100-80g"}, {12, ""}})),
                        StartsWith("bad.yaml:11: cluster.groups: expected a non-empty list of {gpu: NAME, nodes: N}"));
  }
  SECTION("missing required keys point at the enclosing map") {
    REQUIRE_THROWS_WITH(parse(base_with({{3, ""}})),
                        "bad.yaml:1: model.layers: missing; expected a positive integer (transformer layers)");
    REQUIRE_THROWS_WITH(parse(base_with({{20, ""}})),
                        "bad.yaml:14: parallel.global_batch: missing; expected a positive integer (sequences per iteration)");
    REQUIRE_THROWS_WITH(parse(base_with({{12, ""}})),
                        "bad.yaml:10: cluster.nodes: missing; expected a positive integer (number of nodes)");
    auto lines = kBase;
    lines.erase(lines.begin() + 9, lines.begin() + 13);  // no cluster at all
    REQUIRE_THROWS_WITH(parse(text_of(lines)), StartsWith("bad.yaml:1: cluster: missing; expected a map"));
    REQUIRE_THROWS_WITH(
        parse(base_with({{11, "  groups:\n    - {gpu: a100-80g, nodes: 1}\n    - {gpu: h200}"}, {12, ""}})),
        "bad.yaml:13: cluster.groups[1].nodes: missing; expected a positive integer (nodes of this GPU)");
    REQUIRE_THROWS_WITH(parse("synthetic: {stages: 2, microbatches: 2}\n"),
                        StartsWith("bad.yaml:1: synthetic.time: missing; expected a map {F: µs, B: µs, W: µs}"));
  }
  SECTION("non-positive values") {
    REQUIRE_THROWS_WITH(parse(base_with({{3, "  layers: 0"}})),
                        "bad.yaml:3: model.layers: expected a positive integer (transformer layers), got 0");
    REQUIRE_THROWS_WITH(parse(base_with({{17, "  data: -1"}})),
                        "bad.yaml:17: parallel.data: expected a positive integer (data-parallel replicas), got -1");
    REQUIRE_THROWS_WITH(parse(base_with({{12, "  nodes: 0"}})),
                        "bad.yaml:12: cluster.nodes: expected a positive integer (number of nodes), got 0");
    REQUIRE_THROWS_WITH(parse(base_with({{13, "  gpus_per_node: 8\n  ib_gbps_per_nic: 0"}})),
                        "bad.yaml:14: cluster.ib_gbps_per_nic: expected a positive number (InfiniBand Gb/s per NIC), got 0");
    REQUIRE_THROWS_WITH(parse(base_with({{13, "  gpus_per_node: 8\n  ib_latency_us: -3"}})),
                        StartsWith("bad.yaml:14: cluster.ib_latency_us: expected a non-negative number"));
    REQUIRE_THROWS_WITH(parse(base_with({{22, "  slices: 0"}})),
                        StartsWith("bad.yaml:22: parallel.slices: expected a positive integer"));
    REQUIRE_THROWS_WITH(parse(base_with({{3, "  layers: 99999999999"}})),
                        StartsWith("bad.yaml:3: model.layers: expected a positive integer"));
  }
  SECTION("tensor*pipeline*data must equal the GPU count") {
    REQUIRE_THROWS_WITH(parse(base_with({{17, "  data: 2"}})),
                        "bad.yaml:14: parallel: tensor*pipeline*data = 2*4*2 = 16 GPUs, but the cluster has 8 "
                        "(1 nodes x 8 GPUs per node); expected them equal");
  }
  SECTION("layers must split over pipeline*chunks") {
    REQUIRE_THROWS_WITH(parse(base_with({{3, "  layers: 6"}})),
                        "bad.yaml:3: model.layers: 6 layers do not split evenly over pipeline*chunks = 4*1 = 4 "
                        "virtual stages; expected a multiple of 4 (or give parallel.layers_per_stage: a list or "
                        "auto)");
    REQUIRE_THROWS_WITH(parse(base_with({{18, "  chunks: 3"}})),
                        StartsWith("bad.yaml:3: model.layers: 8 layers do not split evenly over pipeline*chunks = 4*3"));
  }
  SECTION("hidden, heads and ffn must divide by tensor; hidden by heads") {
    REQUIRE_THROWS_WITH(parse(base_with({{4, "  hidden: 96"}, {6, "  heads: 3"}})),
                        "bad.yaml:6: model.heads: heads 3 is not divisible by tensor = 2; expected a multiple of 2");
    REQUIRE_THROWS_WITH(parse(base_with({{4, "  hidden: 63"}, {6, "  heads: 1"}})),
                        "bad.yaml:4: model.hidden: hidden 63 is not divisible by tensor = 2; expected a multiple of 2");
    REQUIRE_THROWS_WITH(parse(base_with({{5, "  ffn: 255"}})),
                        "bad.yaml:5: model.ffn: ffn 255 is not divisible by tensor = 2; expected a multiple of 2");
    REQUIRE_THROWS_WITH(parse(base_with({{6, "  heads: 6"}})),
                        "bad.yaml:4: model.hidden: expected a multiple of heads (6), got 64");
  }
  SECTION("global_batch must be a multiple of micro_batch*data") {
    REQUIRE_THROWS_WITH(parse(base_with({{19, "  micro_batch: 3"}})),
                        "bad.yaml:20: parallel.global_batch: expected a multiple of micro_batch*data = 3*1 = 3, got 8");
  }
  SECTION("interleaving needs m % p == 0") {
    REQUIRE_THROWS_WITH(parse(base_with({{18, "  chunks: 2"}, {20, "  global_batch: 6"}})),
                        "bad.yaml:18: parallel.chunks: interleaving 2 chunks needs the micro-batch count (6) to be a "
                        "multiple of the pipeline stages (4)");
    REQUIRE_THROWS_WITH(parse("synthetic: {stages: 4, microbatches: 6, chunks: 2, time: {F: 1, B: 1, W: 1}}\n"),
                        "bad.yaml:1: synthetic.chunks: interleaving 2 chunks needs the micro-batch count (6) to be a "
                        "multiple of the pipeline stages (4)");
    CHECK_NOTHROW(parse(base_with({{18, "  chunks: 2"}})));  // m = 8, p = 4
  }
  SECTION("slices between 1 and seq") {
    REQUIRE_THROWS_WITH(parse(base_with({{22, "  slices: 129"}})),
                        "bad.yaml:22: parallel.slices: expected at most seq = 128 slices (each slice needs a token), got 129");
    CHECK(parse(base_with({{22, "  slices: 128"}})).parallel.slices == 128);
  }
  SECTION("unknown names list the known ones") {
    REQUIRE_THROWS_WITH(parse(base_with({{11, "  gpu: a100"}})),
                        "bad.yaml:11: cluster.gpu: unknown GPU 'a100'; did you mean 'a100-80g'? expected one of: a100-80g, a100-40g, "
                        "h100-80g, h200, l20, cpu");
    REQUIRE_THROWS_WITH(parse(base_with({{11, "  gpu: b200"}})),
                        "bad.yaml:11: cluster.gpu: unknown GPU 'b200'; did you mean 'h200'? expected one of: a100-80g, "
                        "a100-40g, h100-80g, h200, l20, cpu");
    REQUIRE_THROWS_WITH(parse(base_with({{11, "  gpu: gtx-1080"}})),
                        "bad.yaml:11: cluster.gpu: unknown GPU 'gtx-1080'; expected one of: a100-80g, "
                        "a100-40g, h100-80g, h200, l20, cpu");
    REQUIRE_THROWS_WITH(parse(base_with({{11, "  gpu: h100-80"}})),
                        StartsWith("bad.yaml:11: cluster.gpu: unknown GPU 'h100-80'; did you mean 'h100-80g'?"));
    REQUIRE_THROWS_WITH(parse(base_with({{21, "  recompute: partial"}})),
                        Contains("bad.yaml:21: parallel.recompute: unknown recompute 'partial'") &&
                            Contains("expected one of: none, selective, full"));
    REQUIRE_THROWS_WITH(parse(base_with({{9, "  dtype: int8"}})),
                        Contains("bad.yaml:9: model.dtype: unknown dtype 'int8'") &&
                            Contains("expected one of: bf16, fp16, fp32"));
    REQUIRE_THROWS_WITH(parse(base_with({{23, "schedule: 1f1f"}})),
                        "bad.yaml:23: schedule: unknown schedule '1f1f'; did you mean '1f1b'? expected one of: "
                        "gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, tdpipe, auto");
    REQUIRE_THROWS_WITH(parse(base_with({{13, "  gpus_per_node: 8\n  topology: torus"}})),
                        Contains("bad.yaml:14: cluster.topology: unknown topology 'torus'"));
  }
  SECTION("synthetic: non-positive values and mixing with a model") {
    REQUIRE_THROWS_WITH(parse("synthetic:\n  stages: 0\n  microbatches: 4\n  time: {F: 1, B: 1, W: 1}\n"),
                        "bad.yaml:2: synthetic.stages: expected a positive integer (pipeline stages p), got 0");
    REQUIRE_THROWS_WITH(parse("synthetic:\n  stages: 2\n  microbatches: -4\n  time: {F: 1, B: 1, W: 1}\n"),
                        StartsWith("bad.yaml:3: synthetic.microbatches: expected a positive integer"));
    REQUIRE_THROWS_WITH(parse("synthetic:\n  stages: 2\n  microbatches: 4\n  time: {F: 0, B: 1, W: 1}\n"),
                        "bad.yaml:4: synthetic.time.F: expected a positive number (forward time in µs), got 0");
    REQUIRE_THROWS_WITH(parse("synthetic:\n  stages: 2\n  microbatches: 4\n  time: {F: 1, B: 1, W: -1}\n"),
                        StartsWith("bad.yaml:4: synthetic.time.W: expected a non-negative number"));
    REQUIRE_THROWS_WITH(
        parse("synthetic:\n  stages: 2\n  microbatches: 4\n  time: {F: 1, B: 1, W: 1}\n  p2p_latency: -1\n"),
        StartsWith("bad.yaml:5: synthetic.p2p_latency: expected a non-negative number"));
    REQUIRE_THROWS_WITH(parse("synthetic:\n  stages: 2\n  microbatches: 4\n  time: {F: .nan, B: 1, W: 1}\n"),
                        StartsWith("bad.yaml:4: synthetic.time.F: expected a positive number"));
    REQUIRE_THROWS_WITH(parse("model: {layers: 2}\nsynthetic: {stages: 2, microbatches: 4, time: {F: 1, B: 1, W: 1}}\n"),
                        StartsWith("bad.yaml:1: model: not used by a synthetic scenario"));
  }
  SECTION("duplicates and contradictions") {
    REQUIRE_THROWS_WITH(parse(base_with({{16, "  pipeline: 4\n  pipeline: 2"}})),
                        "bad.yaml:17: parallel.pipeline: duplicate key (first given on line 16)");
    REQUIRE_THROWS_WITH(parse(base_with({{13, "  gpus_per_node: 8\n  groups: [{gpu: h200, nodes: 1}]"}})),
                        StartsWith("bad.yaml:11: cluster.gpu: give either gpu + nodes (one group) or groups"));
    REQUIRE_THROWS_WITH(parse(base_with({{15, "  tensor: 8"}, {16, "  pipeline: 1"}, {22, "  sequence_parallel: true"},
                                         {7, "  seq: 100"}, {6, "  heads: 8"}})),
                        StartsWith("bad.yaml:22: parallel.sequence_parallel: sequence parallelism splits seq = 100 "
                                   "over tensor = 8"));
  }
  SECTION("YAML syntax errors report the parser's line") {
    REQUIRE_THROWS_WITH(parse(base_with({{15, "  tensor: [2"}})), StartsWith("bad.yaml:16: YAML syntax: "));
    REQUIRE_THROWS_WITH(parse("model: {layers: 8\n"), StartsWith("bad.yaml:2: YAML syntax: "));
    REQUIRE_THROWS_WITH(parse("a: b\n  c: d\n"), StartsWith("bad.yaml:2: YAML syntax: "));
  }
}

TEST_CASE("load_scenario: missing files and directories give clear errors", "[scenario]") {
  REQUIRE_THROWS_WITH(load_scenario("/no/such/dir/x.yaml"),
                      StartsWith("/no/such/dir/x.yaml: scenario file not found"));
  REQUIRE_THROWS_WITH(load_scenario(kScenarioDir.string()), Contains("not a regular file"));
}

TEST_CASE("nothing but tdpipe::Error escapes, whatever the bytes", "[scenario]") {
  // Every prefix of every shipped scenario, and random byte mutations of them.
  std::mt19937 rng(12345);
  int accepted = 0, rejected = 0;
  for (const auto& f : shipped_scenarios()) {
    const std::string text = read_file(f);
    auto attempt = [&](const std::string& t) {
      try {
        parse_scenario(t, "fuzz.yaml");
        ++accepted;
      } catch (const tdpipe::Error& e) {
        ++rejected;
        REQUIRE_THAT(std::string(e.what()), StartsWith("fuzz.yaml:"));
      }
    };
    for (std::size_t n = 0; n < text.size(); n += 7) attempt(text.substr(0, n));
    for (int k = 0; k < 200; ++k) {
      std::string t = text;
      for (int e = 0; e < 3; ++e) t[rng() % t.size()] = static_cast<char>(rng() % 128);
      attempt(t);
    }
  }
  CHECK(rejected > 100);
  CHECK(accepted > 0);
}

TEST_CASE("scenario JSON round trips exactly and names bad fields", "[scenario]") {
  for (const auto& f : shipped_scenarios()) {
    INFO(f.string());
    const Scenario s = load_scenario(f.string());
    const nlohmann::json j = to_json(s);
    CHECK(scenario_from_json(j) == s);
    CHECK(to_json(scenario_from_json(j)) == j);
    CHECK(scenario_from_json(nlohmann::json::parse(j.dump())) == s);  // through text too
  }
  const nlohmann::json j = to_json(load_scenario((kScenarioDir / "mixed-a100-h100.yaml").string()));
  CHECK(j["cluster"]["groups"][1]["gpu"]["name"] == "h100-80g");
  CHECK(j["synthetic"].is_null());
  CHECK(j["parallel"]["recompute"] == "none");
  CHECK(to_json(load_scenario((kScenarioDir / "gpt3-175b-a100-8x8.yaml").string()))["parallel"]["recompute"] ==
        "selective");

  auto broken = j;
  broken["parallel"]["tensor"] = "8";
  REQUIRE_THROWS_WITH(scenario_from_json(broken), "scenario.parallel.tensor: expected an integer, got \"8\"");
  broken = j;
  broken["cluster"]["groups"][0]["gpu"].erase("peak_flops");
  REQUIRE_THROWS_WITH(scenario_from_json(broken), "scenario.cluster.groups[0].gpu.peak_flops: missing");
  broken = j;
  broken["model"]["layer"] = 3;
  REQUIRE_THROWS_WITH(scenario_from_json(broken), StartsWith("scenario.model.layer: unknown key"));
  broken = j;
  broken["model"]["kv_heads"] = 48;
  REQUIRE_THROWS_WITH(scenario_from_json(broken), "scenario.model.kv_heads: expected a divisor of heads (64), got 48");
  broken["model"]["kv_heads"] = 4;  // divides 64, but tensor = 8 does not divide it
  REQUIRE_THROWS_WITH(scenario_from_json(broken),
                      "scenario.model.kv_heads: kv_heads 4 is not divisible by tensor = 8; expected a multiple of 8");
  broken["model"]["kv_heads"] = -8;
  REQUIRE_THROWS_WITH(scenario_from_json(broken), StartsWith("scenario.model.kv_heads: expected an integer ≥ 0"));
  broken["model"]["kv_heads"] = "8";
  REQUIRE_THROWS_WITH(scenario_from_json(broken), "scenario.model.kv_heads: expected an integer, got \"8\"");
  broken = j;
  broken["model"]["mlp"] = "relu";
  REQUIRE_THROWS_WITH(scenario_from_json(broken), "scenario.model.mlp: expected one of gelu, swiglu, got \"relu\"");
  broken = j;
  broken["model"]["attention"] = "sparse";
  REQUIRE_THROWS_WITH(scenario_from_json(broken),
                      "scenario.model.attention: expected one of flash, standard, got \"sparse\"");
  broken = j;
  broken["parallel"]["recompute"] = "some";
  REQUIRE_THROWS_WITH(scenario_from_json(broken), StartsWith("scenario.parallel.recompute: expected one of none"));
  REQUIRE_THROWS_WITH(scenario_from_json(nlohmann::json::array()), "scenario: expected an object, got array");
}

TEST_CASE("scenario JSON: kv_heads - mlp - attention round trip and default when absent", "[scenario]") {
  const Scenario l = load_scenario((kScenarioDir / "llama2-70b-a100-4x8.yaml").string());
  const nlohmann::json j = to_json(l);
  CHECK(j["model"]["kv_heads"] == 8);
  CHECK(j["model"]["mlp"] == "swiglu");
  CHECK(j["model"]["attention"] == "flash");
  const Scenario back = scenario_from_json(nlohmann::json::parse(j.dump()));
  CHECK(back.model == l.model);
  CHECK(back == l);
  // JSON written before these keys existed: multi-head attention, GeLU, flash attention.
  nlohmann::json old = to_json(load_scenario((kScenarioDir / "mixed-a100-h100.yaml").string()));
  for (const char* key : {"kv_heads", "mlp", "attention"}) old["model"].erase(key);
  const Scenario o = scenario_from_json(old);
  CHECK(o.model.kv_heads == 0);
  CHECK(o.model.kv_heads_or_heads() == 64);
  CHECK(o.model.mlp == "gelu");
  CHECK(o.model.attention == "flash");
}

TEST_CASE("parallel.layers_per_stage and slices auto: what they accept - errors at their line", "[scenario]") {
  // kBase: 8 layers, pipeline 4, chunks 1 (line 18), slices on line 22.
  const Scenario d = parse(text_of(kBase));
  CHECK(d.parallel.layers_per_stage.empty());
  CHECK_FALSE(d.parallel.layers_per_stage_auto);
  CHECK_FALSE(d.parallel.slices_auto);
  const Scenario l = parse(base_with({{3, "  layers: 9"}, {22, "  slices: auto\n  layers_per_stage: [1, 3, 3, 2]"}}));
  CHECK(l.parallel.layers_per_stage == std::vector<int>{1, 3, 3, 2});
  CHECK(l.parallel.slices_auto);
  CHECK(l.parallel.slices == 1);
  const Scenario a = parse(base_with({{3, "  layers: 9"}, {22, "  layers_per_stage: auto"}}));
  CHECK(a.parallel.layers_per_stage_auto);
  CHECK(a.parallel.layers_per_stage.empty());
  // Block-style list: an item's error points at its own line.
  REQUIRE_THROWS_WITH(parse(base_with({{22, "  layers_per_stage:\n    - 2\n    - 2\n    - 0\n    - 4"}})),
                      "bad.yaml:25: parallel.layers_per_stage[2]: expected a positive integer (layers), got '0'");
  REQUIRE_THROWS_WITH(parse(base_with({{22, "  layers_per_stage: [2, 2, 2.5, 2]"}})),
                      "bad.yaml:22: parallel.layers_per_stage[2]: expected a positive integer (layers), got '2.5'");
  REQUIRE_THROWS_WITH(parse(base_with({{22, "  layers_per_stage: [2, 2, 4]"}})),
                      "bad.yaml:22: parallel.layers_per_stage: expected one entry per virtual stage, "
                      "pipeline*chunks = 4*1 = 4, got 3");
  REQUIRE_THROWS_WITH(parse(base_with({{22, "  layers_per_stage: [2, 2, 2, 3]"}})),
                      "bad.yaml:22: parallel.layers_per_stage: the stages hold 9 layers in all; expected "
                      "model.layers = 8");
  REQUIRE_THROWS_WITH(parse(base_with({{22, "  layers_per_stage: evenly"}})),
                      "bad.yaml:22: parallel.layers_per_stage: expected auto or a list of layer counts, one per "
                      "virtual stage (pipeline*chunks), got 'evenly'");
  REQUIRE_THROWS_WITH(parse(base_with({{22, "  layers_per_stage: []"}})),
                      StartsWith("bad.yaml:22: parallel.layers_per_stage: expected auto or a list"));
  REQUIRE_THROWS_WITH(parse(base_with({{3, "  layers: 3"}, {22, "  layers_per_stage: auto"}})),
                      "bad.yaml:22: parallel.layers_per_stage: auto needs at least one layer per virtual stage: "
                      "model.layers = 3 < pipeline*chunks = 4");
  // Without a partition the even split still needs divisibility, and says what to do.
  REQUIRE_THROWS_WITH(parse(base_with({{3, "  layers: 9"}})),
                      Contains("bad.yaml:3: model.layers: 9 layers do not split evenly") &&
                          Contains("parallel.layers_per_stage"));
  REQUIRE_THROWS_WITH(parse(base_with({{22, "  slices: automatic"}})),
                      StartsWith("bad.yaml:22: parallel.slices: expected a positive integer (temporal slices per "
                                 "micro-batch, or auto)"));
  // JSON: the same keys, the same rules.
  const nlohmann::json j = to_json(l);
  CHECK(j["parallel"]["slices"] == "auto");
  CHECK(j["parallel"]["layers_per_stage"] == nlohmann::json::array({1, 3, 3, 2}));
  CHECK(scenario_from_json(j) == l);
  CHECK(scenario_from_json(to_json(a)) == a);
  CHECK(to_json(a)["parallel"]["layers_per_stage"] == "auto");
  nlohmann::json broken = j;
  broken["parallel"]["layers_per_stage"] = {1, 3, 3, 3};
  REQUIRE_THROWS_WITH(scenario_from_json(broken), "scenario.parallel.layers_per_stage: the stages hold 10 layers in "
                                                  "all; expected model.layers = 9");
  broken["parallel"]["layers_per_stage"] = {1, 3, "3", 2};
  REQUIRE_THROWS_WITH(scenario_from_json(broken),
                      "scenario.parallel.layers_per_stage[2]: expected a positive integer (layers), got \"3\"");
  broken["parallel"]["layers_per_stage"] = 4;
  REQUIRE_THROWS_WITH(scenario_from_json(broken), StartsWith("scenario.parallel.layers_per_stage: expected \"auto\""));
  broken = j;
  broken["parallel"]["slices"] = "many";
  REQUIRE_THROWS_WITH(scenario_from_json(broken), "scenario.parallel.slices: expected an integer, got \"many\"");
  // A synthetic scenario has no tokens for slices auto: YAML and JSON both say so.
  REQUIRE_THROWS_WITH(parse("synthetic: {stages: 2, microbatches: 4, slices: auto, time: {F: 1, B: 1, W: 1}}\n"),
                      StartsWith("bad.yaml:1: synthetic.slices: expected a positive integer"));
  nlohmann::json syn = to_json(parse("synthetic: {stages: 2, microbatches: 4, time: {F: 1, B: 1, W: 1}}\n"));
  syn["parallel"]["slices"] = "auto";
  REQUIRE_THROWS_WITH(scenario_from_json(syn), StartsWith("scenario.synthetic.slices: expected a count: auto cuts"));
  // JSON written before the key: an even split.
  nlohmann::json old = to_json(d);
  old["parallel"].erase("layers_per_stage");
  CHECK(scenario_from_json(old) == d);
}
