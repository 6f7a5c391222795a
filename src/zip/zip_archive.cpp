#include "zip/zip_archive.h"

#include <zlib.h>

#include <algorithm>
#include <memory>

#include "base/checked.h"

namespace ckpt::zip {

namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50;
constexpr uint32_t kLocator64Sig = 0x07064b50;
constexpr uint32_t kDescriptorSig = 0x08074b50;
constexpr uint64_t kEndSize = 22;
constexpr uint64_t kLocatorSize = 20;
constexpr uint64_t kEnd64MinSize = 56;
constexpr uint64_t kCentralMinSize = 46;
constexpr uint64_t kLocalMinSize = 30;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint16_t kFlagEncrypted = 0x0001;
// Also refused by miniz (torch's zip reader): patched data, strong encryption, masked headers.
constexpr uint16_t kFlagsUnsupported = 0x0020 | 0x0040 | 0x2000;
constexpr uint32_t kDosDirectoryAttribute = 0x10;
constexpr uint16_t kFlagDescriptor = 0x0008;

struct EndRecord {
  uint64_t offset = 0;  // where the end records start (zip64 end record if present)
  uint64_t size = 0;    // bytes up to the end of the file
  uint64_t entry_count = 0;
  uint64_t cd_offset = 0;
  uint64_t cd_size = 0;
};

// Finds the last end-of-central-directory record whose comment reaches exactly to the end
// of the file (a comment may itself contain the signature).
uint64_t FindEndRecord(Bytes file) {
  if (file.size() < kEndSize) Fail("not a zip file: only {} bytes", file.size());
  uint64_t lowest = file.size() > kEndSize + 0xFFFF ? file.size() - kEndSize - 0xFFFF : 0;
  for (uint64_t pos = file.size() - kEndSize + 1; pos-- > lowest;) {
    if (LoadLE<uint32_t>(file.data() + pos) != kEndSig) continue;
    uint16_t comment = LoadLE<uint16_t>(file.data() + pos + 20);
    if (pos + kEndSize + comment == file.size()) return pos;
  }
  Fail("not a zip file: no end-of-central-directory record");
}

EndRecord ReadEndRecords(Bytes file) {
  uint64_t eocd = FindEndRecord(file);
  ByteCursor c(Slice(file, eocd, kEndSize), eocd);
  c.Skip(4);
  uint16_t disk = c.ReadLE<uint16_t>();
  uint16_t cd_disk = c.ReadLE<uint16_t>();
  uint16_t n_disk = c.ReadLE<uint16_t>();
  uint16_t n_total = c.ReadLE<uint16_t>();
  uint32_t cd_size = c.ReadLE<uint32_t>();
  uint32_t cd_offset = c.ReadLE<uint32_t>();

  EndRecord end;
  end.offset = eocd;
  end.size = file.size() - eocd;
  end.entry_count = n_total;
  end.cd_size = cd_size;
  end.cd_offset = cd_offset;

  bool has_locator =
      eocd >= kLocatorSize && LoadLE<uint32_t>(file.data() + eocd - kLocatorSize) == kLocator64Sig;
  if (has_locator) {
    ByteCursor loc(Slice(file, eocd - kLocatorSize, kLocatorSize), eocd - kLocatorSize);
    loc.Skip(4);
    uint32_t end64_disk = loc.ReadLE<uint32_t>();
    uint64_t end64_offset = loc.ReadLE<uint64_t>();
    uint32_t disks = loc.ReadLE<uint32_t>();
    if (end64_disk != 0 || disks != 1) Fail("multi-disk zip archives are not supported");
    if (end64_offset > eocd - kLocatorSize || eocd - kLocatorSize - end64_offset < kEnd64MinSize) {
      Fail("zip64 end record offset {} is out of bounds", end64_offset);
    }
    ByteCursor z(Slice(file, end64_offset, eocd - kLocatorSize - end64_offset), end64_offset);
    if (z.ReadLE<uint32_t>() != kEnd64Sig) Fail("bad zip64 end record signature");
    z.Skip(8 + 2 + 2);  // record size, made by, version needed
    uint32_t disk64 = z.ReadLE<uint32_t>();
    uint32_t cd_disk64 = z.ReadLE<uint32_t>();
    uint64_t n_disk64 = z.ReadLE<uint64_t>();
    uint64_t n_total64 = z.ReadLE<uint64_t>();
    end.cd_size = z.ReadLE<uint64_t>();
    end.cd_offset = z.ReadLE<uint64_t>();
    if (disk64 != 0 || cd_disk64 != 0 || n_disk64 != n_total64) {
      Fail("multi-disk zip archives are not supported");
    }
    end.entry_count = n_total64;
    end.offset = end64_offset;
    end.size = file.size() - end64_offset;
  } else {
    if (disk != 0 || cd_disk != 0 || n_disk != n_total) {
      Fail("multi-disk zip archives are not supported");
    }
    if (n_total == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
      Fail("zip64 end record locator is missing");
    }
  }
  if (end.cd_offset > end.offset || end.cd_size > end.offset - end.cd_offset) {
    Fail("central directory [{}, +{}) does not fit before the end record at {}", end.cd_offset,
         end.cd_size, end.offset);
  }
  if (end.entry_count > end.cd_size / kCentralMinSize) {
    Fail("end record claims {} entries but the central directory has room for at most {}",
         end.entry_count, end.cd_size / kCentralMinSize);
  }
  if (end.entry_count >= NameIndex::kNone)
    Fail("{} records: more than this tool reads", end.entry_count);
  return end;
}

// Applies the zip64 extra field (id 1) of a central entry to the fields saturated at 0xFFFFFFFF.
void ApplyZip64Extra(Bytes extra, Entry& e, bool need_size, bool need_csize, bool need_offset) {
  ByteCursor c(extra);
  while (c.remaining() >= 4) {
    uint16_t id = c.ReadLE<uint16_t>();
    uint16_t len = c.ReadLE<uint16_t>();
    Bytes body = c.Read(len);
    if (id != kZip64ExtraId) continue;
    ByteCursor z(body);
    if (need_size) e.size = z.ReadLE<uint64_t>();
    if (need_csize) e.compressed_size = z.ReadLE<uint64_t>();
    if (need_offset) e.header_offset = z.ReadLE<uint64_t>();
    return;
  }
  if (need_size || need_csize || need_offset) Fail("zip64 extra field is missing");
}

Entry ReadCentralEntry(ByteCursor& c) {
  uint64_t at = c.file_pos();
  if (c.ReadLE<uint32_t>() != kCentralSig) {
    Fail("bad central directory signature at offset {}", at);
  }
  c.Skip(2 + 2);  // made by, version needed
  Entry e;
  e.flags = c.ReadLE<uint16_t>();
  uint16_t method = c.ReadLE<uint16_t>();
  c.Skip(2 + 2);  // time, date
  e.crc32 = c.ReadLE<uint32_t>();
  uint32_t csize = c.ReadLE<uint32_t>();
  uint32_t size = c.ReadLE<uint32_t>();
  uint16_t name_len = c.ReadLE<uint16_t>();
  uint16_t extra_len = c.ReadLE<uint16_t>();
  uint16_t comment_len = c.ReadLE<uint16_t>();
  uint16_t disk = c.ReadLE<uint16_t>();
  c.Skip(2);  // internal attributes
  uint32_t external = c.ReadLE<uint32_t>();
  uint32_t offset = c.ReadLE<uint32_t>();
  e.name = std::string(c.ReadText(name_len));
  Bytes extra = c.Read(extra_len);
  c.Skip(comment_len);

  e.compressed_size = csize;
  e.size = size;
  e.header_offset = offset;
  WithContext(fmt::format("record '{}'", e.name), [&] {
    ApplyZip64Extra(extra, e, size == 0xFFFFFFFF, csize == 0xFFFFFFFF, offset == 0xFFFFFFFF);
    if (e.flags & kFlagEncrypted) Fail("encrypted records are not supported");
    if (e.flags & kFlagsUnsupported) Fail("unsupported record flags 0x{:04x}", e.flags);
    if (disk != 0) Fail("starts on disk {}: multi-disk zip archives are not supported", disk);
    // miniz takes such a record for a folder and reads no data from it: torch.load would
    // return whatever memory held.
    if ((external & kDosDirectoryAttribute) || e.name.ends_with('/')) {
      Fail("record is marked as a folder; torch would read no data from it");
    }
    if (method != 0 && method != 8) Fail("unsupported compression method {}", method);
    e.method = static_cast<Method>(method);
    if (e.method == Method::kStored && e.compressed_size != e.size) {
      Fail("stored record has compressed size {} != size {}", e.compressed_size, e.size);
    }
    if (e.name.empty()) Fail("empty record name");
  });
  return e;
}

// Reads the local header of `e`, fixing its data offset, and finds its data descriptor.
void ReadLocalHeader(Bytes file, uint64_t limit, Entry& e) {
  WithContext(fmt::format("record '{}'", e.name), [&] {
    if (e.header_offset > limit || limit - e.header_offset < kLocalMinSize) {
      Fail("local header offset {} is outside the record area", e.header_offset);
    }
    ByteCursor c(Slice(file, e.header_offset, limit - e.header_offset), e.header_offset);
    if (c.ReadLE<uint32_t>() != kLocalSig) {
      Fail("bad local header signature at offset {}", e.header_offset);
    }
    c.Skip(2 + 2 + 2 + 2 + 2 + 4 + 4 + 4);
    uint16_t name_len = c.ReadLE<uint16_t>();
    uint16_t extra_len = c.ReadLE<uint16_t>();
    if (c.ReadText(name_len) != e.name) Fail("local header name differs from the directory");
    c.Skip(extra_len);
    e.header_size = kLocalMinSize + name_len;
    e.extra_size = extra_len;
    e.data_offset = c.file_pos();
    if (e.compressed_size > limit - e.data_offset) {
      Fail("data [{}, +{}) runs past the record area (ends at {})", e.data_offset,
           e.compressed_size, limit);
    }
    uint64_t end = e.data_end();
    if ((e.flags & kFlagDescriptor) && limit - end >= 16 &&
        LoadLE<uint32_t>(file.data() + end) == kDescriptorSig) {
      bool zip64 =
          e.size >= 0xFFFFFFFF || e.compressed_size >= 0xFFFFFFFF || e.header_offset >= 0xFFFFFFFF;
      e.descriptor_size = zip64 && limit - end >= 24 ? 24 : 16;
    }
  });
}

}  // namespace

