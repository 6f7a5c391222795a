#include "dcp/dcp_checkpoint.h"

#include <fmt/format.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "base/checked.h"
#include "base/error.h"
#include "base/human.h"
#include "base/names.h"
#include "io/parallel.h"
#include "io/range_stream.h"
#include "torch/torch_file.h"

namespace ckpt::dcp {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxCells = uint64_t{1} << 22;      // grid cells per tensor
constexpr uint64_t kObjectSlack = uint64_t{1} << 30;   // a decompressed BYTE_IO item at most
constexpr uint64_t kTensorSlack = uint64_t{16} << 20;  // archive bytes beyond a chunk's data

void AddProblem(Checkpoint& c, std::string where, std::string what) {
  c.problems.push_back({std::move(where), std::move(what)});
}

std::string OffsetsText(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

std::string KeyOf(const std::string& fqn, const std::vector<int64_t>& offsets) {
  std::string k = fqn;
  k.push_back('\0');
  for (int64_t o : offsets) k += std::to_string(o) + ",";
  return k;
}

// Does `path` stay inside the folder (relative, no "..")?
bool SafeRelativePath(const std::string& path) {
  if (path.empty() || path[0] == '/' || path.find('\0') != std::string::npos) return false;
  for (const auto& part : fs::path(path)) {
    if (part == "..") return false;
  }
  return true;
}

// Decompresses a zstd stream (at most `limit` bytes) into `memory`, or, once it outgrows
// kInMemory or the checkpoint's remaining `budget`, into an unlinked temp file (TMPDIR),
// mapped and returned.
std::unique_ptr<MappedFile> Unzstd(Bytes in, uint64_t limit, uint64_t& budget,
                                   std::vector<uint8_t>& memory) {
  constexpr uint64_t kInMemory = 4 << 20;
  std::unique_ptr<ZSTD_DStream, size_t (*)(ZSTD_DStream*)> ds(ZSTD_createDStream(),
                                                              ZSTD_freeDStream);
  if (!ds) Fail("out of memory for zstd");
  ZSTD_initDStream(ds.get());
  std::vector<uint8_t> buf(ZSTD_DStreamOutSize());
  ZSTD_inBuffer input{in.data(), in.size(), 0};
  std::string tmpl;
  int fd = -1;
  struct Closer {
    int& fd;
    std::string& path;
    ~Closer() {
      if (fd >= 0) {
        ::close(fd);
        ::unlink(path.c_str());
      }
    }
  } closer{fd, tmpl};
  auto spill = [&](const uint8_t* data, size_t n) {
    for (size_t done = 0; done < n;) {
      ssize_t w = ::write(fd, data + done, n - done);
      if (w < 0) Fail("writing the decompressed item: {}", std::strerror(errno));
      done += static_cast<size_t>(w);
    }
  };
  uint64_t total = 0;
  size_t last = 1;
  memory.clear();
  while (input.pos < input.size || last != 0) {
    ZSTD_outBuffer out{buf.data(), buf.size(), 0};
    size_t before = input.pos;
    last = ZSTD_decompressStream(ds.get(), &out, &input);
    if (ZSTD_isError(last)) Fail("zstd: {}", ZSTD_getErrorName(last));
    total += out.pos;
    if (total > limit) Fail("decompresses to more than {} bytes", limit);
    if (fd < 0 && (total > kInMemory || total > budget)) {
      tmpl = (fs::temp_directory_path() / "ckptool-dcp-XXXXXX").string();
      fd = mkstemp(tmpl.data());
      if (fd < 0)
        Fail("cannot create a temp file in {}: {}", fs::temp_directory_path().string(),
             std::strerror(errno));
      spill(memory.data(), memory.size());
      memory.clear();
      memory.shrink_to_fit();
    }
    if (fd >= 0) {
      spill(buf.data(), out.pos);
    } else {
      memory.insert(memory.end(), buf.data(), buf.data() + out.pos);
    }
    if (input.pos == input.size && out.pos == 0 && input.pos == before) {
      if (last != 0) Fail("zstd: the stream ends early");
      break;
    }
  }
  if (fd < 0) {
    budget -= memory.size();
    return nullptr;
  }
  return std::make_unique<MappedFile>(MappedFile::Open(tmpl));
}

// The item's archive: its bytes, decompressed when transformed.
void OpenArchive(Checkpoint& c, Item& item, const StorageEntry& s, uint64_t limit) {
  DataFile& f = c.files[static_cast<size_t>(item.file)];
  Bytes raw = f.bytes.subspan(s.offset, s.length);
  if (s.transforms.empty()) {
    item.archive = raw;
    item.map = f.map.get();
    item.archive_offset = s.offset;
    return;
  }
  if (s.transforms.size() != 1)
    Fail("{} stream transforms; ckptool reads one (stream.zstd/1)", s.transforms.size());
  const std::string& t = s.transforms[0];
  auto slash = t.find('/');
  std::string name = t.substr(0, slash);
  std::string version = slash == std::string::npos ? "" : t.substr(slash + 1);
  if (name != "stream.zstd" || version.substr(0, version.find('.')) != "1")
    Fail("unsupported stream transform '{}' (ckptool reads stream.zstd/1)", t);
  item.decompressed = Unzstd(raw, limit, c.in_memory_budget, item.inflated);
  item.archive = item.decompressed ? item.decompressed->bytes()
                                   : Bytes(item.inflated.data(), item.inflated.size());
  item.map = item.decompressed.get();
  item.archive_offset = 0;
}

// Reads one item's archive and what it holds.
void ReadItem(Checkpoint& c, Item& item, const EntryMeta* meta, const ChunkMeta* chunk) {
  const StorageEntry& s = c.meta.storage[item.entry];
  uint64_t limit = kObjectSlack;
  if (chunk != nullptr) {
    uint64_t n = 1;
    for (int64_t d : chunk->sizes) n = CheckedMul(n, static_cast<uint64_t>(d));
    limit = CheckedAdd(CheckedMul(n, torch::ElementSize(meta->dtype)), kTensorSlack);
  }
  OpenArchive(c, item, s, limit);
  torch::TorchFile tf = torch::ReadTorchZip(item.archive);
  if (tf.byteorder != "little") Fail("the item was saved {}-endian", tf.byteorder);
  const torch::Model& m = tf.model;
  if (!m.problems.empty()) Fail("{}: {}", m.problems[0].where, m.problems[0].what);
  if (chunk == nullptr) {  // BYTE_IO: a torch.save'd object
    item.scan = torch::ScanPickle(m.graph);
    for (const torch::Storage& st : m.storages) item.tensor_bytes += st.nbytes;
    item.readable = true;
    return;
  }
  if (m.tensors.size() != 1 || m.tensors[0].node != m.graph.root)
    Fail("the item is not one tensor ({} tensors)", m.tensors.size());
  const torch::Tensor& t = m.tensors[0];
  if (t.storage < 0) Fail("the item's tensor has no storage");
  const torch::Storage& st = m.storages[t.storage];
  if (!st.present || st.compressed) Fail("the item's storage record is missing or compressed");
  item.dtype = t.dtype;
  item.shape = t.shape;
  item.stride = t.stride;
  item.data = st.data_offset + static_cast<uint64_t>(t.offset) * torch::ElementSize(t.dtype);
  if (t.dtype != meta->dtype)
    Fail("the item holds {}, the metadata says {}", torch::Name(t.dtype), torch::Name(meta->dtype));
  if (t.shape != chunk->sizes)
    Fail("the item's shape is {}, the chunk's {}", OffsetsText(t.shape), OffsetsText(chunk->sizes));
  if (t.numel > 0 && (st.data_offset + t.byte_begin != item.data || t.byte_end > st.nbytes))
    Fail("the item's tensor reaches outside its storage");
  for (int64_t x : t.stride) {
    if (x < 0) Fail("the item's tensor has a negative stride");
  }
  item.readable = true;
}

}  // namespace

void ItemPages::Read(const Item& item) {
  if (item.file < 0 || item.map == nullptr) return;
  const MappedFile* file = c_.files[static_cast<size_t>(item.file)].map.get();
  if (item.map != file) {  // decompressed into a temp file of its own
    item.map->Release(0, item.map->size());
    return;
  }
  file->Release(item.archive_offset, item.archive.size());
  if (++reads_[static_cast<size_t>(item.file)] % kItemsPerSweep == 0)
    file->Release(0, file->size());
}

namespace {

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

// Merges per-rank metadata files into one view (writers without collectives): entries by
// fqn, chunks by (offsets, sizes), in one pass over all of them.
class MetadataMerger {
 public:
  explicit MetadataMerger(Metadata& into) : into_(into) {
    for (size_t i = 0; i < into_.entries.size(); ++i) Index(i);
  }

