#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/human.h"
#include "base/size_parse.h"
#include "base/utf8.h"
#include "cli/commands.h"
#include "io/parallel.h"
#include "ops/export.h"

namespace ckpt::cli {

namespace {

struct ExportCliOptions {
  std::vector<std::string> sources;
  std::string to;
  std::string select;
  std::string dtype;
  std::string max_shard_size;
  std::string tag;
  bool exclude_frozen = false;
  unsigned threads = DefaultThreads();
  bool json = false;
};

int RunExport(const ExportCliOptions& o) {
  ExportOptions eo;
  eo.select = o.select;
  if (o.dtype == "bf16") eo.to = kernels::Half::kBFloat16;
  if (o.dtype == "fp16") eo.to = kernels::Half::kFloat16;
  if (!o.max_shard_size.empty()) eo.max_shard_size = ParseSize(o.max_shard_size);
  eo.threads = o.threads;
  eo.tag = o.tag;
  eo.exclude_frozen = o.exclude_frozen;
  ExportResult r = Export(o.sources, o.to, eo);
  for (const std::string& w : r.warnings) std::cerr << "ckptool: warning: " << Printable(w) << "\n";
  if (o.json) {
    nlohmann::ordered_json j = {{"selected", r.selected},
                                {"files", r.files},
                                {"tensors", r.tensors},
                                {"aliases", r.aliases},
                                {"bytes", r.bytes}};
    PrintJson(j);
    return 0;
  }
  std::cout << fmt::format(
      "Exported {} tensors ({}) from {}{} into:\n", r.tensors, HumanBytes(r.bytes),
      r.selected.empty() ? "the whole object"
      : r.selected.starts_with("DeepSpeed") || r.selected.starts_with("torch.")
          ? r.selected
          : "'" + r.selected + "'",
      r.aliases ? fmt::format(", {} tied names recorded as aliases", r.aliases) : "");
  for (const std::string& f : r.files) std::cout << "  " << f << "\n";
  return 0;
}

}  // namespace

Runner AddExport(CLI::App& app) {
  auto o = std::make_shared<ExportCliOptions>();
  app.add_option("sources", o->sources,
                 "Torch checkpoint file, folder of shards, or DeepSpeed ZeRO checkpoint (the "
                 "folder holding "
                 "'latest', or a tag folder)")
      ->required();
  app.add_option("--to", o->to,
                 "Output folder (model.safetensors or shards + index), a .safetensors file, or "
                 "(DeepSpeed ZeRO) a torch file: .pt, .pth, .bin, .ckpt")
      ->required();
  app.add_option(
      "--select", o->select,
      "Key path of the sub-object to export (default: state_dict, module, model... when present)");
  app.add_option("--dtype", o->dtype, "Also store float32 tensors as bf16 or fp16")
      ->check(CLI::IsMember({"bf16", "fp16"}));
  app.add_option("--max-shard-size", o->max_shard_size,
                 "Shard size, e.g. 5GB or 500MiB (KB/MB/GB are 10^3)");
  app.add_option("--tag", o->tag,
                 "DeepSpeed ZeRO: the tag folder to export (default: what 'latest' names)");
  app.add_flag("--exclude-frozen", o->exclude_frozen,
               "DeepSpeed ZeRO: leave frozen parameters out");
  app.footer(
      "A DeepSpeed ZeRO 1/2/3 checkpoint is consolidated as DeepSpeed's zero_to_fp32.py does: "
      "trainable "
      "parameters in float32 from the optimizer's fp32 partitions, buffers made float32, frozen "
      "parameters "
      "left in their 16-bit type, tied names as aliases; --dtype converts every floating tensor. "
      "--to model.pt writes that state dict as one torch file, as zero_to_fp32.py saves it.");
  app.add_option("-j,--threads", o->threads, "Threads")->capture_default_str();
  app.add_flag("--json", o->json, "Print a JSON report");
  return [o] { return RunExport(*o); };
}

}  // namespace ckpt::cli
