#include "rewriters/shrink_plan.h"

#include <algorithm>
#include <span>

#include "base/error.h"
#include "base/perf.h"

namespace ckpt {

namespace {

uint64_t AlignDown(uint64_t v, uint64_t a) {
  return v / a * a;
}
uint64_t AlignUp(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

// An output storage holding bytes [begin, end) of input storage `source`.
PlannedStorage RangeOf(size_t source, uint64_t begin, uint64_t end) {
  PlannedStorage s;
  s.source = static_cast<int32_t>(source);
  s.begin = begin;
  s.end = end;
  return s;
}

std::vector<int64_t> ContiguousStride(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;)
    stride[d - 1] = stride[d] * std::max<int64_t>(shape[d], 1);
  return stride;
}

// Turns components holding exactly one non-contiguous view into gathers of that view.
void Materialize(const torch::Model& m, RewritePlan& rp) {
  std::vector<std::vector<size_t>> members(rp.storages.size());
  for (size_t j = 0; j < m.tensors.size(); ++j) {
    if (m.tensors[j].storage >= 0 && m.tensors[j].numel > 0)
      members[rp.tensor_storage[j]].push_back(j);
  }
  for (int32_t b : rp.bare_storage) members[b].push_back(SIZE_MAX);  // fully used: keep
  for (size_t c = 0; c < rp.storages.size(); ++c) {
    PlannedStorage& s = rp.storages[c];
    if (members[c].size() != 1 || members[c][0] == SIZE_MAX) continue;
    size_t j = members[c][0];
    const torch::Tensor& t = m.tensors[j];
    const torch::Storage& src = m.storages[t.storage];
    uint64_t bytes = t.numel * torch::ElementSize(t.dtype);
    if (src.compressed || bytes >= s.end - s.begin || bytes % torch::ElementSize(src.dtype))
      continue;
    s.gather_tensor = static_cast<int32_t>(j);
    s.gather_bytes = bytes;
    rp.tensor_offset[j] = 0;
    rp.tensor_stride[j] = ContiguousStride(t.shape);
  }
}

// What one more output storage costs, in bytes: its zip local header with the 'FB'
// alignment extra and the worst padding, a zip64 data descriptor, a central directory entry
// with its zip64 extra, and its persistent id in the pickle. Dropping a gap narrower than
// this would make the file bigger, so such gaps are kept.
// `storages` bounds how many output storages there can be (their keys' length).
uint64_t SplitCost(const torch::TorchFile& file, size_t storages) {
  uint64_t name = file.prefix.size() + 6 + std::to_string(storages).size();  // <prefix>/data/<key>
  uint64_t local = 30 + name + 4 + 20 + 63;  // header, 'FB' extra, zip64 extra, padding
  uint64_t central = 46 + name + 28;         // entry and its zip64 extra
  return local + 24 + central + 64;          // + descriptor + persistent id
}

}  // namespace

ShrinkPlan PlanShrink(const torch::TorchFile& file, bool materialize) {
  PerfTimer timer("plan");
  const torch::Model& m = file.model;
  ShrinkPlan plan;
  RewritePlan& rp = plan.rewrite;
  rp.tensor_storage.assign(m.tensors.size(), -1);
  rp.tensor_offset.assign(m.tensors.size(), 0);
  rp.bare_storage.assign(m.bare_refs.size(), -1);
  const uint64_t split_cost = SplitCost(file, m.storages.size() + m.tensors.size());

  // The views of each storage, as one array: those of storage si are
  // view_list[view_start[si] .. view_start[si + 1]) (a vector per storage would cost ~50
  // bytes per storage more, and a file of 10^5 tensors often has as many storages).
  if (m.tensors.size() >= UINT32_MAX)
    Fail("{} tensors: more than this tool plans", m.tensors.size());
  std::vector<uint32_t> view_start(m.storages.size() + 1, 0), view_list(m.tensors.size());
  for (const torch::Tensor& t : m.tensors) {
    if (t.storage >= 0) view_start[t.storage + 1]++;
  }
  for (size_t si = 0; si < m.storages.size(); ++si) view_start[si + 1] += view_start[si];
  {
    std::vector<uint32_t> fill(view_start.begin(), view_start.end() - 1);
    for (size_t j = 0; j < m.tensors.size(); ++j) {
      if (m.tensors[j].storage >= 0)
        view_list[fill[m.tensors[j].storage]++] = static_cast<uint32_t>(j);
    }
  }
  auto views_of = [&](size_t si) {
    return std::span<const uint32_t>(view_list.data() + view_start[si],
                                     view_start[si + 1] - view_start[si]);
  };
  rp.storages.reserve(m.storages.size());
  std::vector<int32_t> first_part(m.storages.size(), -1);
  for (size_t si = 0; si < m.storages.size(); ++si) {
    const torch::Storage& s = m.storages[si];
    uint64_t es = torch::ElementSize(s.dtype);
    // [begin, end, widest element size among its views]
    struct Range {
      uint64_t begin, end, align;
    };
    std::vector<Range> ranges;
    if (s.used_whole) ranges.push_back({0, s.nbytes, es});
    for (size_t j : views_of(si)) {
      const torch::Tensor& t = m.tensors[j];
      if (t.numel > 0) ranges.push_back({t.byte_begin, t.byte_end, torch::ElementSize(t.dtype)});
    }
    std::sort(ranges.begin(), ranges.end(),
              [](const Range& a, const Range& b) { return a.begin < b.begin; });
    // Ranges join into components unless the gap between them is worth a storage of its
    // own. Components start on a multiple of every element size they hold and end on a
    // whole element of the storage's type; one whose aligned start would reach back into
    // the previous component joins it.
    size_t first = rp.storages.size();
    std::vector<uint64_t> align;  // per component of this storage
    for (const Range& r : ranges) {
      if (rp.storages.size() > first) {
        PlannedStorage& last = rp.storages.back();
        uint64_t a = std::max(align.back(), r.align);
        bool join = r.begin <= last.end || r.begin - last.end <= split_cost ||
                    AlignDown(r.begin, std::max(es, r.align)) < AlignUp(last.end, es);
        if (join) {
          last.end = std::max(last.end, r.end);
          align.back() = a;
          continue;
        }
      }
      rp.storages.push_back(RangeOf(si, r.begin, r.end));
      align.push_back(std::max(es, r.align));
    }
    for (size_t c = first; c < rp.storages.size(); ++c) {
      rp.storages[c].begin = AlignDown(rp.storages[c].begin, align[c - first]);
      rp.storages[c].end = std::min(AlignUp(rp.storages[c].end, es), s.nbytes);
      if (c > first && rp.storages[c].begin < rp.storages[c - 1].end) {
        Fail("internal: shrink components of storage '{}' overlap", s.key);
      }
    }
    if (rp.storages.size() == first) {
      // Only empty views (or none reachable): keep an empty storage for them.
      rp.storages.push_back(RangeOf(si, 0, 0));
    }
    first_part[si] = static_cast<int32_t>(first);
    bool whole = rp.storages.size() == first + 1 && rp.storages[first].begin == 0 &&
                 rp.storages[first].end == s.nbytes;
    if (!whole) plan.changes = true;
    for (size_t c = first; c < rp.storages.size(); ++c) {
      plan.kept_bytes += rp.storages[c].end - rp.storages[c].begin;
    }
    plan.dropped_bytes += s.nbytes;
    // Each view lands in the last component starting at or before it.
    auto parts_begin = rp.storages.begin() + static_cast<std::ptrdiff_t>(first);
    for (size_t j : views_of(si)) {
      const torch::Tensor& t = m.tensors[j];
      size_t c = first;
      if (t.numel > 0) {
        auto after =
            std::upper_bound(parts_begin, rp.storages.end(), t.byte_begin,
                             [](uint64_t v, const PlannedStorage& o) { return v < o.begin; });
        if (after != parts_begin) c = static_cast<size_t>(after - rp.storages.begin()) - 1;
      }
      rp.tensor_storage[j] = static_cast<int32_t>(c);
      if (t.numel > 0) {
        uint64_t delta = t.byte_begin - rp.storages[c].begin;
        uint64_t tes = torch::ElementSize(t.dtype);
        if (t.byte_begin < rp.storages[c].begin || delta % tes != 0 ||
            t.byte_end > rp.storages[c].end) {
          Fail("internal: tensor '{}' does not fit its planned storage", t.names[0]);
        }
        rp.tensor_offset[j] = static_cast<int64_t>(delta / tes);
      }
    }
  }
  for (size_t k = 0; k < m.bare_refs.size(); ++k)
    rp.bare_storage[k] = first_part[m.bare_refs[k].second];
  if (materialize) {
    rp.tensor_stride.assign(m.tensors.size(), {});
    Materialize(m, rp);
    plan.kept_bytes = 0;
    for (const PlannedStorage& o : rp.storages) {
      plan.kept_bytes += o.size();
      if (o.gather_tensor >= 0) plan.changes = true;
    }
  }
  plan.dropped_bytes -= plan.kept_bytes;
  // Records under data/ that the pickle never names are dead bytes too.
  for (const std::string& r : file.records) {
    if (r.rfind(file.prefix + "/data/", 0) == 0) plan.changes = true;
  }
  return plan;
}

}  // namespace ckpt
