#include <fmt/format.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "base/checked.h"
#include "base/error.h"
#include "dcp/dcp_parts.h"
#include "torch/torch_file.h"

namespace ckpt::dcp {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kObjectSlack = uint64_t{1} << 30;   // a decompressed BYTE_IO item at most
constexpr uint64_t kTensorSlack = uint64_t{16} << 20;  // archive bytes beyond a chunk's data

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

}  // namespace

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
    item.scan = torch::ScanPickle(m.graph, c.trust);
    item.scan.accepted = {};  // what ckptool.load needs, not the folder's readers
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

}  // namespace ckpt::dcp
