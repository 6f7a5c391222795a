// Zip reader for checkpoint containers (torch.save's format is a zip of stored records).
//
// Layout, as written by torch's PyTorchStreamWriter (miniz) and read here:
//   [local header 30B + name + extra][data][descriptor 16/24B]   one per record
//   [central directory: 46B + name + extra + comment per record]
//   [zip64 end record 56B+][zip64 locator 20B][end record 22B + comment]
// Local header:  sig 0x04034b50, version, flags, method, time, date, crc, csize, usize,
//                name_len, extra_len.   Data starts at offset + 30 + name_len + extra_len.
// Central entry: sig 0x02014b50, made_by, version, flags, method, time, date, crc, csize,
//                usize, name_len, extra_len, comment_len, disk, int_attr, ext_attr, offset.
//                0xFFFFFFFF sizes/offsets are found in the zip64 extra (id 0x0001), in the
//                order usize, csize, offset.
// End record:    sig 0x06054b50, disk, cd_disk, n_this_disk, n_total, cd_size, cd_offset,
//                comment_len. Zip64 locator (0x07064b50) points at the zip64 end record
//                (0x06064b50) that carries 64-bit counts and offsets.
//
// Everything read from the file is checked against the bytes that exist before use:
// counts against the directory size, records inside the file, no two records overlapping,
// no record overlapping the directory, names unique (ignoring A-Z case, as miniz compares).
// Which end record, directory and record bytes torch's miniz reads, and what is refused as
// open to another reading, is set out with its source at the top of zip_archive.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/byte_cursor.h"
#include "base/name_index.h"

namespace ckpt::zip {

enum class Method : uint16_t { kStored = 0, kDeflate = 8 };

struct Entry {
  std::string name;
  Method method = Method::kStored;
  uint16_t flags = 0;
  uint32_t crc32 = 0;
  uint64_t compressed_size = 0;
  uint64_t size = 0;
  uint64_t header_offset = 0;    // local header
  uint64_t header_size = 0;      // 30 + name_len (fixed part and name)
  uint64_t extra_size = 0;       // local extra field (torch's 'FB' alignment padding)
  uint64_t data_offset = 0;      // first byte of the record's (possibly compressed) data
  uint64_t descriptor_size = 0;  // data descriptor after the data, 0 if none found

  uint64_t data_end() const { return data_offset + compressed_size; }
  uint64_t end() const { return data_end() + descriptor_size; }
};

class Archive {
 public:
  // Parses the directory of a zip file held in `file`. Throws ckpt::Error naming the record.
  static Archive Parse(Bytes file);

  const std::vector<Entry>& entries() const { return entries_; }
  // The record miniz's mz_zip_reader_locate_file(name, flags=0) finds: names compared with
  // A-Z folded to a-z (Parse refuses two names that fold alike).
  const Entry* Find(std::string_view name) const;

  // Central directory and end records, for byte accounting.
  uint64_t directory_offset() const { return cd_offset_; }
  uint64_t directory_size() const { return cd_size_; }
  uint64_t end_records_offset() const { return end_offset_; }  // zip64 end record or end record
  uint64_t end_records_size() const { return end_size_; }

 private:
  std::vector<Entry> entries_;
  NameIndex by_name_;  // into entries_, under the names with A-Z folded to a-z
  uint64_t cd_offset_ = 0;
  uint64_t cd_size_ = 0;
  uint64_t end_offset_ = 0;
  uint64_t end_size_ = 0;
};

// Raw (possibly compressed) bytes of a record.
Bytes RawData(Bytes file, const Entry& entry);

// Whole uncompressed contents of a record, refusing more than max_size bytes.
std::string ReadRecord(Bytes file, const Entry& entry, uint64_t max_size);

// Streams the uncompressed contents in chunks (stored records are passed through from the
// map without copying; deflated ones are inflated through a small buffer).
void StreamRecord(Bytes file, const Entry& entry, const std::function<void(Bytes)>& sink);

}  // namespace ckpt::zip