  void Add(Metadata from, const std::string& name) {
    for (EntryMeta& e : from.entries) {
      auto it = by_fqn_.find(e.fqn);
      if (it == by_fqn_.end()) {
        into_.entries.push_back(std::move(e));
        Index(into_.entries.size() - 1);
        continue;
      }
      EntryMeta& x = into_.entries[it->second];
      if (x.bytes != e.bytes || x.dtype != e.dtype || x.shape != e.shape)
        Fail("{}: '{}' is described differently than by the metadata files before it", name, e.fqn);
      for (ChunkMeta& cm : e.chunks) {
        if (chunks_.insert(ChunkKey(e.fqn, cm)).second) x.chunks.push_back(std::move(cm));
      }
    }
    for (StorageEntry& st : from.storage) {
      st.info = pickle::kNil;  // not in `into`'s graph
      into_.storage.push_back(std::move(st));
    }
    into_.scan.findings.insert(into_.scan.findings.end(), from.scan.findings.begin(),
                               from.scan.findings.end());
    into_.scan.names.insert(into_.scan.names.end(), from.scan.names.begin(), from.scan.names.end());
  }

 private:
  static std::string ChunkKey(const std::string& fqn, const ChunkMeta& cm) {
    return KeyOf(fqn, cm.offsets) + "/" + KeyOf("", cm.sizes);
  }
  void Index(size_t i) {
    const EntryMeta& e = into_.entries[i];
    by_fqn_.emplace(e.fqn, i);
    for (const ChunkMeta& cm : e.chunks) chunks_.insert(ChunkKey(e.fqn, cm));
  }

