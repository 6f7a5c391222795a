// Zip reader for torch checkpoints: the layout is in zip_archive.h. Which bytes torch reads is
// decided by miniz (pytorch/pytorch third_party/miniz-3.0.2/miniz.c) as caffe2's
// PyTorchStreamReader (caffe2/serialize/inline_container.cc) drives it; each rule below
// reads a file as it does, or refuses one where another reading is possible.
//
// End record (mz_zip_reader_read_central_dir, mz_zip_reader_locate_header_sig):
//   - miniz reads the file backwards in 4096-byte windows, the first from max(size-4096, 0),
//     each scanned from its end, and takes the first PK\x05\x06 it meets at an offset with at
//     least 22 bytes after it: the LAST signature in the file, whatever its comment length.
//     ckptool takes that record.
//   - After a window without one it stops when the window started at offset 0 or 65557
//     (0xFFFF + 22) bytes or more before the end; else the next window starts 4093 bytes
//     lower. That step is computed unsigned (cur_file_ofs - (sizeof(buf_u32) - 3)): from a
//     window starting below offset 4093 the next read is at a huge offset, fails, and miniz
//     finds no archive. So the search reaches 69584 bytes back on a large file, and fewer
//     on some small ones (a 5000-byte file is searched from offset 904 only).
//   - The record's comment must reach exactly to the end of the file (miniz does not look;
//     torch.save writes no comment and nothing after it): other readers may place it.
//   - Any other PK\x05\x06 in that tail (or in the last 65557 bytes, where Python's zipfile
//     looks) that leads to a different central directory which parses (miniz's per-entry
//     checks: signatures, header lengths within the directory, at least one entry) is
//     another reading of the file: refused. Signature bytes met by chance in tensor data
//     lead to no such directory and are not counted.
//   - A zip64 locator (PK\x06\x07) 20 bytes before the end record switches to the zip64
//     end record it points to; miniz then ignores the 32-bit fields.
// Records (mz_zip_reader_locate_file with flags 0, as PyTorchStreamReader::getRecordID calls
// it; mz_zip_locate_file_binary_search, mz_zip_filename_compare, MZ_TOLOWER):
//   - miniz finds a record by a binary search over the names sorted with A-Z folded to a-z:
//     case-insensitive. Find() folds the same way, and two names equal under that folding
//     (archive/DATA.PKL and archive/data.pkl) are refused: which one miniz finds depends on
//     its heap sort.
//   - A NUL byte in a name is refused: torch looks names up with std::string::c_str(), so
//     the folder it takes from entry 0 would be cut there.
//   - The record's data starts at local header + 30 + the LOCAL header's name and extra
//     lengths (mz_zip_reader_extract_to_mem_no_alloc1, getRecordOffset); the local header's
//     name must be the directory's, byte for byte.
//   - miniz refuses the archive when a record declares uncompressed bytes but no compressed
//     ones (decomp_size && !comp_size), or a stored record whose sizes differ.

#include "zip/zip_archive.h"

#include <zlib.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

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

// miniz's mz_zip_reader_locate_header_sig for the end record: where it finds one, or
// nothing; `searched_from` is the lowest offset it read.
struct EndSearch {
  std::optional<uint64_t> found;
  uint64_t searched_from = 0;
};

EndSearch LocateEndRecordAsMiniz(Bytes file) {
  constexpr int64_t kWindow = 4096;
  const int64_t size = static_cast<int64_t>(file.size());
  EndSearch out;
  if (size < static_cast<int64_t>(kEndSize)) return out;
  int64_t cur = std::max<int64_t>(size - kWindow, 0);
  for (;;) {
    int64_t n = std::min<int64_t>(kWindow, size - cur);
    out.searched_from = static_cast<uint64_t>(cur);
    for (int64_t i = n - 4; i >= 0; --i) {
      if (LoadLE<uint32_t>(file.data() + cur + i) == kEndSig &&
          size - (cur + i) >= static_cast<int64_t>(kEndSize)) {
        out.found = static_cast<uint64_t>(cur + i);
        return out;
      }
    }
    if (cur == 0 || size - cur >= 0xFFFF + static_cast<int64_t>(kEndSize)) return out;
    // MZ_MAX(cur_file_ofs - (sizeof(buf_u32) - 3), 0) is computed unsigned: below 4093 the
    // next window starts at a wrapped offset and its read fails.
    if (cur < kWindow - 3) return out;
    cur -= kWindow - 3;
  }
}

