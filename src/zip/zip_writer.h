// Layout and byte images of a torch-compatible zip (what caffe2's PyTorchStreamWriter
// produces through miniz), planned before any data is written so records can be filled in
// parallel at known offsets:
//   local header: version 0, flags 0x0808 (data descriptor + UTF-8), method 0 (stored),
//                 time/date 0, CRC and sizes 0; extra = [zip64 extra when the size or the
//                 offset is >= 0xFFFFFFFF] + 'F','B', u16 n, n x 'Z' so that data starts at a
//                 multiple of the alignment (torch's getPadding).
//   data descriptor: 'PK\7\8', crc, sizes (32-bit, or 64-bit when a zip64 extra was used).
//   central directory: no 'FB' extra; zip64 extra (size, compressed size, offset) as needed.
//   end: zip64 end record, zip64 locator and end record, always (MZ_ZIP_FLAG_WRITE_ZIP64).
// No timestamps or other run-dependent bytes: the same records give the same file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt::zip {

struct RecordSpec {
  std::string name;
  uint64_t size = 0;
};

struct PlacedRecord {
  std::string name;
  uint64_t size = 0;
  uint64_t header_offset = 0;
  uint64_t data_offset = 0;
  uint64_t descriptor_offset = 0;
  uint32_t descriptor_size = 0;
  bool zip64 = false;  // needs zip64 fields (size or offset >= 0xFFFFFFFF)
};

class ZipPlan {
 public:
  static ZipPlan Layout(const std::vector<RecordSpec>& records, uint64_t alignment = 64);

  const std::vector<PlacedRecord>& records() const { return records_; }
  uint64_t directory_offset() const { return directory_offset_; }
  uint64_t total_size() const { return total_size_; }

  // Bytes to write at records()[i].header_offset: local header, name and extra field.
  std::string LocalHeader(size_t i) const;
  // Bytes to write at records()[i].descriptor_offset.
  std::string Descriptor(size_t i, uint32_t crc) const;
  // Bytes to write at directory_offset(): central directory and end records.
  std::string DirectoryAndEnd(const std::vector<uint32_t>& crcs) const;

 private:
  std::vector<PlacedRecord> records_;
  uint64_t alignment_ = 64;
  uint64_t directory_offset_ = 0;
  uint64_t directory_size_ = 0;
  uint64_t total_size_ = 0;
};

}  // namespace ckpt::zip
