// Legacy torch checkpoints (torch < 1.6, or _use_new_zipfile_serialization=False):
//   pickle(MAGIC_NUMBER = 0x1950a86a20f9469cfc6c)   spelled by the pickle protocol torch.save
//                                                     was given: LONG text (0, 1), LONG1 after
//                                                     PROTO (2, 3), or after PROTO and FRAME (4, 5)
//   pickle(PROTOCOL_VERSION = 1001)
//   pickle(sys_info)                                  {protocol_version, little_endian, type_sizes}
//   pickle(obj)                                       persistent ids are 6-tuples:
//       ('storage', <StorageClass>, key, location, numel, view_metadata or None)
//   pickle(sorted(storage keys))
//   for each key in that list: int64 little-endian numel, then numel * element_size bytes.
//
// Before any of that, torch.load (_legacy_load, for a file it opened itself: a real file at
// offset 0) tries the pre-0.4 tar format: legacy_load opens the file with Python's tarfile
// (tarfile.open(fileobj=f, mode='r:')), extracts member 'storages' and unpickles from it a
// count, then per storage an (key, location, StorageClass) pickle and an int64 count of
// elements with their bytes, then a list of views; then 'tensors' (a count, then per tensor a
// pickle and int32 ndim, 4 bytes, ndim int64 sizes and strides, an int64 offset); then
// 'pickle', the object. Only a tarfile.TarError falls back to the pickles above. ckptool
// reads no tar checkpoint: a file that tarfile opens is refused, with what those pickles
// would import and call. tarfile opens a file when its first 512-byte block is all NUL (an
// empty archive) or passes TarInfo.frombuf (CPython Lib/tarfile.py, 3.11): the checksum field
// (nti of bytes 148..156) equals the unsigned or the signed sum of the block with that field
// counted as spaces (calc_chksums), and every number field parses with nti: base-256 after a
// 0x80 or 0xFF byte, else ASCII up to the first NUL, stripped of whitespace, empty for 0,
// read by int(s, 8) (a sign, a 0o prefix and single underscores between digits allowed).
// No 'ustar' magic is needed: an old V7 header is enough. For a GNU sparse header ('S') the
// sparse fields at 386..495 must parse too. A long-name, pax or sparse first header makes
// tarfile read on before it decides; ckptool refuses the file either way.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "base/checked.h"
#include "base/error.h"
#include "torch/global_policy.h"
#include "torch/pickle_read.h"
#include "torch/torch_file.h"

