// ckptool: make ML checkpoints small, safe and fast to handle.
#include <iostream>

#include "cli/run.h"
#include "cluster/steps.h"
#include "cluster/world.h"

int main(int argc, char** argv) {
  // Launched as one of several ranks? Start MPI, or refuse before touching anything.
  if (int rc = ckpt::cluster::Start(&argc, &argv,
                                    !ckpt::cli::WritesNothing(ckpt::cli::CommandOf(argc, argv))))
    return rc;
  ckpt::cli::RaiseOpenFileLimit();
  ckpt::cli::TuneMalloc();
  int rc = ckpt::cli::RunCommandLine(argc, argv);
  std::cout.flush();
  // The steps this rank skipped, then the job's exit code: the same on every rank.
  rc = ckpt::cluster::Finish(rc);
  ckpt::cluster::Stop();
  return rc;
}
