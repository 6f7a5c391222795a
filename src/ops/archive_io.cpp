#include "ops/archive_io.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace ckpt::archive_io {

using ckz::Chunk;
using ckz::Entry;
using ckz::Index;

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

struct timespec ToTimespec(int64_t ns) {
  struct timespec ts {};
  int64_t sec = ns / 1000000000, rem = ns % 1000000000;
  if (rem < 0) {
    rem += 1000000000;
    --sec;
  }
  ts.tv_sec = static_cast<time_t>(sec);
  ts.tv_nsec = static_cast<long>(rem);
  return ts;
}

[[noreturn]] void FailErrno(const std::string& path, std::string_view what) {
  Fail("{}: {}: {}", path, what, std::strerror(errno));
}

std::string StripSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

bool PathExists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

void CheckOutputFree(const std::string& out, bool force) {
  if (!force && PathExists(out)) Fail("{}: exists; --force replaces it", out);
}

void StreamSink::Write(uint64_t offset, Bytes data) {
  if (offset != pos_) Fail("internal: stream write at {} after {}", offset, pos_);
  while (!data.empty()) {
    ssize_t n = ::write(fd_, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) FailErrno(name_, "write failed");
    data = data.subspan(static_cast<size_t>(n));
    pos_ += static_cast<uint64_t>(n);
  }
}

IndexStats StatsOf(const Index& index) {
  IndexStats s;
  for (const Chunk& c : index.chunks) {
    s.chunk_headers += ckz::ChunkHeaderSize(c.planes.size());
    const Entry& e = index.entries[c.file];
    std::vector<ckz::Run> runs = ckz::RunsOf(e.ranges, c.offset, c.length);
    bool typed_runs = false;
    for (const ckz::Run& r : runs) typed_runs |= r.transform != ckz::Transform::kBytes;
    if (c.coding == ckz::Coding::kWhole) {
      if (typed_runs) {
        ++s.fallback_chunks;
        s.fallback.original += c.length;
        s.fallback.stored += c.planes[0].stored;
      } else {
        PlaneStat& p = s.planes[0][0];
        p.original += c.length;
        p.stored += c.planes[0].stored;
        ++p.methods[static_cast<int>(c.planes[0].method)];
        s.transforms[0].original += c.length;
        s.transforms[0].stored += c.planes[0].stored;
      }
      continue;
    }
    std::vector<ckz::PlaneShape> shapes = ckz::PlaneShapes(runs);
    for (size_t i = 0; i < shapes.size() && i < c.planes.size(); ++i) {
      int t = static_cast<int>(shapes[i].transform);
      PlaneStat& p = s.planes[t][shapes[i].plane];
      p.original += shapes[i].size;
      p.stored += c.planes[i].stored;
      ++p.methods[static_cast<int>(c.planes[i].method)];
      s.transforms[t].original += shapes[i].size;
      s.transforms[t].stored += c.planes[i].stored;
    }
  }
  return s;
}

}  // namespace ckpt::archive_io