namespace ckpt::torch {

namespace {

constexpr std::string_view kMagicLE = "\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
constexpr int64_t kProtocolVersion = 1001;

struct Piece {
  pickle::Graph graph;
  uint64_t offset;
  uint64_t size;
  size_t leftover;  // values left on the stack at STOP
  std::vector<std::string> anomalies;
};

Piece ParseAt(Bytes file, uint64_t offset, const char* what, const ReadOptions& options) {
  return WithContext(what, [&] {
    pickle::ParseResult r =
        ParseTorchPickle(Slice(file, offset, file.size() - offset), offset, options.limits);
    // torch.load reads the next pickle from where _pickle.c left the file: after the whole
    // FRAME when it read the frame with read(), after STOP when it peeked (small frames).
    if (r.frame_rest) {
      Fail(
          "the pickle's last FRAME runs {} bytes past its STOP: torch.load would start the "
          "next pickle at a place that depends on its file buffer",
          r.frame_rest);
    }
    return Piece{std::move(r.graph), offset, r.end, r.leftover, std::move(r.anomalies)};
  });
}

// The pickles around the object pickle hold plain values in every file torch writes; anything
// they import or call runs when torch.load reads them (with pickle.load, before any check).
void CheckPlainPickle(const Piece& p, const char* what, Model& model) {
  for (const std::string& odd : p.anomalies) model.problems.push_back({what, odd});
  for (const UnsafeFinding& u : FindUnsafe(p.graph)) {
    model.problems.push_back(
        {what,
         u.what + ", which can run code: torch.load unpickles it before it reads the object"});
  }
}

// ---- Python's tarfile (Lib/tarfile.py, 3.11), as torch's legacy_load opens a file ----

constexpr uint64_t kTarBlock = 512;

// A number field as tarfile.nti reads it; nullopt where nti raises InvalidHeaderError.
// `fits` is false for base-256 values beyond int64.
struct TarNumber {
  int64_t value = 0;
  bool fits = true;       // false: a base-256 value beyond int64
  bool negative = false;  // the value's sign, also when it does not fit
};

bool IsPythonSpace(uint8_t c) {  // str.isspace() on ASCII: \t\n\v\f\r, \x1c-\x1f, space
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20);
}

std::optional<TarNumber> Nti(const uint8_t* p, size_t len) {
  TarNumber out;
  if (p[0] == 0x80 || p[0] == 0xFF) {
    // Big-endian base 256 over the other bytes; after 0xFF, minus 256^(len-1).
    uint64_t n = 0;
    bool wide = false;  // more than 64 significant bits
    for (size_t i = 1; i < len; ++i) {
      wide = wide || (n >> 56) != 0;
      n = (n << 8) | p[i];
    }
    if (p[0] == 0x80) {
      out.fits = !wide && n <= static_cast<uint64_t>(INT64_MAX);
      out.value = static_cast<int64_t>(n);
      return out;
    }
    out.negative = true;
    if (len - 1 < 8) {
      out.value = static_cast<int64_t>(n) - (int64_t{1} << (8 * (len - 1)));
    } else {
      // n - 256^(len-1) is in int64 when the bytes above the low 8 are all 0xFF and the
      // low 64 bits have their top bit set: then it is those bits as two's complement.
      bool high_ones = true;
      for (size_t i = 1; i + 8 < len; ++i) high_ones = high_ones && p[i] == 0xFF;
      out.fits = high_ones && (p[len - 8] & 0x80) != 0;
      out.value = static_cast<int64_t>(n);
    }
    return out;
  }
  // nts(s, "ascii", "strict"), then int(s.strip() or "0", 8).
  size_t n = 0;
  while (n < len && p[n] != 0) ++n;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x80) return std::nullopt;  // UnicodeDecodeError is a ValueError
  }
  size_t b = 0, e = n;
  while (b < e && IsPythonSpace(p[b])) ++b;
  while (e > b && IsPythonSpace(p[e - 1])) --e;
  if (b == e) return out;
  if (p[b] == '+' || p[b] == '-') out.negative = p[b++] == '-';
  if (e - b >= 2 && p[b] == '0' && (p[b + 1] == 'o' || p[b + 1] == 'O')) {
    b += 2;
    if (b < e && p[b] == '_') ++b;  // one underscore may follow the prefix
  }
  if (b == e || p[b] == '_') return std::nullopt;
  int64_t v = 0;
  for (size_t i = b; i < e; ++i) {
    if (p[i] == '_') {  // single underscores between digits
      if (i + 1 == e || p[i + 1] == '_') return std::nullopt;
      continue;
    }
    if (p[i] < '0' || p[i] > '7') return std::nullopt;
    v = v * 8 + (p[i] - '0');  // at most 12 digits: below 2^36
  }
  out.value = out.negative ? -v : v;
  out.negative = out.value < 0;
  return out;
}

struct TarHeader {
  std::string name;  // the ustar prefix joined, a directory's trailing '/' removed
  std::string linkname;
  char type = 0;
  TarNumber size;
};

std::string Nts(Bytes b) {
  std::string_view text = AsText(b);
  return std::string(text.substr(0, text.find('\0')));
}

