#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/human.h"
#include "base/size_parse.h"
#include "cli/commands.h"
#include "io/parallel.h"
#include "jobs/export.h"

namespace ckpt::cli {

namespace {

struct ExportCliOptions {
  std::vector<std::string> sources;
  std::string to;
  std::string select;
  bool all = false;
  std::string dtype;
  std::string max_shard_size;
  std::string tag;
  bool exclude_frozen = false;
  std::vector<std::string> strip_prefixes;
  std::vector<std::string> config_from;
  unsigned threads = DefaultThreads();
  bool json = false;
  bool force = false;
  bool dry_run = false;
  bool quiet = false;
};

int RunExport(const ExportCliOptions& o) {
  jobs::ExportJobOptions jo;
  ExportOptions& eo = jo.engine;
  eo.select = o.select;
  eo.all = o.all;
  eo.dry_run = o.dry_run;
  eo.to = kernels::ParseHalf(o.dtype);
  if (!o.max_shard_size.empty()) {
    try {
      eo.max_shard_size = ParseSize(o.max_shard_size);
    } catch (const Error& e) {
      PrintError(fmt::format("--max-shard-size: {}", e.what()));
      return 2;
    }
  }
  eo.threads = o.threads;
  eo.tag = o.tag;
  eo.exclude_frozen = o.exclude_frozen;
  eo.strip_prefixes = o.strip_prefixes;
  eo.config_from = o.config_from;
  jo.sources = o.sources;
  jo.to = o.to;
  jo.force = o.force;
  jobs::ExportReport report = jobs::Export(jo);
  if (!report.reports) return 0;  // rank 0 reports
  const ExportResult& r = report.result;
  for (const std::string& w : r.warnings) PrintWarning(w);
  if (o.json) {
    PrintJson(jobs::ToJson(report));
    return 0;
  }
  if (o.quiet) return 0;
  const std::string what =
      r.selected.empty() ? r.source : fmt::format("'{}' of {}", r.selected, r.source);
  if (o.dry_run) {
    Out() << fmt::format("Would export {} ({}) from {} to {} (dry run: nothing written)\n",
                         Count(r.tensors, "tensor"), HumanBytes(r.bytes), what, o.to);
    return 0;
  }
  Out() << fmt::format(
      "Exported {} ({}) from {}{} into:\n", Count(r.tensors, "tensor"), HumanBytes(r.bytes), what,
      r.aliases ? fmt::format(" ({} recorded as aliases)", Count(r.aliases, "tied name")) : "");
  for (const std::string& f : r.files) Out() << "  " << f << "\n";
  if (r.archive_plain_bytes + r.archive_backed_bytes)
    Out() << fmt::format(
        "Read in place from the archive: {} of tensors decoded from its chunks as read, {} of "
        "headers decoded into memory\n",
        HumanBytes(r.archive_backed_bytes), HumanBytes(r.archive_plain_bytes));
  return 0;
}

}  // namespace

Runner AddExport(CLI::App& app) {
  auto o = std::make_shared<ExportCliOptions>();
  app.add_option("sources", o->sources,
                 "Torch checkpoint file, folder of shards, DeepSpeed ZeRO checkpoint (the "
                 "folder holding 'latest', or a tag folder), torch.distributed.checkpoint "
                 "folder, or a .ckz archive of any of them (read in place)")
      ->required();
  app.add_option("-o,--output,--to", o->to,
                 "Output folder (model.safetensors or shards + index), a .safetensors file, or "
                 "a torch file: .pt, .pth, .bin, .ckpt")
      ->required();
  app.add_option(
      "--select", o->select,
      "Key path of the sub-object to export (default: state_dict, module, model... when present)");
  app.add_flag("--all", o->all,
               "Everything the checkpoint holds: training state (optimizer, scheduler, RNG) and "
               "training-only files too, not just the model");
  app.add_option("--dtype", o->dtype,
                 "Store floating-point tensors (float32, float16, bfloat16) as bf16 or fp16")
      ->check(CLI::IsMember({"bf16", "fp16"}));
  app.add_option("--max-shard-size", o->max_shard_size,
                 "Shard size, e.g. 5GB or 500MiB (KB/MB/GB are 10^3)");
  app.add_option("--tag", o->tag,
                 "DeepSpeed ZeRO: the tag folder to export (default: what 'latest' names)");
  app.add_flag("--exclude-frozen", o->exclude_frozen,
               "DeepSpeed ZeRO: leave frozen parameters out");
  app.add_option("--strip-prefix", o->strip_prefixes,
                 "Remove PREFIX from the start of every tensor name that has it (repeatable, "
                 "applied in order): module. (DDP, DeepSpeed wrappers), _orig_mod. "
                 "(torch.compile)");
  app.add_option("--config-from", o->config_from,
                 "A model folder (or a config.json / tokenizer file) whose config.json, "
                 "generation_config.json and tokenizer files go into the output folder, before "
                 "the sources' own (for ZeRO, DCP and torch-file sources; repeatable)");
  app.add_flag("-f,--force", o->force,
               "Replace an existing output (a previous export's files go as a whole)");
  app.add_flag("--dry-run", o->dry_run, "Say what would be written; write nothing");
  app.add_flag("-q,--quiet", o->quiet, "Print only errors");
  app.footer(
      "A DeepSpeed ZeRO 1/2/3 checkpoint is consolidated as DeepSpeed's zero_to_fp32.py does: "
      "trainable "
      "parameters in float32 from the optimizer's fp32 partitions, floating buffers made float32 "
      "(integer ones kept), frozen "
      "parameters "
      "left in their 16-bit type, tied names as aliases; --dtype converts every floating tensor. "
      "--to model.pt writes that state dict as one torch file, as zero_to_fp32.py saves it.");
  app.add_option("-j,--threads", o->threads, "Threads")->capture_default_str();
  app.add_flag("--json", o->json, "Print a JSON report");
  return [o] { return RunExport(*o); };
}

}  // namespace ckpt::cli
