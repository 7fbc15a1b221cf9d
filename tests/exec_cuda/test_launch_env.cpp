// test_launch_env.cpp — launcher environment parsing and launch-layout checks (CPU only).
#include <catch2/catch.hpp>

#include "tdpipe/exec/cuda/launch_env.hpp"
#include "tdpipe/ir/error.hpp"

using namespace tdpipe::exec::cuda;
using Catch::Matchers::Contains;

TEST_CASE("no launcher variables: one process", "[launch]") {
  LaunchEnv e = parse_launch_env(map_env({}));
  CHECK(e.launcher == "single");
  CHECK(e.rank == 0);
  CHECK(e.world == 1);
  CHECK(e.local_rank == 0);
  CHECK(e.local_world == 1);
}

TEST_CASE("OpenMPI's mpirun variables", "[launch]") {
  LaunchEnv e = parse_launch_env(map_env({{"OMPI_COMM_WORLD_RANK", "5"},
                                          {"OMPI_COMM_WORLD_SIZE", "8"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                          {"OMPI_COMM_WORLD_NODE_RANK", "1"},
                                          // srun inside the allocation also sets Slurm's: mpirun wins
                                          {"SLURM_PROCID", "0"},
                                          {"SLURM_NTASKS", "1"}}));
  CHECK(e.launcher == "openmpi");
  CHECK(e.rank == 5);
  CHECK(e.world == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world == 4);
  CHECK(e.node == 1);  // (5 − 1) / 4: ranks 4…7 fill the second node
}

TEST_CASE("Slurm's srun variables, tasks per node expanded", "[launch]") {
  LaunchEnv e = parse_launch_env(map_env({{"SLURM_PROCID", "9"},
                                          {"SLURM_NTASKS", "10"},
                                          {"SLURM_LOCALID", "0"},
                                          {"SLURM_NODEID", "3"},
                                          {"SLURM_TASKS_PER_NODE", "3(x3),1"}}));
  CHECK(e.launcher == "slurm");
  CHECK(e.rank == 9);
  CHECK(e.world == 10);
  CHECK(e.local_rank == 0);
  CHECK(e.local_world == 1);
  CHECK(e.node == 3);
}

TEST_CASE("SLURM_TASKS_PER_NODE forms", "[launch]") {
  CHECK(slurm_tasks_on_node("4", 0) == 4);
  CHECK(slurm_tasks_on_node("2(x3),1", 0) == 2);
  CHECK(slurm_tasks_on_node("2(x3),1", 2) == 2);
  CHECK(slurm_tasks_on_node("2(x3),1", 3) == 1);
  CHECK(slurm_tasks_on_node("8,4(x2)", 2) == 4);
  CHECK_THROWS_WITH(slurm_tasks_on_node("2(x3),1", 4), Contains("lists 4 nodes") && Contains("SLURM_NODEID=4"));
  CHECK_THROWS_WITH(slurm_tasks_on_node("2(3)", 0), Contains("expected items like 4 or 2(x3)"));
  CHECK_THROWS_WITH(slurm_tasks_on_node("two", 0), Contains("SLURM_TASKS_PER_NODE='two'"));
}

TEST_CASE("MPICH/PMI and torchrun variables", "[launch]") {
  LaunchEnv p = parse_launch_env(map_env({{"PMI_RANK", "2"}, {"PMI_SIZE", "4"},
                                          {"MPI_LOCALRANKID", "2"}, {"MPI_LOCALNRANKS", "4"}}));
  CHECK(p.launcher == "pmi");
  CHECK(p.rank == 2);
  CHECK(p.local_rank == 2);
  LaunchEnv t = parse_launch_env(map_env({{"RANK", "3"}, {"WORLD_SIZE", "4"},
                                          {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}));
  CHECK(t.launcher == "torchrun");
  CHECK(t.rank == 3);
  CHECK(t.local_world == 2);
}

TEST_CASE("malformed or inconsistent launcher variables name the variable", "[launch]") {
  CHECK_THROWS_WITH(parse_launch_env(map_env({{"OMPI_COMM_WORLD_RANK", "x1"},
                                              {"OMPI_COMM_WORLD_SIZE", "2"}})),
                    Contains("OMPI_COMM_WORLD_RANK='x1'") && Contains("expected a non-negative integer"));
  CHECK_THROWS_WITH(parse_launch_env(map_env({{"OMPI_COMM_WORLD_RANK", "4"},
                                              {"OMPI_COMM_WORLD_SIZE", "4"}})),
                    Contains("OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4"));
  CHECK_THROWS_WITH(parse_launch_env(map_env({{"OMPI_COMM_WORLD_RANK", "0"}})),
                    Contains("OMPI_COMM_WORLD_SIZE is not set"));
  CHECK_THROWS_WITH(parse_launch_env(map_env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"},
                                              {"SLURM_LOCALID", "3"}, {"SLURM_TASKS_PER_NODE", "2"}})),
                    Contains("local rank 3 is not below the 2 processes on this node"));
  CHECK_THROWS_WITH(parse_launch_env(map_env({{"RANK", "-1"}, {"WORLD_SIZE", "2"}})),
                    Contains("RANK=-1"));
}