// TarInfo.frombuf on a whole 512-byte block that is not all NUL; nullopt where it raises.
std::optional<TarHeader> FromBuf(const uint8_t* b) {
  std::optional<TarNumber> chksum = Nti(b + 148, 8);
  if (!chksum) return std::nullopt;
  int64_t unsigned_sum = 256, signed_sum = 256;
  for (size_t i = 0; i < kTarBlock; ++i) {
    if (i >= 148 && i < 156) continue;
    unsigned_sum += b[i];
    signed_sum += static_cast<int8_t>(b[i]);
  }
  if (chksum->value != unsigned_sum && chksum->value != signed_sum) return std::nullopt;
  // mode, uid, gid, mtime, devmajor, devminor; then size.
  for (auto [at, len] :
       {std::pair<size_t, size_t>{100, 8}, {108, 8}, {116, 8}, {136, 12}, {329, 8}, {337, 8}}) {
    if (!Nti(b + at, len)) return std::nullopt;
  }
  std::optional<TarNumber> size = Nti(b + 124, 12);
  if (!size) return std::nullopt;
  TarHeader h;
  h.size = *size;
  h.type = static_cast<char>(b[156]);
  if (h.type == 'S') {  // the old GNU sparse fields (nti's error is no ValueError there)
    for (size_t at = 386; at < 386 + 4 * 24; at += 12) {
      if (!Nti(b + at, 12)) return std::nullopt;
    }
    if (!Nti(b + 483, 12)) return std::nullopt;
  }
  Bytes block(b, kTarBlock);
  h.name = Nts(block.subspan(0, 100));
  h.linkname = Nts(block.subspan(157, 100));
  std::string prefix = Nts(block.subspan(345, 155));
  if (h.type == '\0' && h.name.ends_with('/')) h.type = '5';  // a V7 directory
  if (h.type == '5') {
    while (h.name.ends_with('/')) h.name.pop_back();
  }
  if (!prefix.empty() && h.type != 'L' && h.type != 'K' && h.type != 'S') {
    h.name = prefix + "/" + h.name;
  }
  if (h.type == '5') {  // _proc_builtin strips again, after the prefix is joined
    while (h.name.ends_with('/')) h.name.pop_back();
  }
  return h;
}

bool IsAllNul(const uint8_t* b) {
  return std::all_of(b, b + kTarBlock, [](uint8_t c) { return c == 0; });
}

// TarInfo._block for a size known to be in [0, 2^62).
uint64_t TarBlocks(uint64_t n) {
  return (n + kTarBlock - 1) / kTarBlock * kTarBlock;
}

struct TarMember {
  std::string name;
  std::string linkname;
  char type = 0;
  uint64_t data_offset = 0;
  uint64_t size = 0;
  bool regular = false;  // isreg(), or a type tarfile does not know: read as a file
};

struct TarReading {
  bool opens = false;  // tarfile.open reads a first header (or reads on to decide)
  bool empty = false;  // the first block is all NUL: an empty archive
  std::vector<TarMember> members;
  // Where the member list is not known: a TarError while tarfile lists the members (torch.load
  // then falls back to reading the file as pickles), or a header ckptool does not follow.
  std::string fails;
  std::string unfollowed;
};

// The pax records "%d %s=%s\n" of an extended header, as _proc_pax reads them into a dict (a
// later record replaces an earlier one); false (with `why`) on one ckptool does not follow.
bool ReadPaxRecords(std::string_view buf, std::optional<std::string>& path,
                    std::optional<std::string>& linkpath, std::optional<int64_t>& size,
                    std::string& why) {
  size_t pos = 0;
  while (pos < buf.size()) {
    // re.match(br"(\d+) ([^=]+)=", buf, pos)
    size_t d = pos;
    while (d < buf.size() && buf[d] >= '0' && buf[d] <= '9') ++d;
    if (d == pos || d >= buf.size() || buf[d] != ' ') break;
    size_t eq = buf.find('=', d + 1);
    if (eq == std::string_view::npos || eq == d + 1) break;
    uint64_t length = 0;
    for (size_t i = pos; i < d; ++i) {
      length = std::min<uint64_t>(length * 10 + static_cast<uint64_t>(buf[i] - '0'), 1ull << 40);
    }
    if (length == 0) {
      why = "a pax record of length 0 (InvalidHeaderError)";
      return false;
    }
    std::string_view key = buf.substr(d + 1, eq - d - 1);
    uint64_t value_end = std::min<uint64_t>(pos + length - 1, buf.size());
    std::string_view value =
        eq + 1 < value_end ? buf.substr(eq + 1, value_end - eq - 1) : std::string_view();
    if (key == "path") {
      std::string v(value);  // _apply_pax_info: value.rstrip("/")
      while (v.ends_with('/')) v.pop_back();
      path = v;
    } else if (key == "linkpath") {
      linkpath = std::string(value);
    } else if (key == "size") {
      if (value.empty() || value.size() > 18 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        why = fmt::format("a pax size '{}'", value);
        return false;
      }
      size = std::stoll(std::string(value));
    } else if (key.starts_with("GNU.sparse") || key == "hdrcharset") {
      why = fmt::format("a pax '{}' record", key);
      return false;
    }
    pos += length;
  }
  return true;
}

