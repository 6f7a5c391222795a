// Helpers shared by the unit tests: fixtures from disk and byte-level builders for
// hand-made zips and pickles.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/byte_cursor.h"
#include "base/endian.h"
#include "base/error.h"

namespace ckpt::test {

inline std::string ReadFixture(const std::string& name) {
  std::ifstream in(std::string(CKPT_FIXTURES_DIR) + "/" + name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The bytes of the file at `p`.
inline std::string ReadBytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The committed corpus of a fuzz target (fuzz/corpus/<target>): its seeds and what fuzzing found.
inline std::filesystem::path FuzzCorpus(const std::string& target) {
  return std::filesystem::path(CKPT_FIXTURES_DIR) / ".." / ".." / "fuzz" / "corpus" / target;
}

// The seeds of a fuzz target's corpus (its files named "seed-..."), by name, with their bytes.
inline std::vector<std::pair<std::string, std::string>> FuzzSeeds(const std::string& target) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : std::filesystem::directory_iterator(FuzzCorpus(target))) {
    std::string name = e.path().filename().string();
    if (name.starts_with("seed-")) out.emplace_back(name, ReadBytes(e.path()));
  }
  return out;
}

// The message of the ckpt::Error that fn() throws, or "" when it throws none.
template <typename Fn>
std::string ErrorOf(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A fresh folder under /tmp, removed with everything in it when the object goes.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/ckpt-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) Fail("cannot create a temporary folder");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Path(const std::string& name) const { return path_ + "/" + name; }
  // Writes `bytes` to the file `name` in the folder; returns its path.
  std::string Put(const std::string& name, std::string_view bytes) const {
    std::ofstream(Path(name), std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return Path(name);
  }

 private:
  std::string path_;
};

inline Bytes B(const std::string& s) {
  return Bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

struct ZipRecord {
  std::string name;
  std::string data;
  bool deflate = false;
};

// Writes a zip the way torch does (stored, data descriptors, zip64 end records), or with
// deflated records when asked.
inline std::string BuildZip(const std::vector<ZipRecord>& records, bool zip64_end = true) {
  std::string out;
  struct Central {
    std::string name;
    uint32_t crc;
    uint64_t csize, size, offset;
    uint16_t method;
  };
  std::vector<Central> dir;
  for (const ZipRecord& r : records) {
    uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(r.data.data()), static_cast<uInt>(r.data.size())));
    std::string payload = r.data;
    if (r.deflate) {
      z_stream zs{};
      deflateInit2(&zs, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
      std::string buf(deflateBound(&zs, r.data.size()) + 16, '\0');
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(r.data.data()));
      zs.avail_in = static_cast<uInt>(r.data.size());
      zs.next_out = reinterpret_cast<Bytef*>(buf.data());
      zs.avail_out = static_cast<uInt>(buf.size());
      deflate(&zs, Z_FINISH);
      buf.resize(zs.total_out);
      deflateEnd(&zs);
      payload = buf;
    }
    Central c{r.name,        crc,        payload.size(),
              r.data.size(), out.size(), static_cast<uint16_t>(r.deflate ? 8 : 0)};
    AppendLE<uint32_t>(out, 0x04034b50);
    AppendLE<uint16_t>(out, 20);
    AppendLE<uint16_t>(out, 0x0808);
    AppendLE<uint16_t>(out, c.method);
    AppendLE<uint32_t>(out, 0);
    AppendLE<uint32_t>(out, 0);
    AppendLE<uint32_t>(out, 0);
    AppendLE<uint32_t>(out, 0);
    AppendLE<uint16_t>(out, static_cast<uint16_t>(r.name.size()));
    AppendLE<uint16_t>(out, 0);
    out += r.name;
    out += payload;
    AppendLE<uint32_t>(out, 0x08074b50);
    AppendLE<uint32_t>(out, crc);
    AppendLE<uint32_t>(out, static_cast<uint32_t>(c.csize));
    AppendLE<uint32_t>(out, static_cast<uint32_t>(c.size));
    dir.push_back(c);
  }
  uint64_t cd_offset = out.size();
  for (const Central& c : dir) {
    AppendLE<uint32_t>(out, 0x02014b50);
    AppendLE<uint16_t>(out, 20);
    AppendLE<uint16_t>(out, 20);
    AppendLE<uint16_t>(out, 0x0808);
    AppendLE<uint16_t>(out, c.method);
    AppendLE<uint32_t>(out, 0);
    AppendLE<uint32_t>(out, c.crc);
    AppendLE<uint32_t>(out, static_cast<uint32_t>(c.csize));
    AppendLE<uint32_t>(out, static_cast<uint32_t>(c.size));
    AppendLE<uint16_t>(out, static_cast<uint16_t>(c.name.size()));
    AppendLE<uint16_t>(out, 0);
    AppendLE<uint16_t>(out, 0);
    AppendLE<uint16_t>(out, 0);
    AppendLE<uint16_t>(out, 0);
    AppendLE<uint32_t>(out, 0);
    AppendLE<uint32_t>(out, static_cast<uint32_t>(c.offset));
    out += c.name;
  }
  uint64_t cd_size = out.size() - cd_offset;
  if (zip64_end) {
    uint64_t end64 = out.size();
    AppendLE<uint32_t>(out, 0x06064b50);
    AppendLE<uint64_t>(out, 44);
    AppendLE<uint16_t>(out, 45);
    AppendLE<uint16_t>(out, 45);
    AppendLE<uint32_t>(out, 0);
    AppendLE<uint32_t>(out, 0);
    AppendLE<uint64_t>(out, dir.size());
    AppendLE<uint64_t>(out, dir.size());
    AppendLE<uint64_t>(out, cd_size);
    AppendLE<uint64_t>(out, cd_offset);
    AppendLE<uint32_t>(out, 0x07064b50);
    AppendLE<uint32_t>(out, 0);
    AppendLE<uint64_t>(out, end64);
    AppendLE<uint32_t>(out, 1);
  }
  AppendLE<uint32_t>(out, 0x06054b50);
  AppendLE<uint16_t>(out, 0);
  AppendLE<uint16_t>(out, 0);
  AppendLE<uint16_t>(out, zip64_end ? 0xFFFF : static_cast<uint16_t>(dir.size()));
  AppendLE<uint16_t>(out, zip64_end ? 0xFFFF : static_cast<uint16_t>(dir.size()));
  AppendLE<uint32_t>(out, zip64_end ? 0xFFFFFFFF : static_cast<uint32_t>(cd_size));
  AppendLE<uint32_t>(out, zip64_end ? 0xFFFFFFFF : static_cast<uint32_t>(cd_offset));
  AppendLE<uint16_t>(out, 0);
  return out;
}

