#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <memory>
#include <set>
#include <vector>

#include "base/error.h"
#include "deepspeed/zero_checkpoint.h"
#include "io/range_stream.h"

namespace ckpt::deepspeed {

LogicalTensor ZeroLogicalTensor(const ZeroCheckpoint& z, const ZeroTensor& t) {
  // Where each piece starts, in elements.
  auto starts = std::make_shared<std::vector<uint64_t>>();
  uint64_t at = 0;
  for (const Piece& p : t.pieces) {
    starts->push_back(at);
    at += p.count;
  }
  if (at != t.numel)
    Fail("internal: tensor '{}' pieces hold {} of {} elements", t.name, at, t.numel);
  LogicalTensor lt{t.name, t.dtype, t.stored, t.shape, t.numel, nullptr};
  lt.read = [&z, &t, starts](uint64_t first, uint64_t count, const SpanSink& sink) {
    const uint64_t size = torch::ElementSize(t.stored);
    auto it = std::upper_bound(starts->begin(), starts->end(), first);
    size_t k = it == starts->begin() ? 0 : static_cast<size_t>(it - starts->begin()) - 1;
    for (uint64_t pos = first, end = first + count; pos < end; ++k) {
      if (k >= t.pieces.size()) Fail("internal: tensor '{}' has too few pieces", t.name);
      const Piece& p = t.pieces[k];
      uint64_t lo = pos - (*starts)[k], hi = std::min(p.count, end - (*starts)[k]);
      if (p.file == Piece::kZeros) {
        static constexpr std::array<uint8_t, 1 << 16> kZeroBytes{};
        for (uint64_t left = (hi - lo) * size; left;) {
          uint64_t n = std::min<uint64_t>(left, kZeroBytes.size());
          sink(Bytes(kZeroBytes.data(), n));
          left -= n;
        }
        pos = (*starts)[k] + hi;
        continue;
      }
      StreamRange(z.files[p.file]->map, p.offset + lo * size, (hi - lo) * size,
                  [&sink](uint64_t, Bytes b) { sink(b); });
      pos = (*starts)[k] + hi;
    }
  };
  return lt;
}

LogicalModel ZeroLogicalModel(const ZeroCheckpoint& z, bool exclude_frozen) {
  LogicalModel m;
  m.description =
      fmt::format("DeepSpeed {} stage {} checkpoint '{}', {} ranks",
                  z.universal ? "universal (ZeRO)" : "ZeRO", z.stage, z.tag, z.world_size);
  for (const auto& f : z.files) m.inputs.push_back(&f->map);
  for (const ZeroTensor& t : z.tensors) {
    if (exclude_frozen && t.kind == ZeroTensor::Kind::kFrozen) continue;
    m.tensors.push_back(ZeroLogicalTensor(z, t));
  }
  std::set<std::string_view> names;
  for (const LogicalTensor& t : m.tensors) names.insert(t.name);
  for (const auto& [alias, owner] : z.aliases) {
    if (names.count(owner)) m.aliases.emplace_back(alias, owner);
  }
  return m;
}

}  // namespace ckpt::deepspeed
