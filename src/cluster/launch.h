// How this process was started: alone, or as one rank of several (mpirun, srun, torchrun).
//
// Read from the environment before anything else runs, so that N copies of ckptool started
// by a launcher never rewrite the same files side by side. Two kinds of variables matter:
//
//   wiring    set only when an MPI runtime can connect the ranks: OMPI_COMM_WORLD_SIZE
//             (Open MPI's mpirun), PMIX_RANK (PMIx: mpirun, srun --mpi=pmix), PMI_SIZE /
//             PMI_RANK (PMI-1/2: srun --mpi=pmi2, MPICH's hydra);
//   declared  how many copies the launcher started, first found of OMPI_COMM_WORLD_SIZE,
//             PMI_SIZE, SLURM_STEP_NUM_TASKS, SLURM_NTASKS inside a job step (SLURM_STEP_ID
//             set; a batch script alone sees SLURM_NTASKS of the whole allocation and is one
//             process), WORLD_SIZE (torchrun, torch.distributed's launchers).
//
// With wiring, an MPI build starts MPI and checks the world it gets against the declared
// count; without MPI built in, several declared copies are refused. Without wiring, several
// declared copies are always refused: nothing could divide the work between them.
// CKPTOOL_ONE_PROCESS=1 says "I am one process whatever the variables say" (a ckptool run
// from inside one rank of a training job, which inherits that job's variables).
#pragma once

#include <functional>
#include <string>

namespace ckpt::cluster {

struct Launch {
  bool wired = false;    // an MPI runtime can connect the ranks
  int declared = 1;      // copies the launcher started (1 when nothing says more)
  std::string variable;  // the variable `declared` was read from, e.g. "SLURM_STEP_NUM_TASKS=4"
  bool forced_single = false;  // CKPTOOL_ONE_PROCESS=1
};

// `getenv` returns nullptr for an unset variable (std::getenv in the tool; a map in tests).
Launch DetectLaunch(const std::function<const char*(const char*)>& getenv);

// What to do with that launch in a build with or without MPI.
enum class Role {
  kAlone,   // one process: run, no MPI
  kMpi,     // start MPI, then check its world against `declared`
  kRefuse,  // several copies that nothing coordinates: exit 2 before touching a file
};
Role Decide(const Launch& launch, bool mpi_built);

// The message for kRefuse, and for an MPI world whose size is not what the launcher said
// (mpi_ranks > 0).
std::string RefusalMessage(const Launch& launch, bool mpi_built, int mpi_ranks = 0);

}  // namespace ckpt::cluster
