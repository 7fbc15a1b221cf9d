// cmd_import.cpp — `tdpipe import megatron [OPTIONS] -- ARGS…`: a scenario from the
// arguments of a Megatron-LM training run (ir/megatron_import.hpp).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "tdpipe/ir/atomic_file.hpp"
#include "tdpipe/ir/megatron_import.hpp"
#include "tdpipe/ir/scenario_io.hpp"

namespace tdpipe::apps {
namespace {

struct ImportArgs {
  ir::MegatronCluster cluster;
  std::string output;
  std::vector<std::string> megatron;
};

void run_import(const ImportArgs& a) {
  const ir::MegatronImport got = ir::import_megatron(a.megatron, a.cluster);
  std::string text = got.yaml;
  if (!got.notes.empty()) {
    std::string head = "# notes:\n";
    for (const auto& n : got.notes) head += "#  - " + n + "\n";
    text = head + text;
  }
  if (a.output.empty() || a.output == "-") {
    std::cout << text;
  } else {
    ir::write_file_atomic(a.output, text, "the imported scenario");
    std::cerr << "wrote " << a.output << " (" << got.scenario.parallel.tensor << "×" << got.scenario.parallel.pipeline
              << "×" << got.scenario.parallel.data << " = t×p×d on " << got.scenario.cluster.gpus() << " GPUs)\n";
  }
  for (const auto& n : got.notes) std::cerr << "note: " << n << "\n";
}

}  // namespace

void add_import_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("import", "Make a scenario from another tool's configuration");
  cmd->require_subcommand(1);
  auto args = std::make_shared<ImportArgs>();
  CLI::App* meg = cmd->add_subcommand(
      "megatron", "From Megatron-LM pretrain_gpt.py arguments, given after --: tdpipe import megatron --gpus 64 "
                  "-- --num-layers 96 --hidden-size 12288 …");
  meg->add_option("--gpu", args->cluster.gpu, "GPU preset")
      ->check(CLI::IsMember(ir::gpu_preset_names()))
      ->capture_default_str();
  meg->add_option("--gpus", args->cluster.gpus, "World size (GPUs); or --nodes")->check(CLI::PositiveNumber);
  meg->add_option("--nodes", args->cluster.nodes, "Nodes (× --gpus-per-node GPUs)")->check(CLI::PositiveNumber);
  meg->add_option("--gpus-per-node", args->cluster.gpus_per_node, "GPUs per node")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  meg->add_option("--name", args->cluster.name, "Scenario name")->capture_default_str();
  meg->add_option("-o,--output", args->output, "Write the scenario here (atomically) instead of to stdout");
  meg->add_option("megatron-args", args->megatron, "Megatron-LM arguments (after --)")->required();
  meg->callback([args] { run_import(*args); });
}

}  // namespace tdpipe::apps
