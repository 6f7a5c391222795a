// `ckptool reshard CKPT --to universal|zero`: engines/reshard.h.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/human.h"
#include "base/utf8.h"
#include "cli/commands.h"
#include "cluster/steps.h"
#include "cluster/world.h"
#include "engines/reshard.h"
#include "io/parallel.h"

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
  ReshardOptions ro;
  ro.output = o.output;
  ro.tag = o.tag;
  ro.threads = std::max(1u, o.threads);
  ro.force = o.force;
  ro.world_size = o.world_size;
  if (o.to == "zero" && o.world_size <= 0)
    Fail("--to zero needs --world-size M (the ranks to resume on)");
  if (o.to == "universal" && o.world_size > 0)
    Fail("--world-size is for --to zero: a universal checkpoint loads on any number of ranks");
  if (cluster::Distributed()) {
    // Every rank writes its share of the parameters; rank 0 checks, prepares and commits.
    ro.team.rank = cluster::Rank();
    ro.team.size = cluster::Size();
    ro.team.agree = [](const std::string& view, const std::string& summary) {
      cluster::Agree(view, summary);
      cluster::Collect("");
    };
    ro.team.decide = [](const std::string& value) { return cluster::Decide(value); };
    ro.team.confirm = [](const std::string& error) { return cluster::Confirm(error); };
  }
  const bool zero = o.to == "zero";
  ReshardResult r = zero ? ReshardToZero(o.checkpoint, ro) : ReshardToUniversal(o.checkpoint, ro);
  if (!cluster::IsRoot()) return 0;  // rank 0 reports
  if (zero) {
    if (o.json) {
      PrintJson(nlohmann::ordered_json{{"source", r.source},
                                       {"output", r.output},
                                       {"tag", r.tag},
                                       {"stage", r.stage},
                                       {"world_size", r.world_size},
                                       {"to_world_size", r.to_world_size},
                                       {"parameters", r.parameters},
                                       {"optimizer_state", r.keys},
                                       {"files", r.files},
                                       {"bytes", r.bytes}});
    } else if (!o.quiet) {
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
    }
    return 0;
  }
  if (o.json) {
    PrintJson(nlohmann::ordered_json{{"source", r.source},
                                     {"output", r.output},
                                     {"latest_universal", r.latest_universal},
                                     {"stage", r.stage},
                                     {"world_size", r.world_size},
                                     {"parameters", r.parameters},
                                     {"optimizer_state", r.keys},
                                     {"files", r.files},
                                     {"bytes", r.bytes}});
    return 0;
  }
  if (!o.quiet) {
    Out() << Printable(fmt::format(
                 "{}: ZeRO stage {} from {} ranks -> universal checkpoint {}: {} parameters "
                 "(fp32{}{}), {}, {}",
                 r.source, r.stage, r.world_size, r.output, r.parameters,
                 r.keys.empty() ? "" : ", ", fmt::join(r.keys, ", "), Count(r.files, "file"),
                 HumanBytes(r.bytes)))
          << "\n";
    Out() << Printable(fmt::format("{} names it: load it with \"checkpoint\": "
                                   "{{\"load_universal\": true}} on any number of ranks",
                                   r.latest_universal))
          << "\n";
  }
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