// Where miniz would search for the end record if it found none (and Python's zipfile, in
// the last 65557 bytes): an end record anywhere here is one some reader may take.
uint64_t EndSearchStart(Bytes file) {
  uint64_t miniz = 0;
  {
    constexpr uint64_t kWindow = 4096;
    const uint64_t size = file.size();
    uint64_t cur = size > kWindow ? size - kWindow : 0;
    while (cur != 0 && size - cur < 0xFFFF + kEndSize && cur >= kWindow - 3) cur -= kWindow - 3;
    miniz = cur;
  }
  uint64_t python = file.size() > 0xFFFF + kEndSize ? file.size() - 0xFFFF - kEndSize : 0;
  return std::min(miniz, python);
}

EndRecord ReadEndRecords(Bytes file, uint64_t eocd) {
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

// Would an end record at `at` lead a reader to a central directory other than `chosen`'s,
// one that holds records? Read as miniz reads an end record (a zip64 locator right before it
// switches to the zip64 record) and checked as miniz checks a directory: every entry's
// signature and header lengths inside the directory. Also returns where that directory is.
// `budget` bounds the entries walked over all the calls: a file can hold thousands of such
// records, each leading into a long directory that breaks only at its end.
bool LeadsToOtherDirectory(Bytes file, uint64_t at, const EndRecord& chosen, uint64_t& cd_at,
                           uint64_t& count, uint64_t& budget) {
  if (file.size() - at < kEndSize) return false;
  const uint8_t* p = file.data() + at;
  count = LoadLE<uint16_t>(p + 10);
  uint64_t cd_size = LoadLE<uint32_t>(p + 12);
  cd_at = LoadLE<uint32_t>(p + 16);
  if (at >= kLocatorSize + kEnd64MinSize && LoadLE<uint32_t>(p - kLocatorSize) == kLocator64Sig) {
    uint64_t end64 = LoadLE<uint64_t>(p - kLocatorSize + 8);
    if (end64 > file.size() - kEnd64MinSize) return false;
    const uint8_t* z = file.data() + end64;
    if (LoadLE<uint32_t>(z) == kEnd64Sig) {
      count = LoadLE<uint64_t>(z + 32);
      cd_size = LoadLE<uint64_t>(z + 40);
      cd_at = LoadLE<uint64_t>(z + 48);
    }
  }
  if (count == 0 || cd_size / kCentralMinSize < count) return false;
  if (cd_at > file.size() || cd_size > file.size() - cd_at) return false;
  if (cd_at == chosen.cd_offset && count == chosen.entry_count) return false;
  uint64_t pos = cd_at;
  uint64_t end = cd_at + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (end - pos < kCentralMinSize || LoadLE<uint32_t>(file.data() + pos) != kCentralSig) {
      return false;
    }
    if (budget-- == 0) {
      Fail(
          "end-of-central-directory signatures before the last one lead into central "
          "directories too often for ckptool to check that none is another reading of the file");
    }
    const uint8_t* h = file.data() + pos;
    uint64_t total = kCentralMinSize + LoadLE<uint16_t>(h + 28) + LoadLE<uint16_t>(h + 30) +
                     LoadLE<uint16_t>(h + 32);
    if (total > end - pos) return false;
    pos += total;
  }
  return true;
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
  if (size_t nul = e.name.find('\0'); nul != std::string::npos) {
    Fail("record '{}\\0...' has a NUL byte in its name: torch looks records up by C string",
         e.name.substr(0, nul));
  }
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
    if (e.size != 0 && e.compressed_size == 0) {
      Fail("record declares {} bytes but no compressed data (torch's miniz refuses the archive)",
           e.size);
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
    if (std::string_view local = c.ReadText(name_len); local != e.name) {
      // torch takes the data offset from the local header: the two names must agree.
      Fail("local header at offset {} names '{}', which differs from the central directory's '{}'",
           e.header_offset, local, e.name);
    }
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

// miniz's MZ_TOLOWER, which its name lookups and sort apply to every byte: A-Z only.
bool HasUpper(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return c >= 'A' && c <= 'Z'; });
}

