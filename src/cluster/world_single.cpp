// A world of one process: the build without MPI (CKPT_MPI=OFF).
#include <cstdio>
#include <cstdlib>

#include "base/utf8.h"
#include "cluster/launch.h"
#include "cluster/world.h"

namespace ckpt::cluster {

int Start(int*, char***) {
  Launch l = DetectLaunch([](const char* name) { return std::getenv(name); });
  if (Decide(l, false) == Role::kRefuse) {
    std::fprintf(stderr, "ckptool: error: %s\n", Printable(RefusalMessage(l, false)).c_str());
    return 2;
  }
  return 0;
}

void Stop() {}
bool MpiBuiltIn() {
  return false;
}
std::string MpiLibrary() {
  return "";
}
int Rank() {
  return 0;
}
int Size() {
  return 1;
}
std::vector<std::string> GatherToRoot(const std::string& mine) {
  return {mine};
}
std::string BroadcastFromRoot(const std::string& value) {
  return value;
}
int MaxOverRanks(int value) {
  return value;
}

void AbortJob(const std::string& why, int code) {
  std::fprintf(stderr, "ckptool: error: %s\n", Printable(why).c_str());
  std::exit(code);
}

}  // namespace ckpt::cluster
