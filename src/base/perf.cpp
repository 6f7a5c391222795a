#include "base/perf.h"

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

namespace ckpt {

namespace {

struct Node {
  std::string name;
  size_t parent;
  double seconds = 0;
  uint64_t count = 0;
};

std::atomic<bool> g_enabled{false};
std::mutex g_mutex;
std::vector<Node> g_nodes = {{"total", SIZE_MAX}};
thread_local size_t t_current = 0;

size_t Child(size_t parent, const char* name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (size_t i = 0; i < g_nodes.size(); ++i) {
    if (g_nodes[i].parent == parent && g_nodes[i].name == name) return i;
  }
  g_nodes.push_back({name, parent});
  return g_nodes.size() - 1;
}

void Print(std::FILE* out, size_t node, int depth) {
  for (size_t i = 0; i < g_nodes.size(); ++i) {
    if (g_nodes[i].parent != node) continue;
    std::fprintf(out, "%*s%-*s %9.3f s  x%llu\n", 2 * depth, "", 32 - 2 * depth,
                 g_nodes[i].name.c_str(), g_nodes[i].seconds,
                 static_cast<unsigned long long>(g_nodes[i].count));
    Print(out, i, depth + 1);
  }
}

}  // namespace

PerfTimer::PerfTimer(const char* name) : node_(SIZE_MAX) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  node_ = Child(t_current, name);
  t_current = node_;
  start_ = std::chrono::steady_clock::now();
}

PerfTimer::~PerfTimer() {
  if (node_ == SIZE_MAX) return;
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_nodes[node_].seconds += s;
  g_nodes[node_].count++;
  t_current = g_nodes[node_].parent;
}

void EnablePerf() {
  g_enabled = true;
}

void PrintPerf(std::FILE* out) {
  if (!g_enabled) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(out, "phase                              seconds  (summed over threads)\n");
  Print(out, 0, 0);
}

}  // namespace ckpt
