#include <fmt/format.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "dcp/dcp_parts.h"
#include "io/range_stream.h"

namespace ckpt::dcp {

namespace {

// Calls fn(item, byte offset in its archive, elements, stride of the last dim in elements)
// for each run of consecutive elements of [first, first + count) that one chunk holds along
// the last dimension, in row-major order.
template <typename Fn>
void ForEachRun(const Checkpoint& c, const Tensor& t, uint64_t first, uint64_t count, Fn&& fn) {
  const size_t dims = t.shape.size();
  const uint64_t esize = torch::ElementSize(t.dtype);
  std::vector<int64_t> idx(dims);
  uint64_t rest = first;
  for (size_t d = dims; d-- > 0;) {
    idx[d] = static_cast<int64_t>(rest % static_cast<uint64_t>(t.shape[d]));
    rest /= static_cast<uint64_t>(t.shape[d]);
  }
  while (count > 0) {
    uint64_t flat = 0;
    for (size_t d = 0; d < dims; ++d) {
      const auto& cuts = t.cuts[d];
      auto cell = std::upper_bound(cuts.begin(), cuts.end(), idx[d]) - cuts.begin() - 1;
      flat = flat * (cuts.size() - 1) + static_cast<uint64_t>(cell);
    }
    const Chunk& ch = t.chunks[static_cast<size_t>(t.cell_chunk[flat])];
    const Item& item = c.items[static_cast<size_t>(ch.item)];
    uint64_t run = 1, local = 0;
    int64_t inner_stride = 1;
    for (size_t d = 0; d < dims; ++d) {
      local += static_cast<uint64_t>(idx[d] - ch.meta.offsets[d]) *
               static_cast<uint64_t>(item.stride[d]);
    }
    if (dims > 0) {
      run =
          std::min<uint64_t>(count, static_cast<uint64_t>(ch.meta.offsets[dims - 1] +
                                                          ch.meta.sizes[dims - 1] - idx[dims - 1]));
      inner_stride = item.stride[dims - 1];
    }
    fn(item, item.data + local * esize, run, run == 1 ? 1 : inner_stride);
    count -= run;
    if (dims == 0) break;
    idx[dims - 1] += static_cast<int64_t>(run);
    for (size_t d = dims; d-- > 1 && idx[d] == t.shape[d];) {
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

// LogicalTensor::read of a DCP tensor. Long runs go to the sink straight from the mapping;
// short ones (the rows of a column-sharded tensor) are gathered into a staging buffer so that
// they do not become one write each. The staging is filled with preadv: the rows one chunk
// contributes lie one after another in its item, so each chunk's rows come in one call that
// scatters them to their places, without mapping a page. Elements of a strided item (rare)
// are read one by one (MappedFile::Read). A file without a descriptor (a .ckz archive's member,
// read in place) is read through MappedFile::Read instead of preadv.
void ReadRange(const Checkpoint& c, const Tensor& t, uint64_t first, uint64_t count,
               const SpanSink& sink) {
  if (count == 0) return;
  constexpr uint64_t kDirect = 64 << 10, kStage = 4 << 20;
  const uint64_t esize = torch::ElementSize(t.dtype);
  struct Pending {
    const Item* item;
    uint64_t src;  // offset in the item's archive
    uint64_t dst;  // offset in the staging buffer
    uint64_t size;
  };
  thread_local std::vector<uint8_t> stage;
  thread_local std::vector<Pending> pending;
  stage.clear();
  pending.clear();
  auto fill = [&] {
    std::stable_sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) {
      return a.item != b.item ? a.item < b.item : a.src < b.src;
    });
    std::vector<iovec> iov;
    for (size_t i = 0; i < pending.size();) {
      const Pending& p0 = pending[i];
      const MappedFile& map = *p0.item->map;
      if (map.fd() < 0) {  // nothing to preadv from: an archive's member
        map.Read(p0.item->archive_offset + p0.src, stage.data() + p0.dst, p0.size);
        ++i;
        continue;
      }
      iov.clear();
      uint64_t at = p0.src, total = 0;
      size_t j = i;
      for (; j < pending.size() && pending[j].item == p0.item && pending[j].src == at &&
             iov.size() < 1024;
           ++j) {
        iov.push_back({stage.data() + pending[j].dst, pending[j].size});
        at += pending[j].size;
        total += pending[j].size;
      }
      uint64_t off = p0.item->archive_offset + p0.src;
      while (total > 0) {
        ssize_t n =
            ::preadv(map.fd(), iov.data(), static_cast<int>(iov.size()), static_cast<off_t>(off));
        if (n <= 0)
          Fail("{}: read failed at {}: {}", map.path(), off,
               n < 0 ? std::strerror(errno) : "the file is shorter");
        total -= static_cast<uint64_t>(n);
        off += static_cast<uint64_t>(n);
        for (size_t k = 0, left = static_cast<size_t>(n); left > 0;) {  // drop what was read
          if (left >= iov[k].iov_len) {
            left -= iov[k].iov_len;
            iov[k++].iov_len = 0;
          } else {
            iov[k].iov_base = static_cast<uint8_t*>(iov[k].iov_base) + left;
            iov[k].iov_len -= left;
            left = 0;
          }
        }
        while (!iov.empty() && iov.front().iov_len == 0) iov.erase(iov.begin());
      }
      i = j;
    }
    pending.clear();
  };
  auto flush = [&] {
    fill();
    if (!stage.empty()) sink(Bytes(stage.data(), stage.size()));
    stage.clear();
  };
  ForEachRun(
      c, t, first, count, [&](const Item& item, uint64_t base, uint64_t run, int64_t stride) {
        uint64_t bytes = run * esize;
        if (stride == 1 && bytes >= kDirect && item.map != nullptr) {
          flush();
          StreamRange(*item.map, item.archive_offset + base, bytes,
                      [&sink](uint64_t, Bytes b) { sink(b); });
        } else if (stride == 1) {
          if (stage.size() + bytes > kStage) flush();
          if (bytes > kStage) {
            sink(item.archive.subspan(base, bytes));
          } else if (item.map != nullptr) {
            pending.push_back({&item, base, stage.size(), bytes});
            stage.resize(stage.size() + bytes);
          } else {
            const uint8_t* p = item.archive.data() + base;
            stage.insert(stage.end(), p, p + bytes);
          }
        } else {
          for (uint64_t e = 0; e < run; ++e) {
            if (stage.size() + esize > kStage) flush();
            uint64_t at = base + e * static_cast<uint64_t>(stride) * esize;
            if (item.map != nullptr) {
              stage.resize(stage.size() + esize);
              item.map->Read(item.archive_offset + at, stage.data() + stage.size() - esize, esize);
              continue;
            }
            const uint8_t* p = item.archive.data() + at;
            stage.insert(stage.end(), p, p + esize);
          }
        }
      });
  flush();
}

}  // namespace

LogicalModel DcpLogicalModel(const Checkpoint& c) {
  LogicalModel m;
  m.description = fmt::format("torch.distributed.checkpoint folder, {} files", c.files.size());
  for (const DataFile& f : c.files) {
    if (f.map) m.inputs.push_back(f.map.get());
  }
  for (const Tensor& t : c.tensors) {
    if (!t.complete) continue;
    LogicalTensor lt{t.fqn, t.dtype, t.dtype, t.shape, t.numel, nullptr};
    lt.read = [&c, &t](uint64_t first, uint64_t count, const SpanSink& sink) {
      ReadRange(c, t, first, count, sink);
    };
    m.tensors.push_back(std::move(lt));
  }
  return m;
}

}  // namespace ckpt::dcp
