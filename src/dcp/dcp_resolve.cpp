#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "base/checked.h"
#include "base/error.h"
#include "dcp/dcp_parts.h"
#include "io/parallel.h"

namespace ckpt::dcp {

namespace {

constexpr uint64_t kMaxCells = uint64_t{1} << 22;  // grid cells per tensor

void AddProblem(Checkpoint& c, std::string where, std::string what) {
  c.problems.push_back({std::move(where), std::move(what)});
}

// Cuts the tensor into the grid of its chunks' boundaries and checks that the chunks tile it.
void BuildGrid(Checkpoint& c, Tensor& t) {
  const size_t dims = t.shape.size();
  t.cuts.assign(dims, {});
  for (size_t d = 0; d < dims; ++d) {
    auto& cuts = t.cuts[d];
    cuts = {0, t.shape[d]};
    for (const Chunk& ch : t.chunks) {
      cuts.push_back(ch.meta.offsets[d]);
      cuts.push_back(ch.meta.offsets[d] + ch.meta.sizes[d]);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  }
  uint64_t cells = 1;
  for (const auto& cuts : t.cuts) {
    cells = CheckedMul(cells, static_cast<uint64_t>(cuts.size() - 1));
    if (cells > kMaxCells) {
      AddProblem(
          c, t.fqn,
          fmt::format("its {} chunks cut it into more than {} pieces", t.chunks.size(), kMaxCells));
      return;
    }
  }
  t.cell_chunk.assign(cells, -1);
  bool ok = true;
  uint64_t marked = 0;
  for (size_t k = 0; k < t.chunks.size() && ok; ++k) {
    const ChunkMeta& m = t.chunks[k].meta;
    bool empty = false;
    for (size_t d = 0; d < dims; ++d) empty = empty || m.sizes[d] == 0;
    if (empty) continue;
    std::vector<size_t> lo(dims), hi(dims), at(dims);
    for (size_t d = 0; d < dims; ++d) {
      const auto& cuts = t.cuts[d];
      lo[d] = static_cast<size_t>(std::lower_bound(cuts.begin(), cuts.end(), m.offsets[d]) -
                                  cuts.begin());
      hi[d] = static_cast<size_t>(
          std::lower_bound(cuts.begin(), cuts.end(), m.offsets[d] + m.sizes[d]) - cuts.begin());
      at[d] = lo[d];
    }
    while (true) {
      uint64_t flat = 0;
      for (size_t d = 0; d < dims; ++d) flat = flat * (t.cuts[d].size() - 1) + at[d];
      if (t.cell_chunk[flat] >= 0) {
        AddProblem(
            c, t.fqn,
            fmt::format("chunks at {} and {} overlap",
                        OffsetsText(t.chunks[static_cast<size_t>(t.cell_chunk[flat])].meta.offsets),
                        OffsetsText(m.offsets)));
        ok = false;
        break;
      }
      t.cell_chunk[flat] = static_cast<int32_t>(k);
      ++marked;
      size_t d = dims;
      while (d > 0 && ++at[d - 1] == hi[d - 1]) {
        at[d - 1] = lo[d - 1];
        --d;
      }
      if (d == 0) break;
    }
  }
  if (!ok) return;
  if (marked != cells) {
    // Name the first hole: the first cell no chunk covers.
    uint64_t flat = static_cast<uint64_t>(std::find(t.cell_chunk.begin(), t.cell_chunk.end(), -1) -
                                          t.cell_chunk.begin());
    std::vector<int64_t> where(dims);
    for (size_t d = dims; d-- > 0;) {
      uint64_t n = t.cuts[d].size() - 1;
      where[d] = t.cuts[d][flat % n];
      flat /= n;
    }
    AddProblem(c, t.fqn,
               fmt::format("no chunk covers the elements at {}: the chunks leave a hole",
                           OffsetsText(where)));
    return;
  }
  t.complete = true;
}

// Do the tensor's elements, and its bytes, fit in 64 bits?
bool ShapeFits(const EntryMeta& e) {
  try {
    uint64_t numel = 1;
    for (int64_t d : e.shape) numel = CheckedMul(numel, static_cast<uint64_t>(d));
    CheckedMul(numel, torch::ElementSize(e.dtype));
    return true;
  } catch (const Error&) {
    return false;
  }
}

// What the walk over the entries reads for `e`: its object's item (nullptr), or its chunks'.
std::vector<const ChunkMeta*> ChunksOf(const EntryMeta& e) {
  if (e.bytes) return {nullptr};
  std::vector<const ChunkMeta*> v;
  v.reserve(e.chunks.size());
  for (const ChunkMeta& cm : e.chunks) v.push_back(&cm);
  return v;
}

}  // namespace

void Resolve(Checkpoint& c) {
  const Metadata& md = c.meta;
  std::unordered_map<std::string, size_t> file_index;
  for (size_t i = 0; i < c.files.size(); ++i) file_index.emplace(c.files[i].name, i);
  std::unordered_map<std::string, size_t> by_key;  // (fqn, offsets) -> storage entry
  std::vector<std::pair<size_t, size_t>> copies;   // (entry, the first entry of its key)
  c.items.resize(md.storage.size());
  for (size_t i = 0; i < md.storage.size(); ++i) {
    const StorageEntry& s = md.storage[i];
    c.items[i].entry = i;
    auto [k, fresh] = by_key.emplace(KeyOf(s.fqn, s.offsets), i);
    // Per-rank metadata files each list the replicated values their rank wrote: copies.
    if (!fresh) copies.emplace_back(i, k->second);
    auto f = file_index.find(s.path);
    if (f != file_index.end()) c.items[i].file = static_cast<int32_t>(f->second);
  }
  std::vector<bool> used(md.storage.size(), false);
  ItemPages pages(c);
  auto inside = [&](const Item& item) {
    const StorageEntry& s = md.storage[item.entry];
    const Bytes file = c.files[static_cast<size_t>(item.file)].bytes;
    return s.offset <= file.size() && s.length <= file.size() - s.offset;
  };
  // The items are read on every thread first (each a torch.save archive parsed on its own), in
  // the order the walk below asks for them; the walk then takes each outcome, so problems are
  // reported in the same order as when read one by one. An item asked for again (two chunks
  // of one key) or whose bytes are transformed (decompression draws on one shared budget) is
  // read by the walk itself.
  struct EarlyRead {
    const EntryMeta* e = nullptr;
    const ChunkMeta* chunk = nullptr;
    bool taken = false;
    std::optional<std::string> error;
  };
  std::vector<EarlyRead> early(c.items.size());
  {
    std::vector<size_t> order;
    auto ask = [&](size_t i, const EntryMeta& e, const ChunkMeta* chunk) {
      const Item& item = c.items[i];
      if (early[i].e != nullptr || item.file < 0 || !md.storage[i].transforms.empty() ||
          !inside(item))
        return;
      early[i].e = &e;
      early[i].chunk = chunk;
      order.push_back(i);
    };
    for (const EntryMeta& e : md.entries) {
      if (!e.bytes && !ShapeFits(e)) continue;
      for (const ChunkMeta* cm : ChunksOf(e)) {
        auto it = by_key.find(KeyOf(e.fqn, cm ? cm->offsets : std::vector<int64_t>{}));
        if (it != by_key.end()) ask(it->second, e, cm);
      }
    }
    ParallelFor(order.size(), DefaultThreads(), [&](size_t k) {
      EarlyRead& r = early[order[k]];
      Item& item = c.items[order[k]];
      try {
        ReadItem(c, item, r.e, r.chunk);
        pages.Read(item);
      } catch (const Error& err) {
        r.error = err.what();
      }
    });
  }
  auto read = [&](Item& item, const EntryMeta& e, const ChunkMeta* chunk) {
    const StorageEntry& s = md.storage[item.entry];
    auto where = [&] {
      return chunk ? fmt::format("{} chunk {}", e.fqn, OffsetsText(chunk->offsets)) : e.fqn;
    };
    if (item.file < 0) return;  // the missing file is reported once, with what it holds
    DataFile& f = c.files[static_cast<size_t>(item.file)];
    f.items++;
    f.item_bytes += s.length;
    if (!inside(item)) {
      AddProblem(c, where(),
                 fmt::format("its item [{}, {}) of {} lies beyond the end of the file ({} bytes): "
                             "the file is truncated",
                             s.offset, s.offset + s.length, s.path, f.bytes.size()));
      return;
    }
    std::optional<std::string> error;
    EarlyRead& r = early[item.entry];
    if (r.e == &e && r.chunk == chunk && !r.taken) {
      r.taken = true;
      error = std::move(r.error);
    } else {
      try {
        ReadItem(c, item, &e, chunk);
        pages.Read(item);
      } catch (const Error& err) {
        error = err.what();
      }
    }
    if (error)
      AddProblem(c, where(), fmt::format("item at {} of {}: {}", s.offset, s.path, *error));
  };
  for (const EntryMeta& e : md.entries) {
    if (e.bytes) {
      Object o{e.fqn, -1};
      auto it = by_key.find(KeyOf(e.fqn, {}));
      if (it == by_key.end()) {
        AddProblem(c, e.fqn, "no storage_data entry for this object");
      } else {
        o.item = static_cast<int32_t>(it->second);
        used[it->second] = true;
        read(c.items[it->second], e, nullptr);
      }
      c.objects.push_back(std::move(o));
      continue;
    }
    Tensor t;
    t.fqn = e.fqn;
    t.dtype = e.dtype;
    t.shape = e.shape;
    if (!ShapeFits(e)) {
      AddProblem(c, e.fqn, fmt::format("its shape {} is too large", OffsetsText(e.shape)));
      c.tensors.push_back(std::move(t));
      continue;
    }
    t.numel = 1;
    for (int64_t d : e.shape) t.numel *= static_cast<uint64_t>(d);
    bool readable = true;
    for (const ChunkMeta& cm : e.chunks) {
      Chunk ch{cm, -1};
      for (size_t d = 0; d < e.shape.size(); ++d) {
        if (cm.offsets[d] > e.shape[d] || cm.sizes[d] > e.shape[d] - cm.offsets[d]) {
          AddProblem(
              c, e.fqn,
              fmt::format("the chunk at {} of size {} reaches outside its shape {}",
                          OffsetsText(cm.offsets), OffsetsText(cm.sizes), OffsetsText(e.shape)));
          readable = false;
        }
      }
      auto it = by_key.find(KeyOf(e.fqn, cm.offsets));
      if (it == by_key.end()) {
        AddProblem(
            c, e.fqn,
            fmt::format("no storage_data entry for the chunk at {}", OffsetsText(cm.offsets)));
        readable = false;
      } else {
        ch.item = static_cast<int32_t>(it->second);
        used[it->second] = true;
        Item& item = c.items[it->second];
        read(item, e, &cm);
        readable = readable && item.readable;
      }
      t.chunks.push_back(std::move(ch));
    }
    if (readable) BuildGrid(c, t);
    c.tensors.push_back(std::move(t));
  }
  // Copies are read and checked like the first one (verify checks their CRCs too).
  std::unordered_map<std::string, std::pair<const EntryMeta*, const ChunkMeta*>> meta_of;
  for (const EntryMeta& e : md.entries) {
    if (e.bytes) meta_of.emplace(KeyOf(e.fqn, {}), std::make_pair(&e, nullptr));
    for (const ChunkMeta& cm : e.chunks)
      meta_of.emplace(KeyOf(e.fqn, cm.offsets), std::make_pair(&e, &cm));
  }
  for (const auto& [i, first] : copies) {
    if (!used[first]) continue;
    used[i] = true;
    const StorageEntry& s = md.storage[i];
    auto it = meta_of.find(KeyOf(s.fqn, s.offsets));
    if (it != meta_of.end()) read(c.items[i], *it->second.first, it->second.second);
  }
  for (size_t i = 0; i < md.storage.size(); ++i) {
    if (!used[i]) {
      AddProblem(c, md.storage[i].fqn,
                 fmt::format("the item at {} of {} belongs to nothing in state_dict_metadata",
                             md.storage[i].offset, md.storage[i].path));
    }
  }
  // Missing files, with what they take along.
  std::map<std::string, std::vector<std::string>> missing;
  for (const StorageEntry& s : md.storage) {
    if (!file_index.count(s.path)) {
      auto& names = missing[s.path];
      if (names.empty() || names.back() != s.fqn) names.push_back(s.fqn);
    }
  }
  for (auto& [path, names] : missing) {
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    AddProblem(c, path,
               fmt::format("missing; {} tensors and objects lose items with it", names.size()));
    for (const std::string& name : names)
      AddProblem(c, name, fmt::format("its items in {} are missing", path));
  }
  // Every byte of every file belongs to exactly one item.
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> spans(c.files.size());
  for (const Item& item : c.items) {
    if (item.file < 0) continue;
    const StorageEntry& s = md.storage[item.entry];
    spans[static_cast<size_t>(item.file)].emplace_back(s.offset, s.offset + s.length);
  }
  for (size_t fi = 0; fi < c.files.size(); ++fi) {
    auto& v = spans[fi];
    std::sort(v.begin(), v.end());
    uint64_t at = 0, size = c.files[fi].bytes.size();
    for (const auto& [b, e] : v) {
      if (b < at) {
        AddProblem(c, c.files[fi].name, fmt::format("items overlap at byte {}", b));
      } else if (b > at) {
        AddProblem(c, c.files[fi].name,
                   fmt::format("bytes [{}, {}) belong to no item", at, std::min(b, size)));
      }
      at = std::max(at, e);
    }
    if (at < size)
      AddProblem(c, c.files[fi].name, fmt::format("bytes [{}, {}) belong to no item", at, size));
  }
}

}  // namespace ckpt::dcp
