// The MPI job this process is part of, behind a small interface: rank, size and the few
// collective operations ckptool needs. world.cpp implements it: a world of one process, or
// MPI through the module ckptool-mpi.so (mpi_module.h); commands never see MPI itself.
//
// MPI is started only when the launch says so (cluster/launch.h): a plain `ckptool` run pays
// nothing for it and needs no launcher. Collectives run on a communicator of our own with
// MPI_ERRORS_RETURN; a failed one (a rank gone) ends this rank with MPI_Abort, which has the
// launcher stop the others too: after a lost collective no rank can know what the rest did.
// Waits poll with growing sleeps (up to 20 ms), so ranks that finished their share, or wait
// while rank 0 works alone, do not spin on a core.
#pragma once

#include <string>
#include <vector>

namespace ckpt::cluster {

// Reads the launch (launch.h), starts MPI when it must. Returns 0 to go on, or an exit code
// (2) after printing why this process must not run. A command that writes nothing (`writes`
// false: inspect, verify, help) runs in every process of an unconnected launch (torchrun's
// WORLD_SIZE): its copies cannot race.
int Start(int* argc, char*** argv, bool writes);
// MPI_Finalize when MPI was started; safe to call more than once.
void Stop();

bool MpiBuiltIn();
// "Open MPI v4.1.4" (the library's own name and version), or "" without MPI.
std::string MpiLibrary();

int Rank();
int Size();
inline bool IsRoot() {
  return Rank() == 0;
}
inline bool Distributed() {
  return Size() > 1;
}

// Collectives: every rank calls them in the same order (steps.h makes sure of it).
// Rank 0 gets every rank's string, index = rank; other ranks get an empty vector.
std::vector<std::string> GatherToRoot(const std::string& mine);
// Rank 0's `value` on every rank.
std::string BroadcastFromRoot(const std::string& value);
int MaxOverRanks(int value);

// Ends the whole job: this rank and, through the launcher, every other.
[[noreturn]] void AbortJob(const std::string& why, int code);

}  // namespace ckpt::cluster
