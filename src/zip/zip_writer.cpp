#include "zip/zip_writer.h"

#include <algorithm>

#include "base/endian.h"
#include "base/error.h"

namespace ckpt::zip {

namespace {

constexpr uint64_t kMax32 = 0xFFFFFFFF;
constexpr uint64_t kLocalFixed = 30;
constexpr uint64_t kCentralFixed = 46;
constexpr uint64_t kEndRecords = 56 + 20 + 22;  // zip64 end + locator + end

bool SizeIsLarge(uint64_t size) {
  return size >= kMax32;
}
bool OffsetIsLarge(uint64_t offset) {
  return offset >= kMax32;
}

// Local zip64 extra: header plus 16 bytes of sizes when the size is large and 8 bytes of
// offset when the offset is (miniz's mz_zip_writer_create_zip64_extra_data).
uint64_t LocalZip64ExtraSize(uint64_t size, uint64_t offset) {
  if (!SizeIsLarge(size) && !OffsetIsLarge(offset)) return 0;
  return 4 + (SizeIsLarge(size) ? 16 : 0) + (OffsetIsLarge(offset) ? 8 : 0);
}

std::string Zip64Extra(uint64_t size, uint64_t offset) {
  std::string e;
  uint16_t len =
      static_cast<uint16_t>((SizeIsLarge(size) ? 16 : 0) + (OffsetIsLarge(offset) ? 8 : 0));
  if (len == 0) return e;
  AppendLE<uint16_t>(e, 0x0001);
  AppendLE<uint16_t>(e, len);
  if (SizeIsLarge(size)) {
    AppendLE<uint64_t>(e, size);  // uncompressed
    AppendLE<uint64_t>(e, size);  // compressed (stored)
  }
  if (OffsetIsLarge(offset)) AppendLE<uint64_t>(e, offset);
  return e;
}

uint64_t Padding(uint64_t header_offset, uint64_t name_size, uint64_t size, uint64_t alignment) {
  uint64_t start =
      header_offset + kLocalFixed + name_size + 4 + LocalZip64ExtraSize(size, header_offset);
  return (alignment - start % alignment) % alignment;
}

}  // namespace

ZipPlan ZipPlan::Layout(const std::vector<RecordSpec>& records, uint64_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > 65535) {
    Fail("storage alignment {} is not a power of two below 65536", alignment);
  }
  ZipPlan p;
  p.alignment_ = alignment;
  uint64_t cursor = 0;
  for (const RecordSpec& r : records) {
    if (r.name.size() > 0xFFFF) Fail("record name too long: {}", r.name.substr(0, 64));
    PlacedRecord pr;
    pr.name = r.name;
    pr.size = r.size;
    pr.header_offset = cursor;
    pr.zip64 = SizeIsLarge(r.size) || OffsetIsLarge(cursor);
    uint64_t extra =
        LocalZip64ExtraSize(r.size, cursor) + 4 + Padding(cursor, r.name.size(), r.size, alignment);
    pr.data_offset = cursor + kLocalFixed + r.name.size() + extra;
    pr.descriptor_offset = pr.data_offset + r.size;
    pr.descriptor_size = pr.zip64 ? 24 : 16;
    cursor = pr.descriptor_offset + pr.descriptor_size;
    p.records_.push_back(std::move(pr));
  }
  p.directory_offset_ = cursor;
  for (const PlacedRecord& r : p.records_) {
    p.directory_size_ += kCentralFixed + r.name.size() + Zip64Extra(r.size, r.header_offset).size();
  }
  p.total_size_ = p.directory_offset_ + p.directory_size_ + kEndRecords;
  return p;
}

std::string ZipPlan::LocalHeader(size_t i) const {
  const PlacedRecord& r = records_[i];
  std::string h;
  AppendLE<uint32_t>(h, 0x04034b50);
  AppendLE<uint16_t>(h, 0);       // version needed (as miniz writes for stored records)
  AppendLE<uint16_t>(h, 0x0808);  // data descriptor, UTF-8 names
  AppendLE<uint16_t>(h, 0);       // stored
  AppendLE<uint16_t>(h, 0);       // time
  AppendLE<uint16_t>(h, 0);       // date
  AppendLE<uint32_t>(h, 0);       // crc (in the descriptor)
  AppendLE<uint32_t>(h, 0);
  AppendLE<uint32_t>(h, 0);
  std::string z64 = Zip64Extra(r.size, r.header_offset);
  uint64_t padding = Padding(r.header_offset, r.name.size(), r.size, alignment_);
  AppendLE<uint16_t>(h, static_cast<uint16_t>(r.name.size()));
  AppendLE<uint16_t>(h, static_cast<uint16_t>(z64.size() + 4 + padding));
  h += r.name;
  h += z64;
  h += "FB";
  AppendLE<uint16_t>(h, static_cast<uint16_t>(padding));
  h.append(padding, 'Z');
  return h;
}