  Metadata& into_;
  std::unordered_map<std::string, size_t> by_fqn_;
  std::unordered_set<std::string> chunks_;
};

std::vector<std::string> MetadataFiles(const std::string& folder) {
  std::vector<std::string> out;
  std::error_code ec;
  if (fs::is_regular_file(fs::path(folder) / ".metadata", ec)) return {".metadata"};
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    std::string n = e.path().filename().string();
    if (n.starts_with("__") && n.ends_with(".metadata") && e.is_regular_file(ec)) out.push_back(n);
  }
  std::sort(out.begin(), out.end(), DigitAwareLess);
  return out;
}

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
// are copied from the mapping one by one. A backed file (a .ckz archive read in place, whose
// tensor bytes are not on disk) is read through MappedFile::Read instead of preadv.
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
      if (map.backed()) {  // a .ckz archive read in place: its bytes are not on disk
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
            if (item.map != nullptr && item.map->backed()) {
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

bool LooksLikeDcpCheckpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec) || MetadataFiles(path).empty()) return false;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    if (e.path().extension() == ".distcp") return true;
  }
  return false;
}

bool IsDcpPart(const std::string& path) {
  fs::path p(path);
  std::string n = p.filename().string();
  return p.extension() == ".distcp" || n == ".metadata" ||
         (n.starts_with("__") && n.ends_with(".metadata"));
}

Checkpoint ReadDcp(Bytes metadata, const std::map<std::string, Bytes>& files) {
  Checkpoint c;
  c.metadata_files = {".metadata"};
  c.metadata_bytes = metadata.size();
  c.meta = WithContext(".metadata", [&] { return ParseMetadata(metadata); });
  for (const auto& [name, bytes] : files) c.files.push_back({name, nullptr, bytes, 0, 0});
  Resolve(c);
  return c;
}

namespace {

// The metadata files of `folder` read and merged into c.meta (names and bytes recorded).
void ReadMetadataInto(const std::string& folder, Checkpoint& c) {
  c.metadata_files = MetadataFiles(folder);
  if (c.metadata_files.empty())
    Fail("no .metadata file: not a torch.distributed.checkpoint folder");
  std::optional<MetadataMerger> merger;
  for (size_t i = 0; i < c.metadata_files.size(); ++i) {
    const std::string& name = c.metadata_files[i];
    MappedFile m = MappedFile::Open((fs::path(folder) / name).string());
    c.metadata_bytes += m.size();
    Metadata md = WithContext(name, [&] { return ParseMetadata(m.bytes()); });
    if (i == 0) {
      c.meta = std::move(md);
      // Indexes every entry and chunk: only worth it when there is something to merge.
      if (c.metadata_files.size() > 1) merger.emplace(c.meta);
    } else {
      merger->Add(std::move(md), name);
    }
  }
}

}  // namespace

Metadata ReadFolderMetadata(const std::string& folder) {
  return WithContext(folder, [&] {
    Checkpoint c;
    ReadMetadataInto(folder, c);
    return std::move(c.meta);
  });
}

Checkpoint OpenDcp(const std::string& folder) {
  return WithContext(folder, [&] {
    Checkpoint c;
    c.folder = folder;
    ReadMetadataInto(folder, c);
    std::vector<std::string> paths;
    for (const StorageEntry& s : c.meta.storage) paths.push_back(s.path);
    std::sort(paths.begin(), paths.end(), DigitAwareLess);
    paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
    for (const std::string& p : paths) {
      if (!SafeRelativePath(p))
        Fail("storage_data names the file '{}', which is outside the folder", p);
      std::string full = (fs::path(folder) / p).string();
      std::error_code ec;
      if (!fs::is_regular_file(full, ec)) continue;  // Resolve reports it with its tensors
      auto map = std::make_unique<MappedFile>(MappedFile::Open(full));
      Bytes b = map->bytes();
      c.files.push_back({p, std::move(map), b, 0, 0});
    }
    Resolve(c);
    return c;
  });
}

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