// TarFile.next() over the whole file, as TarFile.getmember has it do before any extraction.
// Regular, directory, link and unknown-type headers, GNU long names ('L', 'K') and per-file
// pax headers ('x', 'X': path, linkpath, size) are followed; the rest stops the walk.
TarReading ReadTar(Bytes file, size_t max_members = size_t{1} << 20) {
  TarReading r;
  if (file.size() < kTarBlock) return r;  // EmptyHeaderError/TruncatedHeaderError at 0
  if (IsAllNul(file.data())) {
    r.opens = r.empty = true;  // EOFHeaderError at 0: an empty archive
    return r;
  }
  if (!FromBuf(file.data())) return r;  // InvalidHeaderError at 0: ReadError
  r.opens = true;
  uint64_t offset = 0;
  for (;;) {
    if (file.size() - offset < kTarBlock || IsAllNul(file.data() + offset)) return r;  // the end
    std::optional<TarHeader> h = FromBuf(file.data() + offset);
    if (!h) return r;  // InvalidHeaderError after the first member: the end
    uint64_t at = offset + kTarBlock;
    // Extension headers describe the header after them; the outermost one's value wins
    // (_proc_gnulong and _proc_pax patch what fromtarfile returned for the next header).
    std::optional<std::string> name, linkname;
    std::optional<int64_t> pax_size;
    while (h->type == 'L' || h->type == 'K' || h->type == 'x' || h->type == 'X') {
      uint64_t header_at = at - kTarBlock;
      if (h->size.negative || !h->size.fits ||
          static_cast<uint64_t>(h->size.value) > file.size() - at) {
        // read(_block(size)) takes the rest of the file; no header follows.
        r.fails = fmt::format("the extension header at offset {} runs past the end of the file",
                              header_at);
        return r;
      }
      uint64_t blocks = TarBlocks(static_cast<uint64_t>(h->size.value));
      std::string_view body = AsText(file.subspan(at, std::min(blocks, file.size() - at)));
      if (h->type == 'L' || h->type == 'K') {
        std::string text(body.substr(0, body.find('\0')));
        (h->type == 'L' ? name : linkname) = (h->type == 'L' ? name : linkname).value_or(text);
      } else {
        std::optional<std::string> path, linkpath;
        std::optional<int64_t> size;
        std::string why;
        if (!ReadPaxRecords(body, path, linkpath, size, why)) {
          r.unfollowed = fmt::format("{} at offset {}", why, header_at);
          return r;
        }
        if (path) name = name.value_or(*path);
        if (linkpath) linkname = linkname.value_or(*linkpath);
        if (size) pax_size = pax_size.value_or(*size);
      }
      at += blocks;
      if (at > file.size() || file.size() - at < kTarBlock || IsAllNul(file.data() + at) ||
          !(h = FromBuf(file.data() + at))) {
        r.fails = fmt::format("no valid header follows the extension header at offset {}",
                              header_at);  // SubsequentHeaderError: a ReadError
        return r;
      }
      at += kTarBlock;
    }
    if (h->type == 'S' || h->type == 'g') {
      r.unfollowed = fmt::format("a {} header at offset {}",
                                 h->type == 'S' ? "GNU sparse" : "pax global", at - kTarBlock);
      return r;
    }
    TarMember m;
    m.type = h->type;
    m.name = name.value_or(h->name);
    if (name && m.type == '5' && m.name.ends_with('/')) m.name.pop_back();
    m.linkname = linkname.value_or(h->linkname);
    m.data_offset = at;
    // isreg(), or a type not in SUPPORTED_TYPES ('\0', '0'-'7', 'L', 'K', 'S').
    m.regular = m.type == '0' || m.type == '\0' || m.type == '7' ||
                std::string_view("01234567LKS").find(m.type) == std::string_view::npos;
    uint64_t next = at;
    if (m.regular) {
      TarNumber size = pax_size ? TarNumber{*pax_size, true, false} : h->size;
      if (size.negative) {
        r.unfollowed = fmt::format("member '{}' with a negative size", m.name);
        return r;
      }
      if (!size.fits || static_cast<uint64_t>(size.value) > file.size()) {
        r.fails = fmt::format("member '{}' runs past the end of the file", m.name);
        return r;
      }
      m.size = static_cast<uint64_t>(size.value);
      next = at + TarBlocks(m.size);
    }
    r.members.push_back(std::move(m));
    // TarFile.next() seeks to the next header and reads the byte before it: past the end of
    // the file that is a ReadError ("unexpected end of data").
    if (next != at && next > file.size()) {
      r.fails = fmt::format("member '{}' runs past the end of the file", r.members.back().name);
      return r;
    }
    if (r.members.size() >= max_members) {
      r.unfollowed = fmt::format("its first {} members", max_members);
      return r;
    }
    offset = next;
  }
}

