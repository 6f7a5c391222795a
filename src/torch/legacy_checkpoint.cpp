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
#include <fmt/format.h>

#include <algorithm>

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

bool IsMagic(const pickle::Graph& g) {
  return g.root != pickle::kNil && g.kind(g.root) == pickle::Kind::kBigInt &&
         g.text(g.root) == kMagicLE;
}

}  // namespace

bool LooksLikeTorchLegacy(Bytes file) {
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
  if (file.size() > 262 && AsText(file.subspan(257, 5)) == "ustar") {
    Fail("this is a pre-0.4 tar-format torch checkpoint, which is not supported");
  }
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