// `s` with A-Z folded to a-z: `s` itself when it has none, else a copy in `buf`.
std::string_view Folded(std::string_view s, std::string& buf) {
  if (!HasUpper(s)) return s;
  buf.assign(s);
  for (char& c : buf) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return buf;
}

}  // namespace

Archive Archive::Parse(Bytes file) {
  if (file.size() < kEndSize) Fail("not a zip file: only {} bytes", file.size());
  EndSearch search = LocateEndRecordAsMiniz(file);
  if (!search.found) {
    for (uint64_t at = EndSearchStart(file); at + kEndSize <= file.size(); ++at) {
      if (LoadLE<uint32_t>(file.data() + at) == kEndSig) {
        Fail(
            "not a zip file for torch: its end-of-central-directory record (at offset {}) is "
            "not in the bytes torch's zip reader (miniz) searches for one (from offset {})",
            at, search.searched_from);
      }
    }
    Fail("not a zip file: no end-of-central-directory record");
  }
  uint64_t eocd = *search.found;
  uint16_t comment = LoadLE<uint16_t>(file.data() + eocd + 20);
  bool reaches_end = eocd + kEndSize + comment == file.size();
  // A last record whose comment does not end the file is likely not the one a writer meant.
  std::string which = fmt::format(
      "the end-of-central-directory record torch's zip reader takes (the last signature, at "
      "offset {}, whose {}-byte comment does not end the file)",
      eocd, comment);
  EndRecord end = reaches_end ? ReadEndRecords(file, eocd)
                              : WithContext(which, [&] { return ReadEndRecords(file, eocd); });
  auto records = [](uint64_t n) { return fmt::format("{} record{}", n, n == 1 ? "" : "s"); };
  uint64_t budget = 2 * end.entry_count + (1u << 20);
  for (uint64_t at = EndSearchStart(file); at < eocd; ++at) {
    uint64_t other_cd = 0;
    uint64_t other_count = 0;
    if (LoadLE<uint32_t>(file.data() + at) == kEndSig &&
        LeadsToOtherDirectory(file, at, end, other_cd, other_count, budget)) {
      Fail(
          "two end-of-central-directory records lead to different central directories: torch's "
          "zip reader (miniz) takes the last one, at offset {} ({} at offset {}); the one at "
          "offset {} ({} at offset {}) is another reading of the file",
          eocd, records(end.entry_count), end.cd_offset, at, records(other_count), other_cd);
    }
  }
  if (!reaches_end) {
    Fail(
        "the end-of-central-directory record torch's zip reader takes (the last one, at offset "
        "{}) has a {}-byte comment but {} bytes follow it: other zip readers may take another",
        eocd, comment, file.size() - eocd - kEndSize);
  }

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
  // Indexed under the folded names: a second name that folds to one already there is either
  // the same name or one miniz cannot tell from it.
  a.by_name_.Reserve(a.entries_.size());
  std::string key_buf, name_buf;
  auto folded_of = [&a, &name_buf](uint32_t i) { return Folded(a.entries_[i].name, name_buf); };
  for (size_t i = 0; i < a.entries_.size(); ++i) {
    Entry& e = a.entries_[i];
    uint32_t first =
        a.by_name_.Insert(Folded(e.name, key_buf), static_cast<uint32_t>(i), folded_of);
    if (first != i) {
      const std::string& other = a.entries_[first].name;
      if (other == e.name) Fail("duplicate record name '{}'", e.name);
      Fail(
          "records '{}' and '{}' differ only in letter case: torch's zip reader (miniz) looks "
          "names up ignoring case, and which of the two it finds depends on its sort",
          other, e.name);
    }
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
  // Kept between calls: each lookup folds its name and the names it compares with.
  thread_local std::string key_buf;
  thread_local std::string name_buf;
  uint32_t i = by_name_.Find(Folded(name, key_buf),
                             [this](uint32_t k) { return Folded(entries_[k].name, name_buf); });
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