// The member legacy_load extracts as `name`: TarFile.getmember takes the last of that name.
const TarMember* FindMember(const TarReading& r, std::string_view name) {
  for (auto it = r.members.rbegin(); it != r.members.rend(); ++it) {
    if (it->name == name) return &*it;
  }
  return nullptr;
}

std::string MemberKind(char type) {
  switch (type) {
    case '1':
      return "hard link";
    case '2':
      return "symbolic link";
    case '3':
      return "character device";
    case '4':
      return "block device";
    case '5':
      return "directory";
    case '6':
      return "FIFO";
  }
  return fmt::format("type '{}'", type);
}

// What legacy_load unpickles from a tar checkpoint, in its order, followed as far as ckptool
// can: the pickles that import or call what ckptool judges unsafe, described.
class TarPickles {
 public:
  TarPickles(Bytes file, const TarReading& tar, const pickle::Limits& limits)
      : file_(file), tar_(tar), limits_(limits) {}

  void Follow() {
    if (!Storages() || !Tensors()) return;
    const TarMember* m = Member("pickle");
    if (m == nullptr) return;
    uint64_t pos = 0;
    Load(*m, pos, "its 'pickle' member (the object)");
  }

  std::vector<std::string> found;  // "its 'pickle' member ..., which imports posix.system..."
  std::string stopped;             // where torch.load fails or ckptool stops following

 private:
  // The regular member `name` (what tar.extract writes and open() reads back), or nullptr
  // with `stopped` saying why there is none.
  const TarMember* Member(const char* name) {
    const TarMember* m = FindMember(tar_, name);
    if (m == nullptr) {
      stopped = fmt::format("it has no '{}' member, so torch.load fails there (KeyError)", name);
    } else if (m->type == '2' && std::string_view(name) != "pickle") {
      // tar.extract makes the link in a temporary folder and open() follows it.
      stopped = fmt::format(
          "its '{}' member is a symbolic link to '{}': torch.load would unpickle whatever that "
          "path holds on the machine that loads it",
          name, m->linkname);
      m = nullptr;
    } else if (!m->regular) {
      stopped = fmt::format("its '{}' member is a {}, which ckptool does not follow", name,
                            MemberKind(m->type));
      m = nullptr;
    }
    return m;
  }

  Bytes Data(const TarMember& m) const { return file_.subspan(m.data_offset, m.size); }

  // One pickle_module.load(f) at `pos` of the member, as _pickle.c reads an unbuffered file
  // (a FRAME is read whole); its findings go to `found`. nullopt where unpickling fails.
  std::optional<pickle::Graph> Load(const TarMember& m, uint64_t& pos, const std::string& what) {
    Bytes data = Data(m);
    if (pos >= data.size()) {
      stopped = fmt::format("the member ends where torch.load reads {} (EOFError)", what);
      return std::nullopt;
    }
    pickle::PartialParse p =
        pickle::ParsePartial(data.subspan(pos), m.data_offset + pos, limits_,
                             pickle::Reading{pickle::FrameMode::kBytesIO, true});
    if (!FindUnsafe(p.result.graph).empty()) {
      found.push_back(fmt::format("{}, which {}{}", what, DescribeEffects(p.result.graph),
                                  p.error.empty() ? "" : " before it fails"));
    }
    if (!p.error.empty()) {
      stopped = fmt::format("torch.load fails unpickling {}: {}", what, p.error);
      return std::nullopt;
    }
    pos += p.result.end + p.result.frame_rest;
    return std::move(p.result.graph);
  }

