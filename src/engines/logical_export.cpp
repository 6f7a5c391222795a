#include "engines/logical_export.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_set>

#include "base/error.h"
#include "base/perf.h"
#include "io/atomic_output.h"
#include "io/parallel_crc.h"
#include "writers/conversion_tally.h"
#include "writers/element_convert.h"
#include "writers/safetensors_output.h"
#include "writers/torch_output.h"

namespace ckpt {

namespace {

using torch::DType;

// Writes output bytes [offset, offset + length) of `t` (as `to`) at `dst`; returns their CRC.
uint32_t WriteRange(const LogicalTensor& t, DType to, AtomicOutput& out, uint64_t dst,
                    uint64_t offset, uint64_t length, kernels::ConversionLoss* loss) {
  constexpr uint64_t kStep = 1 << 20;  // input bytes converted at a time
  const uint64_t in_size = torch::ElementSize(t.stored), out_size = torch::ElementSize(to);
  uint32_t crc = 0;
  uint64_t written = 0;
  t.read(offset / out_size, length / out_size, [&](Bytes span) {
    for (uint64_t at = 0; at < span.size();) {
      uint64_t n = std::min<uint64_t>(span.size() - at, kStep / in_size * in_size);
      uint32_t c = WriteConverted(out, dst + written, span.subspan(at, n), t.stored, to, loss);
      uint64_t w = n / in_size * out_size;
      crc = written ? Crc32Combine(crc, c, w) : c;
      written += w;
      at += n;
    }
  });
  if (written != length) Fail("internal: tensor '{}' gave {} of {} bytes", t.name, written, length);
  return crc;
}

void AddConversionWarning(const ConversionTally& tally, const LogicalModel& m,
                          std::optional<DType> half, ExportResult& r) {
  if (!half) return;
  std::string w = tally.Warning(*torch::HalfOf(*half), [&](size_t i) { return m.tensors[i].name; });
  if (!w.empty()) r.warnings.push_back(std::move(w));
}

}  // namespace

bool IsTorchOutputPath(const std::string& to) {
  for (const char* ext : {".pt", ".pth", ".bin", ".ckpt"}) {
    if (to.ends_with(ext)) return true;
  }
  return false;
}

TensorSource LogicalSource(const LogicalTensor& t, DType out) {
  if (!CanConvert(t.stored, out))
    Fail("tensor '{}': cannot make {} of {}", t.name, torch::Name(out), torch::Name(t.stored));
  TensorSource src{t.name, out, t.shape, t.numel * torch::ElementSize(out), t.whole, nullptr};
  src.write = [&t, out](AtomicOutput& o, uint64_t dst, uint64_t off, uint64_t len) {
    return WriteRange(t, out, o, dst, off, len, nullptr);
  };
  return src;
}

ExportResult ExportLogical(const LogicalModel& m, const std::string& to, const ExportOptions& o) {
  ExportResult r;
  r.warnings = m.warnings;
  std::optional<DType> half;
  if (o.to) half = torch::DTypeOf(*o.to);
  const bool torch_output = IsTorchOutputPath(to);
  PerfTimer timer("plan and write");
  std::vector<TensorSource> outputs;
  outputs.reserve(m.tensors.size());
  std::unordered_set<std::string_view> written;
  written.reserve(m.tensors.size());
  ConversionTally tally(m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const LogicalTensor& t = m.tensors[i];
    DType out_dtype = t.dtype;
    // --dtype stores every floating tensor that one rounding makes the half type (float32,
    // float16, bfloat16; not float64).
    if (half && torch::IsFloatingPoint(t.dtype) && CanConvert(t.stored, *half)) out_dtype = *half;
    if (!CanConvert(t.stored, out_dtype))
      Fail("tensor '{}': cannot make {} of {}", t.name, torch::Name(out_dtype),
           torch::Name(t.stored));
    if (!torch_output && torch::Info(out_dtype).safetensors.empty())
      Fail("tensor '{}': safetensors has no {} dtype", t.name, torch::Name(out_dtype));
    uint64_t out_size = torch::ElementSize(out_dtype);
    TensorSource src{t.name, out_dtype, t.shape, t.numel * out_size, t.whole, nullptr};
    if (t.input >= 0 && !t.whole) {
      src.input = m.inputs[static_cast<size_t>(t.input)];
      src.input_range = {t.offset, t.numel * torch::ElementSize(t.stored)};
    }
    // Every narrowing to a half type is measured (from float32, or between the two halves).
    bool measured = out_dtype != t.stored && torch::HalfOf(out_dtype).has_value();
    src.write = [&t, out_dtype, measured, i, &tally](AtomicOutput& out, uint64_t dst, uint64_t off,
                                                     uint64_t len) {
      kernels::ConversionLoss loss;
      uint32_t crc = WriteRange(t, out_dtype, out, dst, off, len, measured ? &loss : nullptr);
      if (measured) tally.Add(i, loss);
      return crc;
    };
    outputs.push_back(std::move(src));
    written.insert(t.name);
  }
  // When one input holds each tensor: read in the inputs' order, each by position in it.
  if (!m.tensors.empty() && std::all_of(m.tensors.begin(), m.tensors.end(),
                                        [](const LogicalTensor& t) { return t.input >= 0; })) {
    std::vector<uint32_t> by_position(m.tensors.size());
    for (uint32_t i = 0; i < by_position.size(); ++i) by_position[i] = i;
    std::sort(by_position.begin(), by_position.end(), [&m](uint32_t a, uint32_t b) {
      const LogicalTensor &x = m.tensors[a], &y = m.tensors[b];
      return std::tie(x.input, x.offset) < std::tie(y.input, y.offset);
    });
    for (uint32_t rank = 0; rank < by_position.size(); ++rank)
      outputs[by_position[rank]].read_order = rank;
  }
  std::map<std::string, std::string> aliases;
  for (const auto& [alias, owner] : m.aliases) {
    if (written.count(owner)) aliases[alias] = owner;
  }
  r.tensors = outputs.size();
  r.aliases = aliases.size();
  if (o.dry_run) {
    for (const TensorSource& t : outputs) r.bytes += t.size;
    return r;
  }
  if (torch_output) {
    if (o.max_shard_size)
      throw UsageError(fmt::format("--max-shard-size applies to safetensors output, not {}", to));
    TorchOutputOptions to_opts;
    to_opts.threads = o.threads;
    to_opts.inputs = m.inputs;
    r.bytes = WriteTorchModel(to, std::move(outputs), aliases, to_opts);
    r.files = {to};
    AddConversionWarning(tally, m, half, r);
    return r;
  }
  SafetensorsModelOptions so;
  so.max_shard_size = o.max_shard_size;
  so.threads = o.threads;
  so.inputs = m.inputs;
  so.team = o.team;
  SafetensorsModel out = WriteSafetensorsModel(to, std::move(outputs), aliases, so);
  r.files = out.files;
  r.bytes = out.bytes;
  AddConversionWarning(tally, m, half, r);
  return r;
}

}  // namespace ckpt