std::string ZipPlan::Descriptor(size_t i, uint32_t crc) const {
  const PlacedRecord& r = records_[i];
  std::string d;
  AppendLE<uint32_t>(d, 0x08074b50);
  AppendLE<uint32_t>(d, crc);
  if (r.zip64) {
    AppendLE<uint64_t>(d, r.size);
    AppendLE<uint64_t>(d, r.size);
  } else {
    AppendLE<uint32_t>(d, static_cast<uint32_t>(r.size));
    AppendLE<uint32_t>(d, static_cast<uint32_t>(r.size));
  }
  return d;
}

std::string ZipPlan::DirectoryAndEnd(const std::vector<uint32_t>& crcs) const {
  if (crcs.size() != records_.size())
    Fail("internal: {} CRCs for {} records", crcs.size(), records_.size());
  std::string d;
  for (size_t i = 0; i < records_.size(); ++i) {
    const PlacedRecord& r = records_[i];
    std::string z64 = Zip64Extra(r.size, r.header_offset);
    AppendLE<uint32_t>(d, 0x02014b50);
    AppendLE<uint16_t>(d, 0);  // made by
    AppendLE<uint16_t>(d, 0);  // version needed
    AppendLE<uint16_t>(d, 0x0808);
    AppendLE<uint16_t>(d, 0);
    AppendLE<uint16_t>(d, 0);
    AppendLE<uint16_t>(d, 0);
    AppendLE<uint32_t>(d, crcs[i]);
    AppendLE<uint32_t>(d, static_cast<uint32_t>(std::min(r.size, kMax32)));
    AppendLE<uint32_t>(d, static_cast<uint32_t>(std::min(r.size, kMax32)));
    AppendLE<uint16_t>(d, static_cast<uint16_t>(r.name.size()));
    AppendLE<uint16_t>(d, static_cast<uint16_t>(z64.size()));
    AppendLE<uint16_t>(d, 0);  // comment
    AppendLE<uint16_t>(d, 0);  // disk
    AppendLE<uint16_t>(d, 0);  // internal attributes
    AppendLE<uint32_t>(d, 0);  // external attributes
    AppendLE<uint32_t>(d, static_cast<uint32_t>(std::min(r.header_offset, kMax32)));
    d += r.name;
    d += z64;
  }
  uint64_t n = records_.size();
  uint64_t end64 = directory_offset_ + directory_size_;
  AppendLE<uint32_t>(d, 0x06064b50);
  AppendLE<uint64_t>(d, 44);
  AppendLE<uint16_t>(d, 0x031e);
  AppendLE<uint16_t>(d, 0x002d);
  AppendLE<uint32_t>(d, 0);
  AppendLE<uint32_t>(d, 0);
  AppendLE<uint64_t>(d, n);
  AppendLE<uint64_t>(d, n);
  AppendLE<uint64_t>(d, directory_size_);
  AppendLE<uint64_t>(d, directory_offset_);
  AppendLE<uint32_t>(d, 0x07064b50);
  AppendLE<uint32_t>(d, 0);
  AppendLE<uint64_t>(d, end64);
  AppendLE<uint32_t>(d, 1);
  AppendLE<uint32_t>(d, 0x06054b50);
  AppendLE<uint16_t>(d, 0);
  AppendLE<uint16_t>(d, 0);
  AppendLE<uint16_t>(d, static_cast<uint16_t>(std::min<uint64_t>(n, 0xFFFF)));
  AppendLE<uint16_t>(d, static_cast<uint16_t>(std::min<uint64_t>(n, 0xFFFF)));
  AppendLE<uint32_t>(d, static_cast<uint32_t>(std::min(directory_size_, kMax32)));
  AppendLE<uint32_t>(d, static_cast<uint32_t>(std::min(directory_offset_, kMax32)));
  AppendLE<uint16_t>(d, 0);
  return d;
}

}  // namespace ckpt::zip