TEST_CASE("NCCL id exchange: MPI, NCCL_COMM_ID, or a message saying what to set", "[launch]") {
  LaunchEnv one;
  CHECK(choose_id_exchange(one, map_env({}), false) == IdExchange::None);
  LaunchEnv mpi = parse_launch_env(map_env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}));
  CHECK(choose_id_exchange(mpi, map_env({}), true) == IdExchange::Mpi);
  CHECK(choose_id_exchange(mpi, map_env({{"NCCL_COMM_ID", "node0:29500"}}), false) ==
        IdExchange::NcclCommId);
  CHECK_THROWS_WITH(choose_id_exchange(mpi, map_env({}), false),
                    Contains("this build has no MPI") && Contains("NCCL_COMM_ID=<host of rank 0>:<free port>"));
  LaunchEnv torch = parse_launch_env(map_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}}));
  CHECK_THROWS_WITH(choose_id_exchange(torch, map_env({}), true),
                    Contains("the launcher (torchrun) is not an MPI launcher"));
  CHECK(to_string(IdExchange::NcclCommId) == "nccl-comm-id");
}

TEST_CASE("device selection and GPU counts give clear messages", "[launch]") {
  LaunchEnv e = parse_launch_env(map_env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  CHECK(select_device(e, 8) == 3);
  CHECK(select_device(e, 4) == 3);
  CHECK_THROWS_WITH(select_device(e, 2), Contains("4 processes were started on this node but it has 2 GPUs"));
  CHECK_THROWS_WITH(select_device(e, 1), Contains("4 processes were started on this node but it has 1 GPU:"));
  // srun --gpus-per-task=1: each task sees only the GPU Slurm bound to it.
  LaunchEnv srun = parse_launch_env(map_env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                                             {"SLURM_NODEID", "1"}, {"SLURM_TASKS_PER_NODE", "4(x2)"}}));
  CHECK(select_device(srun, 1) == 0);
  CHECK(select_device(srun, 4) == 1);
  CHECK_THROWS_WITH(select_device(srun, 2), Contains("4 processes were started on this node but it has 2 GPUs"));
  CHECK_THROWS_WITH(select_device(e, 0), Contains("no CUDA GPU visible"));

  LaunchEnv single;
  CHECK_NOTHROW(check_world(4, single, /*loopback=*/true, 1));
  CHECK_THROWS_WITH(check_world(4, single, true, 0), Contains("needs a GPU but none is visible"));
  CHECK_THROWS_WITH(check_world(4, single, false, 1),
                    Contains("the plan needs 4 GPUs") && Contains("1 process was launched") &&
                        Contains("mpirun -np 4") && Contains("--transport loopback"));
  CHECK_NOTHROW(check_world(8, e, false, 4));
  CHECK_THROWS_WITH(check_world(4, e, true, 4), Contains("8 processes were launched"));
}

TEST_CASE("too little GPU memory is reported in GiB", "[launch]") {
  const std::int64_t gib = std::int64_t(1) << 30;
  CHECK_NOTHROW(check_memory(2 * gib, 3 * gib, 80 * gib, 0));
  CHECK_THROWS_WITH(check_memory(5 * gib, 3 * gib, 80 * gib, 1),
                    Contains("GPU 1 has 3.00 GiB free of 80.00 GiB") && Contains("needs about 5.00 GiB"));
}
