// The world this process runs in: one process, or one rank of an MPI job through the module
// ckptool-mpi.so (cluster/mpi_module.h), loaded only when the launch is an MPI one.
#include "cluster/world.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/utf8.h"
#include "cluster/launch.h"
#include "cluster/mpi_module.h"

namespace ckpt::cluster {

namespace {

#ifdef CKPT_MPI_MODULE
constexpr bool kMpiBuilt = true;
#else
constexpr bool kMpiBuilt = false;
#endif

const MpiModule* g_mpi = nullptr;  // set once MPI was started through the module
int g_rank = 0;
int g_size = 1;

void Say(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "ckptool: error: %s\n", Printable(message).c_str());
}

std::string RankName() {
  return "rank " + std::to_string(g_rank) + " of " + std::to_string(g_size);
}

// A collective that failed leaves no way to agree on anything: end the job.
void Check(int code, const char* what) {
  if (code == 0) return;
  AbortJob(RankName() + ": " + what + " failed: " + g_mpi->error_text(code), 1);
}

// The folder of the running executable, with a trailing '/', or "" when it cannot be read.
std::string ExecutableDir() {
  std::string path(4096, '\0');
  ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
  if (n <= 0 || static_cast<size_t>(n) >= path.size()) return "";
  path.resize(static_cast<size_t>(n));
  return path.substr(0, path.rfind('/') + 1);
}

// The module beside the executable. Returns nullptr and says why in `error`.
const MpiModule* LoadModule(std::string* error) {
  static const MpiModule* loaded = nullptr;
  static std::string why;
  static bool tried = false;
  if (!tried) {
    tried = true;
    std::string file = ExecutableDir() + kMpiModuleFile;
    // RTLD_GLOBAL: Open MPI loads components of its own that resolve against libmpi.
    void* handle = ::dlopen(file.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      const char* e = ::dlerror();
      why = "cannot load the MPI module: " + std::string(e ? e : file.c_str());
    } else if (auto entry =
                   reinterpret_cast<const MpiModule* (*)()>(::dlsym(handle, kMpiModuleEntry));
               entry == nullptr) {
      why = file + " has no " + kMpiModuleEntry + ": not a ckptool MPI module";
    } else if (const MpiModule* m = entry(); m->abi != kMpiModuleAbi) {
      why = file + " is from another build of ckptool (interface " + std::to_string(m->abi) +
            ", this one " + std::to_string(kMpiModuleAbi) + ")";
    } else {
      loaded = m;
    }
  }
  if (loaded == nullptr && error != nullptr) *error = why;
  return loaded;
}

}  // namespace

int Start(int* argc, char*** argv, bool writes) {
  Launch l = DetectLaunch([](const char* name) { return std::getenv(name); });
  Role role = Decide(l, kMpiBuilt);
  if (role == Role::kRefuse && !writes) role = Role::kAlone;
  if (role == Role::kRefuse) {
    Say(RefusalMessage(l, kMpiBuilt));
    return 2;
  }
  if (role == Role::kAlone) return 0;
  std::string error;
  const MpiModule* mpi = LoadModule(&error);
  if (mpi == nullptr) {
    Say(error + "; not starting as one of " + std::to_string(l.declared) + " ranks");
    return 2;
  }
  int rank = 0, size = 1;
  if (int rc = mpi->init(argc, argv, &rank, &size); rc != 0) {
    Say("MPI_Init failed (" + mpi->error_text(rc) + "): not starting as one of " +
        std::to_string(l.declared) + " ranks");
    mpi->abort(2);
    return 2;
  }
  g_mpi = mpi;
  g_rank = rank;
  g_size = size;
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
  if (g_mpi != nullptr) g_mpi->finalize();
}

bool MpiBuiltIn() {
  return kMpiBuilt;
}

std::string MpiLibrary() {
  if (!kMpiBuilt) return "";
  std::string error;
  const MpiModule* mpi = LoadModule(&error);
  return mpi != nullptr ? mpi->library() : error;
}

int Rank() {
  return g_rank;
}
int Size() {
  return g_size;
}

std::vector<std::string> GatherToRoot(const std::string& mine) {
  if (g_size == 1) return {mine};
  std::vector<std::string> out;
  Check(g_mpi->gather_to_root(mine, &out), "gathering results");
  return out;
}

std::string BroadcastFromRoot(const std::string& value) {
  if (g_size == 1) return value;
  std::string out = value;
  Check(g_mpi->broadcast_from_root(&out), "broadcasting rank 0's decision");
  return out;
}

int MaxOverRanks(int value) {
  if (g_size == 1) return value;
  Check(g_mpi->max_over_ranks(&value), "reducing exit codes");
  return value;
}

void AbortJob(const std::string& why, int code) {
  Say(why);
  if (g_mpi != nullptr) g_mpi->abort(code);
  std::exit(code);
}

}  // namespace ckpt::cluster
