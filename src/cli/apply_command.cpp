#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/human.h"
#include "base/utf8.h"
#include "cli/commands.h"
#include "cli/policy_cli.h"
#include "policy/apply.h"

namespace ckpt::cli {

namespace {

struct ApplyCliOptions {
  PolicyCliOptions p;
  bool dry_run = false;
  bool check = false;
  std::vector<std::string> hold;
};

int RunCheck(const ApplyCliOptions& o, const policy::Policy& p) {
  if (o.p.json) {
    nlohmann::ordered_json j = p.Describe();
    j["valid"] = true;
    PrintJson(j);
  } else {
    Out() << Printable(fmt::format("{}: valid policy", p.file)) << "\n";
    nlohmann::ordered_json d = p.Describe();
    Out() << fmt::format("  layout: {}\n", d["layout"].get<std::string>());
    if (p.settle_seconds) Out() << fmt::format("  settle_seconds: {:g}\n", *p.settle_seconds);
    if (p.retention) {
      Out() << fmt::format("  retention: keep_last {}, keep_every {}, keep {}\n",
                           p.retention->keep_last, p.retention->keep_every,
                           d["retention"]["keep"].dump());
    }
    for (const auto& s : d["steps"]) {
      Out() << Printable(fmt::format("  {}: {}", s["step"].get<std::string>(), s["options"].dump()))
            << "\n";
    }
  }
  return 0;
}

int RunApply(const ApplyCliOptions& o) {
  std::optional<policy::Policy> p = ReadPolicy(o.p, o.check && o.p.json);
  if (!p) return 1;
  if (o.check) return RunCheck(o, *p);
  GracefulStop graceful;
  ApplyOptions ao;
  ao.dry_run = o.dry_run;
  ao.yes = o.p.yes;
  ao.retry_failed = o.p.retry_failed;
  ao.threads = o.p.threads;
  ao.settle_seconds = SettleSeconds(o.p, *p);
  ao.stop = &graceful.stop();
  ao.hold = o.hold;
  bool json = o.p.json;
  ao.log = [json, quiet = o.p.quiet](const ApplyEvent& e) {
    if (!quiet || e.kind == "failed" || e.kind == "damaged") PrintEvent(e, json, false);
  };
  Applier applier(o.p.root, *p, ao);
  PassResult r = applier.RunPass();
  std::string verb = o.dry_run ? "would free" : "freed";
  if (json) {
    nlohmann::ordered_json j = {
        {"event", "summary"},   {"dry_run", o.dry_run},         {"steps", r.steps_run},
        {"deleted", r.deleted}, {"failed", r.failures},         {"waiting", r.waiting},
        {"damaged", r.damaged}, {"bytes_freed", r.bytes_freed}, {"stopped", r.stopped}};
    Out() << j.dump() << std::endl;
  } else if (!o.p.quiet || r.failures) {
    Out() << fmt::format(
        "{}{} {}, {} {}, {} waiting, {} failed{}; {} {}{}\n",
        o.dry_run    ? "Dry run: "
        : r.failures ? "Finished with failures: "
                     : "Done: ",
        Count(r.steps_run, "step"), o.dry_run ? "planned" : "run", Count(r.deleted, "checkpoint"),
        o.dry_run ? "to delete" : "deleted", r.waiting, r.failures,
        r.damaged ? fmt::format(" ({} damaged)", r.damaged) : "", verb, HumanBytes(r.bytes_freed),
        r.stopped ? " (stopped by a signal before the end: run again to finish)" : "");
    if (r.not_confirmed) {
      Out() << fmt::format(
          "{} retention would delete, kept: deleting needs --yes, or delete = true in "
          "[retention]\n",
          Count(r.not_confirmed, "checkpoint"));
    }
  }
  if (r.stopped) return 130;
  return r.failures ? 1 : 0;
}

}  // namespace

Runner AddApply(CLI::App& app) {
  auto o = std::make_shared<ApplyCliOptions>();
  AddPolicyFlags(app, &o->p);
  app.add_flag("--dry-run", o->dry_run,
               "Print the plan and the bytes it would free; change nothing");
  app.add_flag("--check", o->check, "Validate the policy file only; touch nothing");
  app.add_option("--hold", o->hold,
                 "A checkpoint (entry name in ROOT) a trainer still needs: kept, no step runs on "
                 "it this pass (repeatable)");
  app.footer(
      "Runs the policy (ROOT/ckptool.toml or --policy) once over every complete checkpoint "
      "under ROOT: retention as `ckptool prune` plans it, then per checkpoint shrink, convert, "
      "export, verify, and strip / compress once it is older than the newest N. Each step "
      "runs once per checkpoint (ROOT/.ckptool/state.json records it); a second run does "
      "nothing and an interrupted one resumes. A checkpoint that fails verify is reported, kept, "
      "not counted by retention, and no step runs on it. Exit 1 when a step failed or a "
      "checkpoint is damaged.");
  return [o] { return RunApply(*o); };
}

}  // namespace ckpt::cli
