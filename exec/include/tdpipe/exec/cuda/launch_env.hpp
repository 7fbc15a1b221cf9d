// launch_env.hpp — who am I in a multi-process launch: rank, world size and the
// rank on this node, read from the launcher's environment (OpenMPI's mpirun,
// Slurm's srun, MPICH/PMI, torchrun), plus the checks that turn a wrong layout
// (more ranks per node than GPUs, a plan needing more GPUs than launched) into a
// clear message. Plain C++, no CUDA: unit-tested on CPU.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace tdpipe::exec::cuda {

/// Looks up one environment variable (nullopt when unset).
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

/// The real process environment.
EnvLookup process_env();
/// A fixed environment, for tests and for replaying a launch.
EnvLookup map_env(std::map<std::string, std::string> vars);

struct LaunchEnv {
  std::string launcher = "single";  ///< "openmpi", "slurm", "pmi", "torchrun" or "single"
  int rank = 0;         ///< global rank
  int world = 1;        ///< number of processes
  int local_rank = 0;   ///< rank on this node (selects the GPU)
  int local_world = 1;  ///< processes on this node
  int node = 0;         ///< node index (Slurm, torchrun: as set; mpirun: derived from by-slot mapping), else 0
};

/// Reads the launcher's variables, first match wins: OMPI_COMM_WORLD_* (mpirun),
/// SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_TASKS_PER_NODE (srun), PMI_RANK/PMI_SIZE
/// (MPICH), RANK/WORLD_SIZE/LOCAL_RANK (torchrun); none → a single process. Throws
/// tdpipe::Error naming the variable for a malformed or inconsistent value.
LaunchEnv parse_launch_env(const EnvLookup& env);

/// Slurm's SLURM_TASKS_PER_NODE ("4", "2(x3),1") expanded: tasks on node `node`.
/// Throws tdpipe::Error for a malformed value or a node past the list.
int slurm_tasks_on_node(std::string_view tasks_per_node, int node);

/// How the ranks agree on one NCCL unique id.
enum class IdExchange {
  None,        ///< one process: nothing to exchange (loopback, or world 1)
  Mpi,         ///< rank 0 creates it, MPI_Bcast sends it
  NcclCommId,  ///< NCCL_COMM_ID=host:port set: every rank derives it (NCCL bootstrap)
};

/// Picks the exchange for this launch; throws tdpipe::Error explaining what to set
/// when world > 1 and neither MPI (built in and launched by mpirun/srun) nor
/// NCCL_COMM_ID is available.
IdExchange choose_id_exchange(const LaunchEnv& launch, const EnvLookup& env, bool built_with_mpi);
std::string_view to_string(IdExchange exchange);

/// The GPU this rank drives: local_rank, checked against the GPUs visible on the
/// node; 0 when an srun task sees exactly one GPU (Slurm bound one per task). Throws tdpipe::Error when there is no GPU or more ranks on the node than GPUs.
int select_device(const LaunchEnv& launch, int visible_devices);

/// Checks that a plan fits this launch: `needed_ranks` (stages × data) processes for
/// NCCL (one per GPU), or one process and one GPU for loopback. Throws tdpipe::Error
/// saying how many GPUs/processes the plan needs and how to launch it.
void check_world(int needed_ranks, const LaunchEnv& launch, bool loopback, int visible_devices);

/// Throws tdpipe::Error when `required_bytes` exceed `free_bytes` of the GPU, with
/// both in GiB and what to shrink.
void check_memory(std::int64_t required_bytes, std::int64_t free_bytes, std::int64_t total_bytes,
                  int device);

}  // namespace tdpipe::exec::cuda
