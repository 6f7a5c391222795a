// The boundary between ckptool and its MPI module, ckptool-mpi.so (CKPT_MPI=ON).
//
// Open MPI's libraries (libmpi, open-rte, open-pal, hwloc, libevent) cost ~6 ms of dynamic
// loading and relocation at every start, more than a small command's whole work. So MPI
// lives in a module of its own, next to the executable, that world.cpp dlopen's only when
// the launch is an MPI one (cluster/launch.h) or --version asks which MPI it is; a plain
// run maps none of it. Both sides are built together from this header; `abi` guards against
// a module left behind by another build.
//
// Every function returns MPI_SUCCESS (0) or an error code that `error_text` explains; the
// tool, not the module, decides what a failure means (world.cpp: end the job).
#pragma once

#include <string>
#include <vector>

namespace ckpt::cluster {

inline constexpr unsigned kMpiModuleAbi = 1;
inline constexpr char kMpiModuleFile[] = "ckptool-mpi.so";
inline constexpr char kMpiModuleEntry[] = "ckptool_mpi_module";
// Returned for a message over INT_MAX bytes, which MPI's int counts cannot carry.
inline constexpr int kMpiTooLarge = -1;

struct MpiModule {
  unsigned abi;
  // MPI_Init_thread (MPI_THREAD_FUNNELED: only the main thread calls MPI) and a duplicate of
  // MPI_COMM_WORLD with MPI_ERRORS_RETURN, whose rank and size it returns.
  int (*init)(int* argc, char*** argv, int* rank, int* size);
  // Frees the communicator and calls MPI_Finalize once; a no-op when init did not succeed.
  void (*finalize)();
  // "Open MPI v4.1.4": the first line of MPI_Get_library_version.
  std::string (*library)();
  std::string (*error_text)(int code);
  // Collectives on the module's communicator (world.h says what they do). They wait with
  // growing sleeps between tests, so a rank with nothing to do leaves its core to the others.
  int (*gather_to_root)(const std::string& mine, std::vector<std::string>* out);
  int (*broadcast_from_root)(std::string* value);
  int (*max_over_ranks)(int* value);
  // MPI_Abort on MPI_COMM_WORLD when MPI was started (the launcher then stops every rank).
  void (*abort)(int code);
};

}  // namespace ckpt::cluster

// The module's one exported symbol.
extern "C" const ckpt::cluster::MpiModule* ckptool_mpi_module();
