// `ckptool reshard CKPT --to universal|zero`: the reshard job (jobs/reshard.h), printed.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/human.h"
#include "base/utf8.h"
#include "cli/commands.h"
#include "io/parallel.h"
#include "jobs/reshard.h"

namespace ckpt::cli {

namespace {

struct ReshardCliOptions {
  std::string checkpoint;
  std::string to;
  std::string output;
  std::string tag;
  int world_size = 0;
  unsigned threads = DefaultThreads();
  bool force = false;
  bool json = false;
  bool quiet = false;
};

int RunReshard(const ReshardCliOptions& o) {
  jobs::ReshardJobOptions jo;
  jo.engine.output = o.output;
  jo.engine.tag = o.tag;
  jo.engine.threads = o.threads;
  jo.engine.force = o.force;
  jo.engine.world_size = o.world_size;
  jo.checkpoint = o.checkpoint;
  jo.to = o.to == "zero" ? jobs::ReshardTo::kZero : jobs::ReshardTo::kUniversal;
  jobs::ReshardReport report = jobs::Reshard(jo);
  if (!report.reports) return 0;  // rank 0 reports
  const ReshardResult& r = report.result;
  if (o.json) {
    PrintJson(jobs::ToJson(report));
    return 0;
  }
  if (o.quiet) return 0;
  if (report.to == jobs::ReshardTo::kZero) {
    Out() << Printable(fmt::format(
                 "{}: ZeRO stage {} from {} ranks -> {} ranks in {}: {} parameters (fp32{}{}), "
                 "{}, {}",
                 r.source, r.stage, r.world_size, r.to_world_size, r.output, r.parameters,
                 r.keys.empty() ? "" : ", ", fmt::join(r.keys, ", "), Count(r.files, "file"),
                 HumanBytes(r.bytes)))
          << "\n";
    Out() << Printable(fmt::format("resume it on {} ranks: load_checkpoint(\"{}\") (tag {})",
                                   r.to_world_size, r.output, r.tag))
          << "\n";
    return 0;
  }
  Out() << Printable(fmt::format(
               "{}: ZeRO stage {} from {} ranks -> universal checkpoint {}: {} parameters "
               "(fp32{}{}), {}, {}",
               r.source, r.stage, r.world_size, r.output, r.parameters, r.keys.empty() ? "" : ", ",
               fmt::join(r.keys, ", "), Count(r.files, "file"), HumanBytes(r.bytes)))
        << "\n";
  Out() << Printable(fmt::format("{} names it: load it with \"checkpoint\": "
                                 "{{\"load_universal\": true}} on any number of ranks",
                                 r.latest_universal))
        << "\n";
  return 0;
}

}  // namespace

Runner AddReshard(CLI::App& app) {
  auto o = std::make_shared<ReshardCliOptions>();
  app.add_option("checkpoint", o->checkpoint,
                 "DeepSpeed ZeRO checkpoint: the folder holding 'latest', or a tag folder")
      ->required();
  app.add_option("--to", o->to,
                 "What to write: universal (DeepSpeed's universal checkpoint, any world size) or "
                 "zero (native ZeRO rank files for --world-size ranks)")
      ->required()
      ->check(CLI::IsMember({"universal", "zero"}));
  app.add_option("--world-size", o->world_size,
                 "--to zero: the number of data-parallel ranks to write rank files for");
  app.add_option("-o,--output", o->output,
                 "universal: the checkpoint's folder (default: the tag folder's name + "
                 "'_universal', beside it; latest_universal is written beside it). zero: the "
                 "DeepSpeed folder to write, holding the tag folder and 'latest' (default: the "
                 "source's name + '-<M>ranks', beside it)");
  app.add_option("--tag", o->tag, "The tag folder to read (default: what 'latest' names)");
  app.add_option("-j,--threads", o->threads, "Threads (parameters written side by side)")
      ->capture_default_str();
  app.add_flag("-f,--force", o->force,
               "Replace an existing output folder (and a latest_universal naming another)");
  app.add_flag("--json", o->json, "Print a JSON report");
  app.add_flag("-q,--quiet", o->quiet, "Print only errors");
  app.footer(
      "--to universal writes the layout DeepSpeed's ds_to_universal.py writes and "
      "load_checkpoint reads with \"checkpoint\": {\"load_universal\": true}: "
      "zero/<param>/fp32.pt and one file per optimizer state key (the checkpoint's own: Adam's, "
      "SGD's...), step.pt, zero/optimizer_state.pt, the model states files, and "
      "latest_universal. --to zero writes the rank files M ranks would have saved (for "
      "loaders without universal checkpoints, such as Lightning's DeepSpeedStrategy). No "
      "pickle is run, no temporary copy is made. See docs/reshard.md.");
  return [o] { return RunReshard(*o); };
}

}  // namespace ckpt::cli