  // A count pickle (num_storages, num_tensors): an int, or nullopt (torch.load fails).
  std::optional<uint64_t> Count(const TarMember& m, uint64_t& pos, const std::string& what) {
    std::optional<pickle::Graph> g = Load(m, pos, what);
    if (!g) return std::nullopt;
    if (g->root == pickle::kNil || g->kind(g->root) != pickle::Kind::kInt ||
        g->at(g->root).integer < 0) {
      stopped = fmt::format("{} is not an int, so ckptool follows the member no further", what);
      return std::nullopt;
    }
    auto n = static_cast<uint64_t>(g->at(g->root).integer);
    if (n > kMaxFollowed) {
      stopped = fmt::format("{} is {}: ckptool follows no more than {}", what, n, kMaxFollowed);
      return std::nullopt;
    }
    return n;
  }

  static constexpr uint64_t kMaxFollowed = 1u << 20;  // storages or tensors

  // Advances `pos` over n bytes of the member, or says that they run past it.
  bool Skip(const TarMember& m, uint64_t& pos, uint64_t n, const std::string& what) {
    if (n > m.size - std::min(pos, m.size)) {
      stopped = fmt::format("{} runs past the end of its member", what);
      return false;
    }
    pos += n;
    return true;
  }

  // 'storages': a count; per storage (key, location, StorageClass) and the storage's int64
  // element count and bytes (UntypedStorage._new_with_file); a list of views.
  bool Storages() {
    const TarMember* m = Member("storages");
    if (m == nullptr) return false;
    uint64_t pos = 0;
    std::optional<uint64_t> n = Count(*m, pos, "its 'storages' member (the storage count)");
    if (!n) return false;
    for (uint64_t i = 0; i < *n; ++i) {
      std::string what = fmt::format("its 'storages' member (storage {} of {})", i + 1, *n);
      std::optional<pickle::Graph> g = Load(*m, pos, what);
      if (!g) return false;
      std::optional<DType> dtype;
      if (g->root != pickle::kNil && g->kind(g->root) == pickle::Kind::kTuple &&
          g->items(g->root).size() == 3) {
        pickle::NodeId type = g->items(g->root)[2];
        if (g->kind(type) == pickle::Kind::kGlobal) dtype = FromStorageClass(g->global_name(type));
      }
      if (!dtype || ElementSize(*dtype) == 0) {
        stopped = fmt::format("{} names no storage class ckptool knows", what);
        return false;
      }
      Bytes data = Data(*m);
      if (data.size() - std::min<uint64_t>(pos, data.size()) < 8) {
        stopped = fmt::format("{}: its element count runs past the end of the member", what);
        return false;
      }
      int64_t numel = LoadLE<int64_t>(data.data() + pos);
      pos += 8;
      uint64_t es = ElementSize(*dtype);
      if (numel < 0 || static_cast<uint64_t>(numel) > (m->size / es)) {
        stopped = fmt::format("{}: its {} elements run past the end of the member", what, numel);
        return false;
      }
      if (!Skip(*m, pos, static_cast<uint64_t>(numel) * es, what)) return false;
    }
    return Load(*m, pos, "its 'storages' member (the storage views)").has_value();
  }

  // 'tensors': a count; per tensor (key, storage_id, type), then int32 ndim, 4 bytes, ndim
  // int64 sizes, ndim int64 strides, an int64 storage offset.
  bool Tensors() {
    const TarMember* m = Member("tensors");
    if (m == nullptr) return false;
    uint64_t pos = 0;
    std::optional<uint64_t> n = Count(*m, pos, "its 'tensors' member (the tensor count)");
    if (!n) return false;
    for (uint64_t i = 0; i < *n; ++i) {
      std::string what = fmt::format("its 'tensors' member (tensor {} of {})", i + 1, *n);
      if (!Load(*m, pos, what)) return false;
      Bytes data = Data(*m);
      if (data.size() - std::min<uint64_t>(pos, data.size()) < 8) {
        stopped = fmt::format("{}: its dimension count runs past the end of the member", what);
        return false;
      }
      int32_t ndim = LoadLE<int32_t>(data.data() + pos);
      if (ndim < 0) {
        stopped = fmt::format("{} has {} dimensions (struct.error)", what, ndim);
        return false;
      }
      if (!Skip(*m, pos, 8 + 16 * static_cast<uint64_t>(ndim) + 8, what)) return false;
    }
    return true;
  }

  Bytes file_;
  const TarReading& tar_;
  const pickle::Limits& limits_;
};