Archive Archive::Parse(Bytes file) {
  EndRecord end = ReadEndRecords(file);
  Archive a;
  a.cd_offset_ = end.cd_offset;
  a.cd_size_ = end.cd_size;
  a.end_offset_ = end.offset;
  a.end_size_ = end.size;

  ByteCursor c(Slice(file, end.cd_offset, end.cd_size), end.cd_offset);
  a.entries_.reserve(end.entry_count);
  for (uint64_t i = 0; i < end.entry_count; ++i) {
    a.entries_.push_back(ReadCentralEntry(c));
  }
  a.by_name_.Reserve(a.entries_.size());
  auto name_of = [&a](uint32_t i) -> std::string_view { return a.entries_[i].name; };
  for (size_t i = 0; i < a.entries_.size(); ++i) {
    Entry& e = a.entries_[i];
    if (a.by_name_.Insert(e.name, static_cast<uint32_t>(i), name_of) != i)
      Fail("duplicate record name '{}'", e.name);
    ReadLocalHeader(file, end.cd_offset, e);
  }

  // No two records may share bytes (a classic zip-bomb and parser-confusion trick).
  std::vector<const Entry*> order;
  for (const Entry& e : a.entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](const Entry* x, const Entry* y) { return x->header_offset < y->header_offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    if (order[i]->header_offset < order[i - 1]->data_end()) {
      Fail("record '{}' overlaps record '{}'", order[i]->name, order[i - 1]->name);
    }
    // A descriptor we guessed must not run into the next record.
    Entry* prev = const_cast<Entry*>(order[i - 1]);
    if (prev->end() > order[i]->header_offset) prev->descriptor_size = 0;
  }
  return a;
}

