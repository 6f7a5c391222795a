// The world as an MPI job (CKPT_MPI=ON). Only the main thread calls MPI
// (MPI_THREAD_FUNNELED): worker threads never take part in collectives.
#include <mpi.h>
#include <time.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/utf8.h"
#include "cluster/launch.h"
#include "cluster/world.h"

namespace ckpt::cluster {

namespace {

bool g_started = false;
bool g_stopped = false;
int g_rank = 0;
int g_size = 1;
MPI_Comm g_comm = MPI_COMM_NULL;

void Say(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "ckptool: error: %s\n", Printable(message).c_str());
}

std::string ErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

std::string RankName() {
  return "rank " + std::to_string(g_rank) + " of " + std::to_string(g_size);
}

// A collective that failed leaves no way to agree on anything: end the job.
void Check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  AbortJob(RankName() + ": " + what + " failed: " + ErrorText(code), 1);
}

// Waits for a nonblocking collective, sleeping between tests instead of spinning: a rank
// with nothing left to do leaves its core to the ranks (and threads) that still work.
void Wait(MPI_Request* request, const char* what) {
  long sleep_ns = 50'000;
  for (;;) {
    int done = 0;
    Check(MPI_Test(request, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    timespec t{0, sleep_ns};
    ::nanosleep(&t, nullptr);
    sleep_ns = std::min(sleep_ns * 2, 20'000'000L);
  }
}

}  // namespace

int Start(int* argc, char*** argv) {
  Launch l = DetectLaunch([](const char* name) { return std::getenv(name); });
  Role role = Decide(l, true);
  if (role == Role::kRefuse) {
    Say(RefusalMessage(l, true));
    return 2;
  }
  if (role == Role::kAlone) return 0;
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    Say("MPI_Init failed: not starting as one of " + std::to_string(l.declared) + " ranks");
    return 2;
  }
  g_started = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  Check(MPI_Comm_dup(MPI_COMM_WORLD, &g_comm), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(g_comm, &g_rank);
  MPI_Comm_size(g_comm, &g_size);
  if (l.declared > 1 && g_size != l.declared) {
    // Another MPI's launcher, or srun without the PMIx plugin: every copy is a world of
    // its own and would do all the work.
    Say(RefusalMessage(l, true, g_size));
    Stop();
    return 2;
  }
  return 0;
}

void Stop() {
  if (!g_started || g_stopped) return;
  g_stopped = true;
  if (g_comm != MPI_COMM_NULL) MPI_Comm_free(&g_comm);
  MPI_Finalize();
}

bool MpiBuiltIn() {
  return true;
}

std::string MpiLibrary() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "MPI";
  std::string s(text, static_cast<size_t>(len));
  return s.substr(0, s.find_first_of(",\n"));
}

int Rank() {
  return g_rank;
}
int Size() {
  return g_size;
}

std::vector<std::string> GatherToRoot(const std::string& mine) {
  if (g_size == 1) return {mine};
  if (mine.size() > INT_MAX) AbortJob(RankName() + ": results too large to gather", 1);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(g_rank == 0 ? static_cast<size_t>(g_size) : 0);
  MPI_Request r;
  Check(MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, g_comm, &r), "MPI_Igather");
  Wait(&r, "MPI_Igather");
  std::vector<int> displs(lens.size());
  int64_t total = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    displs[i] = static_cast<int>(total);
    total += lens[i];
    if (total > INT_MAX) AbortJob(RankName() + ": results too large to gather", 1);
  }
  std::string all(static_cast<size_t>(total), '\0');
  Check(MPI_Igatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
                     0, g_comm, &r),
        "MPI_Igatherv");
  Wait(&r, "MPI_Igatherv");
  std::vector<std::string> out;
  for (size_t i = 0; i < lens.size(); ++i)
    out.push_back(all.substr(static_cast<size_t>(displs[i]), static_cast<size_t>(lens[i])));
  return out;
}

std::string BroadcastFromRoot(const std::string& value) {
  if (g_size == 1) return value;
  uint64_t len = value.size();
  MPI_Request r;
  Check(MPI_Ibcast(&len, 1, MPI_UINT64_T, 0, g_comm, &r), "MPI_Ibcast");
  Wait(&r, "MPI_Ibcast");
  if (len > INT_MAX) AbortJob(RankName() + ": broadcast too large", 1);
  std::string out = g_rank == 0 ? value : std::string(len, '\0');
  Check(MPI_Ibcast(out.data(), static_cast<int>(len), MPI_CHAR, 0, g_comm, &r), "MPI_Ibcast");
  Wait(&r, "MPI_Ibcast");
  return out;
}

int MaxOverRanks(int value) {
  if (g_size == 1) return value;
  int out = value;
  MPI_Request r;
  Check(MPI_Iallreduce(&value, &out, 1, MPI_INT, MPI_MAX, g_comm, &r), "MPI_Iallreduce");
  Wait(&r, "MPI_Iallreduce");
  return out;
}

void AbortJob(const std::string& why, int code) {
  Say(why);
  if (g_started && !g_stopped) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace ckpt::cluster