// Refuses a file that Python's tarfile opens, saying what torch.load would do with it.
[[noreturn]] void RefuseTar(Bytes file, const TarReading& tar, const ReadOptions& options) {
  if (tar.empty) {
    Fail(
        "its first 512 bytes are all NUL: Python's tarfile, which torch.load tries first on a "
        "file it opens itself, reads an empty tar archive, and torch.load fails finding no "
        "'storages' member (KeyError). ckptool does not read pre-0.4 tar checkpoints");
  }
  std::string m =
      "a pre-0.4 tar checkpoint: Python's tarfile, which torch.load tries first on a file it "
      "opens itself, accepts its first 512-byte header";
  if (!tar.fails.empty()) {
    m += fmt::format(
        ", then fails listing its members ({}); torch.load then reads the file from its start "
        "as a pickle stream",
        tar.fails);
    std::string effects =
        EffectsOfFirstPickle(file.first(std::min<size_t>(file.size(), 64u << 20)), options.limits);
    if (!effects.empty()) m += ", whose first pickle " + effects;
  } else if (!tar.unfollowed.empty()) {
    m += fmt::format(" (ckptool does not follow its members past {})", tar.unfollowed);
  } else {
    TarPickles pickles(file, tar, options.limits);
    pickles.Follow();
    if (!pickles.found.empty()) {
      m += "; torch.load unpickles ";
      for (size_t i = 0; i < pickles.found.size(); ++i) {
        if (i) m += "; then ";
        m += pickles.found[i];
      }
    } else if (pickles.stopped.empty()) {
      m += "; no pickle torch.load would unpickle from it imports or calls anything unsafe";
    } else {
      m += "; no pickle ckptool followed imports or calls anything unsafe";
    }
    if (!pickles.stopped.empty()) m += fmt::format(" ({})", pickles.stopped);
  }
  Fail("{}. ckptool does not read this format", m);
}

bool IsMagic(const pickle::Graph& g) {
  return g.root != pickle::kNil && g.kind(g.root) == pickle::Kind::kBigInt &&
         g.text(g.root) == kMagicLE;
}

}  // namespace

bool LooksLikeTorchLegacy(Bytes file) {
  // A tar with a 'storages' member is a pre-0.4 checkpoint torch.load reads (and ckptool
  // refuses); a tar without one makes torch.load fail before it unpickles anything (or fall
  // back to the pickles below when tarfile fails). torch's tar writer made four members:
  // other tars are not walked to their end.
  if (file.size() >= kTarBlock && FromBuf(file.data())) {
    if (FindMember(ReadTar(file, 64), "storages") != nullptr) return true;
  }
  // The magic-number pickle is at most 28 bytes in any protocol (protocol 5: PROTO, FRAME
  // header, LONG1 with 10 bytes, STOP); parse a little more and see whether it is one.
  constexpr size_t kProbe = 64;
  if (file.empty() || !(file[0] == 0x80 || file[0] == 'L')) return false;
  try {
    pickle::Limits limits;
    limits.max_nodes = 16;
    limits.max_memo = 16;
    limits.max_depth = 4;
    return IsMagic(pickle::Parse(file.first(std::min(file.size(), kProbe)), 0, limits).graph);
  } catch (const Error&) {
    return false;
  }
}