const Entry* Archive::Find(std::string_view name) const {
  uint32_t i =
      by_name_.Find(name, [this](uint32_t k) -> std::string_view { return entries_[k].name; });
  return i == NameIndex::kNone ? nullptr : &entries_[i];
}

Bytes RawData(Bytes file, const Entry& entry) {
  return Slice(file, entry.data_offset, entry.compressed_size);
}

void StreamRecord(Bytes file, const Entry& entry, const std::function<void(Bytes)>& sink) {
  Bytes raw = RawData(file, entry);
  if (entry.method == Method::kStored) {
    constexpr uint64_t kChunk = 8 << 20;
    for (uint64_t off = 0; off < raw.size(); off += kChunk) {
      sink(raw.subspan(off, std::min<uint64_t>(kChunk, raw.size() - off)));
    }
    return;
  }
  z_stream zs{};
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) Fail("record '{}': inflateInit failed", entry.name);
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, inflateEnd);
  constexpr size_t kOut = 1 << 20;
  auto out = std::make_unique<uint8_t[]>(kOut);
  uint64_t consumed = 0;
  uint64_t produced = 0;
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    if (zs.avail_in == 0) {
      uint64_t n = std::min<uint64_t>(raw.size() - consumed, 1u << 30);
      zs.next_in = const_cast<Bytef*>(raw.data() + consumed);
      zs.avail_in = static_cast<uInt>(n);
      consumed += n;
    }
    zs.next_out = out.get();
    zs.avail_out = kOut;
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      Fail("record '{}': corrupt deflate data ({})", entry.name, zs.msg ? zs.msg : "error");
    }
    uint64_t got = kOut - zs.avail_out;
    produced += got;
    if (produced > entry.size) {
      Fail("record '{}': inflates to more than its declared {} bytes", entry.name, entry.size);
    }
    if (got) sink(Bytes(out.get(), got));
    if (rc == Z_OK && got == 0 && zs.avail_in == 0 && consumed == raw.size()) {
      Fail("record '{}': deflate data ends early", entry.name);
    }
  }
  if (produced != entry.size) {
    Fail("record '{}': inflates to {} bytes, directory says {}", entry.name, produced, entry.size);
  }
}

std::string ReadRecord(Bytes file, const Entry& entry, uint64_t max_size) {
  if (entry.size > max_size) {
    Fail("record '{}' is {} bytes, over the limit of {}", entry.name, entry.size, max_size);
  }
  std::string out;
  if (entry.method == Method::kStored) {
    Bytes raw = RawData(file, entry);
    out.assign(reinterpret_cast<const char*>(raw.data()), raw.size());
    return out;
  }
  // Grow as we inflate rather than trusting the declared size up front.
  StreamRecord(file, entry, [&](Bytes chunk) { out.append(AsText(chunk)); });
  return out;
}

}  // namespace ckpt::zip
