// launch_env.cpp — launcher environment parsing and launch-layout checks.
#include "tdpipe/exec/cuda/launch_env.hpp"

#include <charconv>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "tdpipe/ir/error.hpp"

namespace tdpipe::exec::cuda {

EnvLookup process_env() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

EnvLookup map_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

namespace {

int parse_int(std::string_view text, std::string_view what) {
  int value = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(first, last, value);
  if (text.empty() || ec != std::errc() || ptr != last)
    throw Error("launch environment: " + std::string(what) + "='" + std::string(text) +
                "': expected a non-negative integer");
  if (value < 0)
    throw Error("launch environment: " + std::string(what) + "=" + std::string(text) +
                ": expected a non-negative integer");
  return value;
}

int required(const EnvLookup& env, std::string_view name, std::string_view launcher) {
  auto v = env(name);
  if (!v)
    throw Error("launch environment: " + std::string(launcher) + " launch detected but " +
                std::string(name) + " is not set");
  return parse_int(*v, name);
}

std::optional<int> optional_int(const EnvLookup& env, std::string_view name) {
  auto v = env(name);
  if (!v) return std::nullopt;
  return parse_int(*v, name);
}

void check_consistent(const LaunchEnv& e, std::string_view rank_var, std::string_view world_var) {
  if (e.world < 1)
    throw Error("launch environment: " + std::string(world_var) + "=" + std::to_string(e.world) +
                ": expected at least 1 process");
  if (e.rank >= e.world)
    throw Error("launch environment: " + std::string(rank_var) + "=" + std::to_string(e.rank) +
                " is not below " + std::string(world_var) + "=" + std::to_string(e.world));
  if (e.local_world < 1 || e.local_rank >= e.local_world)
    throw Error("launch environment (" + e.launcher + "): local rank " +
                std::to_string(e.local_rank) + " is not below the " +
                std::to_string(e.local_world) + " processes on this node");
  if (e.local_world > e.world)
    throw Error("launch environment (" + e.launcher + "): " + std::to_string(e.local_world) +
                " processes on this node but only " + std::to_string(e.world) + " in all");
}

}  // namespace

int slurm_tasks_on_node(std::string_view spec, int node) {
  // Comma-separated items "N" or "N(xK)": K consecutive nodes with N tasks each.
  int first_node = 0;
  std::size_t pos = 0;
  while (pos <= spec.size()) {
    std::size_t comma = spec.find(',', pos);
    std::string_view item = spec.substr(pos, comma == std::string_view::npos ? std::string_view::npos
                                                                             : comma - pos);
    int repeat = 1;
    std::string_view count_text = item;
    if (auto paren = item.find('('); paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')')
        throw Error("launch environment: SLURM_TASKS_PER_NODE='" + std::string(spec) +
                    "': expected items like 4 or 2(x3)");
      repeat = parse_int(item.substr(paren + 2, item.size() - paren - 3), "SLURM_TASKS_PER_NODE");
      count_text = item.substr(0, paren);
    }
    int count = parse_int(count_text, "SLURM_TASKS_PER_NODE");
    if (node < first_node + repeat) return count;
    first_node += repeat;
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  throw Error("launch environment: SLURM_TASKS_PER_NODE='" + std::string(spec) + "' lists " +
              std::to_string(first_node) + " nodes but SLURM_NODEID=" + std::to_string(node));
}

LaunchEnv parse_launch_env(const EnvLookup& env) {
  LaunchEnv e;
  if (env("OMPI_COMM_WORLD_RANK")) {
    e.launcher = "openmpi";
    e.rank = required(env, "OMPI_COMM_WORLD_RANK", "mpirun");
    e.world = required(env, "OMPI_COMM_WORLD_SIZE", "mpirun");
    e.local_rank = optional_int(env, "OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
    e.local_world = optional_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(e.world);
    check_consistent(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
    // OpenMPI names no node index (OMPI_COMM_WORLD_NODE_RANK is a rank *on* the node,
    // across jobs): with mpirun's default by-slot mapping of equal nodes, ranks fill
    // node after node. Informational only — nothing selects by it.
    e.node = (e.rank - e.local_rank) / e.local_world;
    return e;
  }
  if (env("SLURM_PROCID") && (env("SLURM_NTASKS") || env("SLURM_NPROCS"))) {
    e.launcher = "slurm";
    e.rank = required(env, "SLURM_PROCID", "srun");
    e.world = env("SLURM_NTASKS") ? required(env, "SLURM_NTASKS", "srun")
                                  : required(env, "SLURM_NPROCS", "srun");
    e.local_rank = optional_int(env, "SLURM_LOCALID").value_or(0);
    e.node = optional_int(env, "SLURM_NODEID").value_or(0);
    if (auto per_node = env("SLURM_TASKS_PER_NODE"))
      e.local_world = slurm_tasks_on_node(*per_node, e.node);
    else if (auto n = optional_int(env, "SLURM_NTASKS_PER_NODE"))
      e.local_world = *n;
    else
      e.local_world = e.world;
    check_consistent(e, "SLURM_PROCID", "SLURM_NTASKS");
    return e;
  }
  if (env("PMI_RANK")) {
    e.launcher = "pmi";
    e.rank = required(env, "PMI_RANK", "PMI");
    e.world = required(env, "PMI_SIZE", "PMI");
    e.local_rank = optional_int(env, "MPI_LOCALRANKID").value_or(0);
    e.local_world = optional_int(env, "MPI_LOCALNRANKS").value_or(e.world);
    check_consistent(e, "PMI_RANK", "PMI_SIZE");
    return e;
  }
  if (env("RANK") && env("WORLD_SIZE")) {
    e.launcher = "torchrun";
    e.rank = required(env, "RANK", "torchrun");
    e.world = required(env, "WORLD_SIZE", "torchrun");
    e.local_rank = optional_int(env, "LOCAL_RANK").value_or(0);
    e.local_world = optional_int(env, "LOCAL_WORLD_SIZE").value_or(e.world);
    e.node = optional_int(env, "GROUP_RANK").value_or(0);
    check_consistent(e, "RANK", "WORLD_SIZE");
    return e;
  }
  return e;
}

IdExchange choose_id_exchange(const LaunchEnv& launch, const EnvLookup& env, bool built_with_mpi) {
  if (launch.world == 1) return IdExchange::None;
  const bool mpi_launch = launch.launcher == "openmpi" || launch.launcher == "slurm" ||
                          launch.launcher == "pmi";
  if (built_with_mpi && mpi_launch) return IdExchange::Mpi;
  if (auto id = env("NCCL_COMM_ID"); id && !id->empty()) return IdExchange::NcclCommId;
  std::string why = built_with_mpi ? "the launcher (" + launch.launcher + ") is not an MPI launcher"
                                   : "this build has no MPI";
  throw Error("cannot agree on an NCCL id for " + std::to_string(launch.world) +
              " processes: " + why +
              "; set NCCL_COMM_ID=<host of rank 0>:<free port> in every process's environment, "
              "or launch with mpirun/srun on a build with MPI");
}

std::string_view to_string(IdExchange exchange) {
  switch (exchange) {
    case IdExchange::None: return "none";
    case IdExchange::Mpi: return "mpi";
    case IdExchange::NcclCommId: return "nccl-comm-id";
  }
  return "?";
}

int select_device(const LaunchEnv& launch, int visible_devices) {
  if (visible_devices <= 0)
    throw Error("no CUDA GPU visible on this node (rank " + std::to_string(launch.rank) +
                "): check CUDA_VISIBLE_DEVICES and the driver (nvidia-smi), or use --backend cpu");
  // Under srun, one visible GPU for several tasks on the node means Slurm bound one
  // GPU to each task (--gpus-per-task=1, --gpu-bind=single:1): it is device 0 here.
  // (Should they really share one, ncclCommInitRank fails with NCCL's "Duplicate GPU
  // detected" naming both ranks.) Elsewhere several processes on one GPU is a mistake
  // we can name now.
  if (visible_devices == 1 && launch.launcher == "slurm") return 0;
  if (launch.local_world > visible_devices)
    throw Error(std::to_string(launch.local_world) + " processes were started on this node but it has " +
                std::to_string(visible_devices) + " GPU" + (visible_devices == 1 ? "" : "s") +
                ": start at most one process per GPU (e.g. mpirun --map-by ppr:" +
                std::to_string(visible_devices) + ":node), or use --transport loopback on one GPU");
  return launch.local_rank;
}

void check_world(int needed_ranks, const LaunchEnv& launch, bool loopback, int visible_devices) {
  if (visible_devices <= 0)
    throw Error("the CUDA backend needs a GPU but none is visible: check CUDA_VISIBLE_DEVICES and "
                "the driver (nvidia-smi), or run with --backend cpu");
  if (loopback) {
    if (launch.world != 1)
      throw Error("--transport loopback runs every stage in one process on one GPU, but " +
                  std::to_string(launch.world) + " processes were launched: start it once, "
                  "without mpirun/srun, or use --transport nccl");
    return;
  }
  if (launch.world != needed_ranks) {
    std::string how = "mpirun -np " + std::to_string(needed_ranks) + " tdpipe exec … --backend cuda";
    throw Error("the plan needs " + std::to_string(needed_ranks) +
                " GPUs (one process per pipeline rank and data replica) but " +
                std::to_string(launch.world) + " process" + (launch.world == 1 ? " was" : "es were") +
                " launched: run `" + how + "`, or use --transport loopback to run every stage on one GPU");
  }
}

void check_memory(std::int64_t required_bytes, std::int64_t free_bytes, std::int64_t total_bytes,
                  int device) {
  if (required_bytes <= free_bytes) return;
  auto gib = [](std::int64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
    return std::string(buf);
  };
  throw Error("GPU " + std::to_string(device) + " has " + gib(free_bytes) + " GiB free of " +
              gib(total_bytes) + " GiB but this rank needs about " + gib(required_bytes) +
              " GiB (weights, Adam state, activations): lower micro_batch, seq or layers in the "
              "scenario, use more pipeline stages, or free the GPU");
}

}  // namespace tdpipe::exec::cuda
