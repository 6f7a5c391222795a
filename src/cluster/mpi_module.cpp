// ckptool-mpi.so: the MPI calls behind cluster/mpi_module.h. Only MPI lives here; what a
// launch means and what a failure does are decided by the tool (world.cpp).
#include <mpi.h>
#include <time.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "cluster/mpi_module.h"

namespace ckpt::cluster {

namespace {

bool g_started = false;
bool g_stopped = false;
MPI_Comm g_comm = MPI_COMM_NULL;

// Waits for a nonblocking collective, sleeping between tests instead of spinning.
int Wait(MPI_Request* request) {
  long sleep_ns = 50'000;
  for (;;) {
    int done = 0;
    if (int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) return rc;
    if (done) return MPI_SUCCESS;
    timespec t{0, sleep_ns};
    ::nanosleep(&t, nullptr);
    sleep_ns = std::min(sleep_ns * 2, 20'000'000L);
  }
}

int Init(int* argc, char*** argv, int* rank, int* size) {
  int provided = 0;
  if (int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided); rc != MPI_SUCCESS)
    return rc;
  g_started = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (int rc = MPI_Comm_dup(MPI_COMM_WORLD, &g_comm); rc != MPI_SUCCESS) return rc;
  MPI_Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(g_comm, rank);
  MPI_Comm_size(g_comm, size);
  return MPI_SUCCESS;
}

void Finalize() {
  if (!g_started || g_stopped) return;
  g_stopped = true;
  if (g_comm != MPI_COMM_NULL) MPI_Comm_free(&g_comm);
  MPI_Finalize();
}

std::string Library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "MPI";
  std::string s(text, static_cast<size_t>(len));
  return s.substr(0, s.find_first_of(",\n"));
}

std::string ErrorText(int code) {
  if (code == kMpiTooLarge) return "message over 2 GiB";
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

int GatherToRoot(const std::string& mine, std::vector<std::string>* out) {
  if (mine.size() > INT_MAX) return kMpiTooLarge;
  int rank = 0, size = 1;
  MPI_Comm_rank(g_comm, &rank);
  MPI_Comm_size(g_comm, &size);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(rank == 0 ? static_cast<size_t>(size) : 0);
  MPI_Request r;
  if (int rc = MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, g_comm, &r);
      rc != MPI_SUCCESS)
    return rc;
  if (int rc = Wait(&r); rc != MPI_SUCCESS) return rc;
  std::vector<int> displs(lens.size());
  int64_t total = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    displs[i] = static_cast<int>(total);
    total += lens[i];
    if (total > INT_MAX) return kMpiTooLarge;
  }
  std::string all(static_cast<size_t>(total), '\0');
  if (int rc = MPI_Igatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                            MPI_CHAR, 0, g_comm, &r);
      rc != MPI_SUCCESS)
    return rc;
  if (int rc = Wait(&r); rc != MPI_SUCCESS) return rc;
  out->clear();
  for (size_t i = 0; i < lens.size(); ++i)
    out->push_back(all.substr(static_cast<size_t>(displs[i]), static_cast<size_t>(lens[i])));
  return MPI_SUCCESS;
}

int BroadcastFromRoot(std::string* value) {
  int rank = 0;
  MPI_Comm_rank(g_comm, &rank);
  uint64_t len = value->size();
  MPI_Request r;
  if (int rc = MPI_Ibcast(&len, 1, MPI_UINT64_T, 0, g_comm, &r); rc != MPI_SUCCESS) return rc;
  if (int rc = Wait(&r); rc != MPI_SUCCESS) return rc;
  if (len > INT_MAX) return kMpiTooLarge;
  if (rank != 0) value->assign(len, '\0');
  if (int rc = MPI_Ibcast(value->data(), static_cast<int>(len), MPI_CHAR, 0, g_comm, &r);
      rc != MPI_SUCCESS)
    return rc;
  return Wait(&r);
}

int MaxOverRanks(int* value) {
  int in = *value;
  MPI_Request r;
  if (int rc = MPI_Iallreduce(&in, value, 1, MPI_INT, MPI_MAX, g_comm, &r); rc != MPI_SUCCESS)
    return rc;
  return Wait(&r);
}

void Abort(int code) {
  if (g_started && !g_stopped) MPI_Abort(MPI_COMM_WORLD, code);
}

constexpr MpiModule kModule{kMpiModuleAbi,     Init,         Finalize,
                            Library,           ErrorText,    GatherToRoot,
                            BroadcastFromRoot, MaxOverRanks, Abort};

}  // namespace

}  // namespace ckpt::cluster

extern "C" __attribute__((visibility("default"))) const ckpt::cluster::MpiModule*
ckptool_mpi_module() {
  return &ckpt::cluster::kModule;
}