// A tiny pickle assembler: P().proto(2).bin_int(5).stop().bytes
class P {
 public:
  P& raw(std::string_view s) {
    b_.append(s);
    return *this;
  }
  P& op(uint8_t code) {
    b_.push_back(static_cast<char>(code));
    return *this;
  }
  P& proto(uint8_t v) { return op(0x80).op(v); }
  P& mark() { return op('('); }
  P& stop() { return op('.'); }
  P& none() { return op('N'); }
  P& bin_int(int32_t v) {
    op('J');
    AppendLE<int32_t>(b_, v);
    return *this;
  }
  P& str(std::string_view s) {
    op('X');
    AppendLE<uint32_t>(b_, static_cast<uint32_t>(s.size()));
    b_.append(s);
    return *this;
  }
  P& global(std::string_view module, std::string_view name) {
    op('c');
    b_.append(module);
    b_.push_back('\n');
    b_.append(name);
    b_.push_back('\n');
    return *this;
  }
  P& put(uint8_t i) { return op('q').op(i); }
  P& get(uint8_t i) { return op('h').op(i); }
  std::string bytes() const { return b_; }

 private:
  std::string b_;
};

// Pushes a torch tensor the way torch.save pickles one:
// _rebuild_tensor_v2(storage(key, numel), offset, (size,), (1,), False, OrderedDict()).
inline P& PushTensor(P& p, int32_t numel, int32_t offset, int32_t size,
                     const char* storage_class = "FloatStorage", std::string_view key = "0") {
  return p.global("torch._utils", "_rebuild_tensor_v2")
      .mark()
      .mark()
      .str("storage")
      .global("torch", storage_class)
      .str(key)
      .str("cpu")
      .bin_int(numel)
      .op('t')
      .op('Q')
      .bin_int(offset)
      .mark()
      .bin_int(size)
      .op('t')
      .mark()
      .bin_int(1)
      .op('t')
      .op(0x89)
      .global("collections", "OrderedDict")
      .op(')')
      .op('R')
      .op('t')
      .op('R');
}

// Protocol 4: OrderedDict() with SETITEMS {"a": 1, "b": b} and a BUILD state dict
// {"_metadata": {3}} (a set via ADDITEMS).
inline std::string OrderedDictWithState(int32_t b) {
  return P()
      .proto(4)
      .global("collections", "OrderedDict")
      .op(')')
      .op('R')
      .mark()
      .str("a")
      .bin_int(1)
      .str("b")
      .bin_int(b)
      .op('u')
      .op('}')
      .str("_metadata")
      .op(0x8f)
      .mark()
      .bin_int(3)
      .op(0x90)
      .op('s')
      .op('b')
      .stop()
      .bytes();
}

}  // namespace ckpt::test
