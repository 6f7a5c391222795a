#include "reports/inspect_output.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/human.h"
#include "base/utf8.h"

namespace ckpt {

namespace {

void RollupTable(std::string& out, const char* title, const char* key_title,
                 const std::vector<Rollup>& rows, size_t top_n) {
  if (rows.empty()) return;
  out += fmt::format("\n  {}\n", title);
  out += fmt::format("    {:<28} {:>8} {:>12} {:>9} {:>12} {:>12} {:>12}\n", key_title, "tensors",
                     "tensor", "storages", "storage", "used", "wasted");
  size_t shown = 0;
  Rollup other{"[other]"};
  for (const Rollup& r : rows) {
    if (shown++ >= top_n) {
      other.tensors += r.tensors;
      other.tensor_bytes += r.tensor_bytes;
      other.storages += r.storages;
      other.storage_bytes += r.storage_bytes;
      other.used_bytes += r.used_bytes;
      continue;
    }
    out += fmt::format("    {:<28} {:>8} {:>12} {:>9} {:>12} {:>12} {:>12}\n",
                       r.key.empty() ? "<root>" : Printable(r.key), r.tensors,
                       HumanBytes(r.tensor_bytes), r.storages, HumanBytes(r.storage_bytes),
                       HumanBytes(r.used_bytes), HumanBytes(r.storage_bytes - r.used_bytes));
  }
  if (other.tensors || other.storages) {
    out += fmt::format("    {:<28} {:>8} {:>12} {:>9} {:>12} {:>12} {:>12}\n", other.key,
                       other.tensors, HumanBytes(other.tensor_bytes), other.storages,
                       HumanBytes(other.storage_bytes), HumanBytes(other.used_bytes),
                       HumanBytes(other.storage_bytes - other.used_bytes));
  }
}

}  // namespace

std::string RenderText(const FileReport& r, size_t top_n) {
  std::string out;
  // Every string that comes from the file goes through Printable: names may hold newlines
  // or terminal escape sequences.
  out += fmt::format("{}: {}, {} ({} bytes)", Printable(r.path), FormatName(r.format),
                     HumanBytes(r.file_bytes), r.file_bytes);
  if (r.pickle_protocol >= 0) out += fmt::format(", pickle protocol {}", r.pickle_protocol);
  out += "\n";

  out += "\n  FILE BYTES\n";
  for (const auto& [label, bytes] : r.byte_map) {
    out += fmt::format("    {:<28} {:>12} {:>7}\n", label, HumanBytes(bytes),
                       Percent(bytes, r.file_bytes));
  }
  out += fmt::format("    {:<28} {:>12} {:>7}\n", "TOTAL", HumanBytes(r.file_bytes), "100.0%");

  std::string names =
      r.tensor_names == r.distinct_tensors ? "" : fmt::format(" under {} names", r.tensor_names);
  out += fmt::format(
      "\n  {} tensors{} ({}) in {} storages ({}): {} used, {} wasted ({} of storage bytes)\n",
      r.distinct_tensors, names, HumanBytes(r.tensor_bytes), r.storage_count,
      HumanBytes(r.storage_bytes), HumanBytes(r.used_bytes), HumanBytes(r.wasted_bytes),
      Percent(r.wasted_bytes, r.storage_bytes));
  uint64_t shared = r.shared_storages;
  if (shared == 1) out += "  1 storage is shared by several tensors\n";
  if (shared > 1) out += fmt::format("  {} storages are shared by several tensors\n", shared);

  RollupTable(out, "BY DTYPE", "dtype", r.by_dtype, top_n);
  RollupTable(out, "BY TOP-LEVEL KEY", "key", r.by_key, top_n);

  if (!r.tensors.empty()) {
    std::vector<const TensorRow*> rows;
    for (const TensorRow& t : r.tensors) rows.push_back(&t);
    std::stable_sort(rows.begin(), rows.end(),
                     [](const TensorRow* a, const TensorRow* b) { return a->bytes > b->bytes; });
    size_t n = std::min(top_n, rows.size());
    out += fmt::format("\n  LARGEST TENSORS (top {} of {})\n", n, r.tensor_names);
    for (size_t i = 0; i < n; ++i) {
      const TensorRow& t = *rows[i];
      out += fmt::format("    {:>12}  {:<9} {:<20} {}{}\n", HumanBytes(t.bytes), t.dtype,
                         ShapeText(t.shape), t.name.empty() ? "<root>" : Printable(t.name),
                         t.kind == "tensor" ? "" : fmt::format("  ({})", t.kind));
    }
  }

  if (!r.globals.empty()) {
    out += "\n  GLOBALS (what unpickling imports)\n";
    for (const GlobalRow& g : r.globals) {
      const char* mark = "";
      switch (g.verdict) {
        case torch::Verdict::kUnsafe:
          mark = "UNSAFE: can run code or reach the system";
          break;
        case torch::Verdict::kCalls:
          mark = "UNSAFE: called when loaded, on no allowlist";
          break;
        case torch::Verdict::kReconstructed:
          mark = "UNSAFE: rebuilt without a call (its __setstate__ runs), on no allowlist";
          break;
        case torch::Verdict::kReferenced:
          mark = "not on torch's weights_only allowlist";
          break;
        case torch::Verdict::kAllowed:
          mark = "on ckptool's allowlist; not on torch's weights_only allowlist";
          break;
        case torch::Verdict::kTrusted:
          mark = "trusted (--trust); not on torch's weights_only allowlist";
          break;
        case torch::Verdict::kWeightsOnly:
          break;
      }
      std::string line = fmt::format("    {:<56} {}", Printable(g.name), mark);
      while (line.ends_with(' ')) line.pop_back();
      out += line + "\n";
    }
  }
  if (!r.unsafe_calls.empty()) {
    out +=
        "\n  UNSAFE CALLS (what loading calls that can run code: globals on no allowlist, computed "
        "objects, unsafe attribute reads)\n";
    constexpr size_t kShown = 20;
    for (size_t i = 0; i < r.unsafe_calls.size() && i < kShown; ++i) {
      out += fmt::format("    pickle offset {}: {}\n", r.unsafe_calls[i].pickle_offset,
                         Printable(r.unsafe_calls[i].what));
    }
    if (r.unsafe_calls.size() > kShown)
      out += fmt::format("    ... and {} more\n", r.unsafe_calls.size() - kShown);
  }
  if (!r.metadata.empty()) {
    out += "\n  METADATA\n";
    for (const auto& [k, v] : r.metadata)
      out += fmt::format("    {} = {}\n", Printable(k), Printable(v));
  }
  for (const std::string& n : r.notes) out += fmt::format("  note: {}\n", Printable(n));
  for (const auto& p : r.problems) {
    out += fmt::format("  problem: {}: {}\n", Printable(p.where), Printable(p.what));
  }
  return out;
}

void WriteJson(JsonStream& out, const FileReport& r) {
  using json = nlohmann::ordered_json;
  out.BeginObject();
  out.Member("path", r.path);
  out.Member("format", FormatName(r.format));
  if (r.pickle_protocol >= 0) out.Member("pickle_protocol", r.pickle_protocol);
  out.Member("file_bytes", r.file_bytes);
  out.Member("storage_bytes", r.storage_bytes);
  out.Member("used_bytes", r.used_bytes);
  out.Member("wasted_bytes", r.wasted_bytes);
  out.Member("tensor_bytes", r.tensor_bytes);
  out.Member("distinct_tensors", r.distinct_tensors);
  out.Member("metadata_bytes", r.metadata_bytes);
  out.BeginArray("byte_map");
  for (const auto& [label, bytes] : r.byte_map) out.Value({{"label", label}, {"bytes", bytes}});
  out.End();
  out.BeginArray("tensors");
  // 10^5 rows: written field by field, without a json value per row.
  for (const TensorRow& t : r.tensors) {
    out.BeginObject();
    out.Member("name", t.name);
    out.Member("dtype", t.dtype);
    out.Member("kind", t.kind);
    out.Member("shape", t.shape);
    out.Member("stride", t.stride);
    if (t.storage.empty()) {
      out.Member("storage", nullptr);
    } else {
      out.Member("storage", t.storage);
    }
    out.Member("offset", t.offset);
    out.Member("bytes", t.bytes);
    out.Member("requires_grad", t.requires_grad);
    out.End();
  }
  out.End();
  out.BeginArray("storages");
  for (const StorageRow& s : r.storages) {
    out.BeginObject();
    out.Member("key", s.key);
    out.Member("dtype", s.dtype);
    out.Member("location", s.location);
    out.Member("bytes", s.bytes);
    out.Member("used_bytes", s.used_bytes);
    out.Member("views", s.views);
    out.Member("compressed", s.compressed);
    out.End();
  }
  out.End();
  auto rollups = [&out](std::string_view key, const std::vector<Rollup>& rows) {
    out.BeginArray(key);
    for (const Rollup& row : rows) {
      out.Value({{"key", row.key},
                 {"tensors", row.tensors},
                 {"tensor_bytes", row.tensor_bytes},
                 {"storages", row.storages},
                 {"storage_bytes", row.storage_bytes},
                 {"used_bytes", row.used_bytes}});
    }
    out.End();
  };
  rollups("by_dtype", r.by_dtype);
  rollups("by_key", r.by_key);
  json globals = json::array(), unsafe = json::array(), refused = json::array(),
       detail = json::array();
  for (const GlobalRow& g : r.globals) {
    globals.push_back(g.name);
    detail.push_back({{"name", g.name},
                      {"raw", g.raw},
                      {"class", torch::GlobalClassName(g.cls)},
                      {"verdict", torch::VerdictName(g.verdict)},
                      {"getattr", g.getattr}});
    if (g.cls == torch::GlobalClass::kUnsafe) unsafe.push_back(g.name);
    if (g.cls != torch::GlobalClass::kTorchAllowed) refused.push_back(g.name);
  }
  out.Member("globals", globals);
  out.Member("unsafe_globals", unsafe);
  out.Member("weights_only_refused_globals", refused);
  out.Member("globals_detail", detail);
  out.BeginArray("unsafe_calls");
  for (const UnsafeCallRow& c : r.unsafe_calls)
    out.Value({{"pickle_offset", c.pickle_offset}, {"what", c.what}});
  out.End();
  out.Member("metadata", r.metadata);
  out.Member("notes", r.notes);
  out.BeginArray("problems");
  for (const auto& p : r.problems) out.Value({{"where", p.where}, {"what", p.what}});
  out.End();
  out.End();
}

}  // namespace ckpt