TorchFile ReadTorchLegacy(Bytes file, const ReadOptions& options) {
  TorchFile tf;
  tf.container = Container::kLegacy;
  if (TarReading tar = ReadTar(file); tar.opens) RefuseTar(file, tar, options);
  Piece magic = ParseAt(file, 0, "magic number", options);
  if (!IsMagic(magic.graph)) {
    std::string effects = DescribeEffects(magic.graph);
    if (!effects.empty()) {
      Fail(
          "not a torch checkpoint: the first pickle is not torch's magic number; torch.load "
          "unpickles it before checking, and it {}",
          effects);
    }
    Fail("not a torch checkpoint: bad magic number");
  }
  uint64_t at = magic.size;
  Piece protocol = ParseAt(file, at, "protocol version", options);
  const pickle::Graph& pg = protocol.graph;
  if (pg.root == pickle::kNil || pg.kind(pg.root) != pickle::Kind::kInt ||
      pg.at(pg.root).integer != kProtocolVersion) {
    Fail("unsupported legacy protocol version {}", pg.Describe(pg.root));
  }
  at += protocol.size;
  Piece sys_info = ParseAt(file, at, "sys_info", options);
  {
    const pickle::Graph& g = sys_info.graph;
    if (g.root != pickle::kNil && g.kind(g.root) == pickle::Kind::kDict) {
      const auto& p = g.pairs(g.root);
      for (size_t i = 0; i + 1 < p.size(); i += 2) {
        if (g.kind(p[i]) == pickle::Kind::kStr && g.text(p[i]) == "little_endian" &&
            g.kind(p[i + 1]) == pickle::Kind::kBool && !g.at(p[i + 1]).boolean) {
          tf.byteorder = "big";
        }
      }
    }
  }
  at += sys_info.size;
  tf.AddRegion("legacy headers", at);
  CheckPlainPickle(protocol, "protocol version pickle", tf.model);
  CheckPlainPickle(sys_info, "sys_info pickle", tf.model);

  Piece obj = ParseAt(file, at, "object pickle", options);
  tf.pickle_offset = at;
  tf.pickle_size = obj.size;
  for (const std::string& odd : obj.anomalies) tf.model.problems.push_back({"object pickle", odd});
  tf.AddRegion("pickle", obj.size);
  at += obj.size;
  if (obj.leftover) {
    tf.model.problems.push_back(
        {"object pickle",
         fmt::format("{} values are left unused on the pickle's stack at STOP (a damaged "
                     "pickle: no pickler writes that)",
                     obj.leftover)});
  }
  tf.model.graph = std::move(obj.graph);
  BuildTensorTable(tf.model, /*legacy=*/true);

  // The object pickle's findings go with the error: a broken key list would hide them.
  auto fail_keys = [&](const std::string& why) {
    std::string effects = DescribeEffects(tf.model.graph);
    if (effects.empty()) Fail("{}", why);
    Fail("{}; the object pickle before it (which torch.load runs first) {}", why, effects);
  };
  Piece keys = [&] {
    try {
      return ParseAt(file, at, "storage key list", options);
    } catch (const Error& e) {
      fail_keys(e.what());
      throw;
    }
  }();
  tf.AddRegion("legacy headers", keys.size);
  at += keys.size;
  CheckPlainPickle(keys, "storage key list pickle", tf.model);
  const pickle::Graph& kg = keys.graph;
  if (kg.root == pickle::kNil || kg.kind(kg.root) != pickle::Kind::kList) {
    std::string effects = DescribeEffects(kg);
    fail_keys(effects.empty() ? "storage key list is not a list"
                              : "storage key list is not a list: the pickle there " + effects);
  }
  for (pickle::NodeId k : kg.items(kg.root)) {
    if (kg.kind(k) != pickle::Kind::kStr) Fail("storage key list holds a non-string");
    std::string key(kg.text(k));
    int32_t index = tf.model.FindStorage(key);
    if (index < 0) Fail("storage '{}' is listed but never referenced, so its size is unknown", key);
    Storage& s = tf.model.storages[index];
    if (s.present) Fail("storage '{}' is listed twice", key);
    uint64_t header_at = at;
    ByteCursor c(Slice(file, at, file.size() - at), at);
    uint64_t numel = WithContext(fmt::format("storage '{}'", key), [&] {
      int64_t n = c.ReadLE<int64_t>();
      if (n < 0) Fail("negative element count {}", n);
      return static_cast<uint64_t>(n);
    });
    if (numel != s.numel) {
      tf.model.problems.push_back(
          {fmt::format("storage '{}'", key),
           fmt::format("data header says {} elements, the pickle says {}", numel, s.numel)});
    }
    uint64_t nbytes = CheckedMul(numel, ElementSize(s.dtype));
    if (nbytes > c.remaining()) {
      Fail("storage '{}': {} bytes of data at offset {} run past the end of the file", key, nbytes,
           c.file_pos());
    }
    tf.AddRegion("storage headers", 8);
    s.present = true;
    s.data_offset = header_at + 8;
    at = s.data_offset + nbytes;
  }
  for (const Storage& s : tf.model.storages) {
    if (!s.present) {
      tf.model.problems.push_back({fmt::format("storage '{}'", s.key),
                                   "referenced by the pickle but has no data in the file"});
    }
  }
  if (at != file.size()) {
    tf.model.problems.push_back(
        {"<end>", fmt::format("{} unexpected bytes after the last storage", file.size() - at)});
  }
  return tf;
}

}  // namespace ckpt::torch
