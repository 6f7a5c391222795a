#include "cluster/launch.h"

#include <fmt/format.h>

#include <charconv>
#include <cstring>

namespace ckpt::cluster {

namespace {

// A positive count, or 0 when the text is not one.
int Count(const char* text) {
  if (!text) return 0;
  int n = 0;
  const char* end = text + std::strlen(text);
  auto [p, ec] = std::from_chars(text, end, n);
  if (ec != std::errc() || p != end || n < 1) return 0;
  return n;
}

}  // namespace

Launch DetectLaunch(const std::function<const char*(const char*)>& getenv) {
  Launch l;
  const char* one = getenv("CKPTOOL_ONE_PROCESS");
  l.forced_single = one && std::strcmp(one, "1") == 0;
  l.wired = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE") ||
            getenv("PMI_RANK");
  const bool in_slurm_step = getenv("SLURM_STEP_ID") || getenv("SLURM_STEPID");
  for (const char* name :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "WORLD_SIZE"}) {
    if (std::strcmp(name, "SLURM_NTASKS") == 0 && !in_slurm_step) continue;
    int n = Count(getenv(name));
    if (n == 0) continue;
    l.declared = n;
    l.variable = fmt::format("{}={}", name, n);
    break;
  }
  return l;
}

Role Decide(const Launch& l, bool mpi_built) {
  if (l.forced_single) return Role::kAlone;
  if (l.wired && mpi_built) return Role::kMpi;
  return l.declared > 1 ? Role::kRefuse : Role::kAlone;
}

std::string RefusalMessage(const Launch& l, bool mpi_built, int mpi_ranks) {
  std::string tail =
      " (CKPTOOL_ONE_PROCESS=1 runs it anyway, for a process known to be the only one)";
  if (mpi_ranks > 0) {
    return fmt::format(
        "started as one of {} ranks ({}), but MPI connected a world of {}: the launcher is "
        "not the MPI ckptool was built with (srun needs --mpi=pmix for Open MPI); refusing, "
        "so that {} copies do not rewrite the same files{}",
        l.declared, l.variable, mpi_ranks, l.declared, tail);
  }
  if (!mpi_built) {
    return fmt::format(
        "started as one of {} ranks ({}), but this ckptool was built without MPI: the {} "
        "copies would rewrite the same files; refusing (build with libopenmpi-dev for "
        "-DCKPT_MPI=ON, or run one ckptool){}",
        l.declared, l.variable, l.declared, tail);
  }
  return fmt::format(
      "started as one of {} tasks ({}) with no MPI runtime to connect them (no "
      "OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_SIZE: use mpirun, or srun --mpi=pmix); the {} "
      "copies would rewrite the same files; refusing{}",
      l.declared, l.variable, l.declared, tail);
}

}  // namespace ckpt::cluster
