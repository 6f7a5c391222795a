#include "policy/apply.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "base/error.h"
#include "base/human.h"
#include "base/names.h"
#include "checkpoint/discovery.h"
#include "checkpoint/integrity.h"
#include "checkpoint/verify.h"
#include "compress/archive.h"
#include "dcp/dcp_checkpoint.h"
#include "deepspeed/zero_checkpoint.h"
#include "engines/compress.h"
#include "engines/convert.h"
#include "engines/convert_tree.h"
#include "engines/dcp_strip.h"
#include "engines/export.h"
#include "engines/prune.h"
#include "engines/shrink.h"
#include "engines/strip.h"
#include "file/checkpoint_file.h"
#include "io/folders.h"
#include "io/parallel.h"
#include "io/temp_files.h"
#include "policy/apply_steps.h"
#include "policy/completeness.h"
#include "policy/ledger.h"
#include "reports/dcp_report.h"
#include "writers/output_set.h"

namespace ckpt {

namespace fs = std::filesystem;
using apply_steps::Abs;
using apply_steps::Entry;
using apply_steps::Inside;
using apply_steps::StepContext;
using apply_steps::StepOutcome;
using policy::Fingerprint;
using policy::Policy;
using policy::Step;
using policy::StepName;

namespace {

// Options as the ledger keeps them (read back, their keys come in another order).
bool SameOptions(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b) {
  return nlohmann::json(a) == nlohmann::json(b);
}

// Is `step` due on a checkpoint of this rank (1 = newest)?
bool Due(const Policy& p, Step step, uint64_t rank) {
  if (!p.Has(step)) return false;
  if (step == Step::kStrip) return rank > p.strip->older_than_newest;
  if (step == Step::kCompress) return rank > p.compress->older_than_newest;
  return true;
}

}  // namespace

uint64_t KillAtSave() {
  const char* v = std::getenv("CKPTOOL_TEST_KILL_AT_SAVE");
  return v ? std::strtoull(v, nullptr, 10) : 0;
}

struct Applier::State {
  std::string root;
  Policy policy;
  ApplyOptions o;
  std::optional<policy::RootLock> lock;  // a dry run takes none and creates nothing
  policy::Ledger ledger;
  policy::Completeness completeness;
  std::map<std::string, std::string> waiting_logged;  // watch: log a wait once per reason
  std::set<std::string> failure_logged;
  bool dirty = false;
  uint64_t saves = 0;
  uint64_t kill_at_save = KillAtSave();

  State(std::string r, Policy p, ApplyOptions opt)
      : root(std::move(r)),
        policy(std::move(p)),
        o(std::move(opt)),
        completeness(root, CompletenessOptions()) {
    if (!o.dry_run) lock.emplace(root);
    ledger = policy::Ledger::Load(root);
  }

  policy::Completeness::Options CompletenessOptions() {
    policy::Completeness::Options co;
    co.layout = policy.layout;
    co.settle_seconds = o.settle_seconds;
    co.observe = o.observe;
    co.outputs_inside = [this](const std::string& name) {
      Entry e;
      e.name = name;
      e.path = (fs::path(root) / name).string();
      std::error_code ec;
      e.folder = fs::is_directory(fs::symlink_status(e.path, ec));
      e.step = StepFromName(name);
      return OutputsInside(policy, e);
    };
    co.recorded = [this](const std::string& name) -> const Fingerprint* {
      auto it = ledger.checkpoints().find(name);
      if (it == ledger.checkpoints().end() || it->second.running) return nullptr;
      return &it->second.files;
    };
    co.interrupted = [this](const std::string& name) {
      auto it = ledger.checkpoints().find(name);
      return it != ledger.checkpoints().end() && it->second.running.has_value();
    };
    return co;
  }

  void Log(ApplyEvent ev) {
    ev.dry_run = o.dry_run;
    if (o.log) o.log(ev);
  }

  void Save() {
    if (o.dry_run) return;
    // Test hook (tests/integration/test_policy.py): CKPTOOL_TEST_KILL_AT_SAVE=N dies of SIGKILL
    // right before the N-th ledger write, so that a run killed at every step boundary (after a
    // step's work, before the ledger knows) is shown to resume to the same end state.
    if (kill_at_save && ++saves == kill_at_save) ::kill(::getpid(), SIGKILL);
    ledger.Save();
    dirty = false;
  }

  bool Stopping() const { return o.stop && o.stop->load(); }

  // Does checkpoint `name` verify as its files are now? The ledger's answer when it was checked
  // at these very files (stat unchanged), else FindDamage's, recorded in the ledger.
  policy::IntegrityRecord Integrity(const std::string& name);
  void LogDamaged(const std::string& name, const std::string& damage, PassResult& result);

  void Retention(PruneResult& plan, PassResult& result);
  bool CompressFinished(const std::string& name, policy::CheckpointRecord& rec);
  void Process(const Entry& e, PassResult& result);
};

policy::IntegrityRecord Applier::State::Integrity(const std::string& name) {
  const Fingerprint* stat = completeness.StatOf(name);
  auto& records = ledger.checkpoints();
  auto it = records.find(name);
  if (stat && it != records.end() && it->second.checked && !it->second.running &&
      policy::SameStat(*stat, it->second.files))
    return *it->second.checked;
  policy::IntegrityRecord r{policy::UtcNow(), ""};
  std::string path = (fs::path(root) / name).string();
  r.damage = DescribeDamage(FindDamage(path, o.threads), path);
  if (!stat) return r;
  if (it == records.end()) {
    // Remembered, so that the next pass does not read it again.
    policy::CheckpointRecord rec;
    rec.step = StepFromName(name);
    rec.layout = completeness.LayoutOf(name);
    rec.files = *stat;
    policy::HashFiles(root, rec.files);
    it = records.emplace(name, std::move(rec)).first;
  } else if (it->second.running || !policy::SameStat(*stat, it->second.files)) {
    return r;  // Process sees the change (or the interrupted step) and records it then
  }
  it->second.checked = r;
  dirty = true;
  return r;
}

void Applier::State::LogDamaged(const std::string& name, const std::string& damage,
                                PassResult& result) {
  ++result.damaged;
  ++result.failures;
  std::string why = "damaged: " + damage;
  auto& logged = waiting_logged[name];
  if (logged == why) return;
  logged = why;
  Log({"damaged", name, "",
       fmt::format("fails verify ({}): no step runs on it, retention keeps it and does not "
                   "count it",
                   damage)});
}

Applier::Applier(std::string root, Policy policy, ApplyOptions options) {
  if (!fs::is_directory(root)) Fail("{}: not a folder", root);
  s_ = std::make_unique<State>(std::move(root), std::move(policy), std::move(options));
}

Applier::~Applier() = default;

// A run stopped inside the compress step after the original went (it goes only once its
// archive is written and verified) and before the ledger knew: the checkpoint is NAME.ckz.
bool Applier::State::CompressFinished(const std::string& name, policy::CheckpointRecord& rec) {
  if (rec.running_step != StepName(Step::kCompress) || !rec.running) return false;
  std::string archive = name + std::string(ckz::kArchiveSuffix);
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(fs::path(root) / archive, ec))) return false;
  policy::StepRecord done = *rec.running;
  done.before = policy::TotalBytes(rec.files);
  done.note = "the archive was written and verified before the run was stopped";
  auto node = ledger.checkpoints().extract(name);
  ledger.checkpoints().erase(archive);
  node.key() = archive;
  policy::CheckpointRecord& moved = node.mapped();
  moved.running.reset();
  moved.running_step.clear();
  moved.files = policy::StatCheckpoint(root, archive, {});
  policy::HashFiles(root, moved.files);
  done.after = policy::TotalBytes(moved.files);
  moved.steps[StepName(Step::kCompress)] = done;
  ledger.checkpoints().insert(std::move(node));
  Log({"resume", archive, StepName(Step::kCompress),
       fmt::format("{} was compressed into {} when the run was stopped: recorded", name, archive)});
  dirty = true;
  return true;
}

void Applier::State::Retention(PruneResult& plan, PassResult& result) {
  for (PruneEntry& pe : plan.entries) {
    if (pe.keep) continue;
    if (Stopping()) {
      result.stopped = true;
      return;
    }
    result.bytes_freed += pe.bytes;
    ApplyEvent ev{"delete", pe.name, "retention", pe.reason};
    ev.before = pe.bytes;
    auto rec = ledger.checkpoints().find(pe.name);
    std::vector<std::string> outputs;
    if (rec != ledger.checkpoints().end()) {
      for (const std::string& out : rec->second.outputs) {
        if (!Inside(out, pe.name)) outputs.push_back(out);
      }
    }
    if (!outputs.empty()) ev.details["outputs"] = outputs;
    if (o.dry_run) {
      ev.message = fmt::format("would delete ({}, {})", HumanBytes(pe.bytes), pe.reason);
      Log(ev);
      ++result.deleted;
      continue;
    }
    if (!o.yes && !policy.retention->delete_confirmed) {
      result.bytes_freed -= pe.bytes;
      ev.kind = "keep";
      ev.message = fmt::format(
          "would delete ({}, {}): deleting needs --yes, or delete = true in [retention]",
          HumanBytes(pe.bytes), pe.reason);
      Log(ev);
      ++result.not_confirmed;
      continue;
    }
    // Its outputs elsewhere first, then the checkpoint, then the ledger: a run killed in
    // between finds the same plan and finishes it.
    // Whatever another process (the trainer's own rotation) deleted meanwhile is done.
    auto trash = [](const std::string& abs) {
      fs::path a(abs);
      try {
        TrashEntry(a.parent_path().string(), a.filename().string());
        return true;
      } catch (const Error&) {
        std::error_code ec;
        if (fs::exists(fs::symlink_status(a, ec))) throw;
        return false;
      }
    };
    for (const std::string& out : outputs) trash(Abs(root, out));
    for (const std::string& a : pe.also) trash((fs::path(root) / a).string());
    bool ours = trash((fs::path(root) / pe.name).string());
    ev.message = fmt::format("{} ({}, {})", ours ? "deleted" : "already deleted by another process",
                             HumanBytes(pe.bytes), pe.reason);
    Log(ev);
    ++result.deleted;
    if (rec != ledger.checkpoints().end()) ledger.checkpoints().erase(rec);
    ledger.removed().push_back(
        {pe.name, static_cast<int64_t>(pe.step), pe.bytes, policy::UtcNow(), pe.reason});
    Save();
  }
}

void Applier::State::Process(const Entry& e, PassResult& result) {
  // A compressed checkpoint: retention counts and deletes it; no step runs on an archive
  // (decompress it to work on it again).
  if (e.archive) return;
  if (std::find(o.hold.begin(), o.hold.end(), e.name) != o.hold.end()) {
    Log({"skip", e.name, "", "held: the trainer still needs it as it is"});
    return;
  }
  const Fingerprint* stat = completeness.StatOf(e.name);
  if (!stat) return;
  std::vector<Step> due;
  for (Step s : policy::kAllSteps) {
    if (Due(policy, s, e.rank)) due.push_back(s);
  }
  auto& records = ledger.checkpoints();
  auto it = records.find(e.name);
  Fingerprint now = *stat;
  const bool known = it != records.end();
  if (it == records.end()) {
    if (due.empty()) return;
    policy::CheckpointRecord r;
    r.step = e.step;
    r.layout = completeness.LayoutOf(e.name);
    policy::HashFiles(root, now);
    r.files = now;
    it = records.emplace(e.name, std::move(r)).first;
    dirty = true;
  } else if (it->second.running) {
    Log({"resume", e.name, it->second.running_step,
         fmt::format("{} was interrupted: it runs again", it->second.running_step)});
    it->second.checked.reset();  // a step stopped midway: what it left is checked again
    it->second.running.reset();
    it->second.running_step.clear();
    policy::HashFiles(root, now, &it->second.files);
    it->second.files = now;
    dirty = true;
  } else {
    std::string what;
    if (!policy::SameCheckpoint(root, now, it->second.files, &what)) {
      if (!it->second.steps.empty() || it->second.failed) {
        Log({"changed", e.name, "",
             fmt::format("changed since it was processed ({}): its steps run again", what)});
      }
      it->second.steps.clear();
      it->second.failed.reset();
      it->second.checked.reset();
      failure_logged.erase(e.name);
      policy::HashFiles(root, now, &it->second.files);
      it->second.files = now;
      it->second.layout = completeness.LayoutOf(e.name);
      dirty = true;
    } else if (!policy::SameStat(now, it->second.files)) {
      it->second.files = now;  // moved or copied back with its times: same content
      dirty = true;
    }
  }
  policy::CheckpointRecord& rec = it->second;
  // No step runs on a checkpoint that does not verify: it would carry the damage on under fresh
  // checksums (compress, convert, strip) or call it good (verify, export).
  if (!rec.checked) {
    if (dirty) Save();
    rec.checked = Integrity(e.name);
    dirty = true;
  }
  if (!rec.checked->damage.empty()) {
    if (dirty) Save();
    LogDamaged(e.name, rec.checked->damage, result);
    return;
  }
  // A step that failed on these very files with these options is not tried again.
  if (rec.failed) {
    bool same = false;
    for (Step s : due) {
      if (StepName(s) == rec.failed->step && SameOptions(policy.Options(s), rec.failed->options))
        same = true;
    }
    if (same && !o.retry_failed) {
      ++result.failures;
      if (failure_logged.insert(e.name).second) {
        Log({"failed", e.name, rec.failed->step,
             fmt::format("failed at {} and not retried (files and options unchanged; "
                         "--retry-failed tries again): {}",
                         rec.failed->at, rec.failed->error)});
      }
      if (dirty) Save();
      return;
    }
    rec.failed.reset();
    dirty = true;
  }
  StepContext c{root, e, policy, o.threads, o.dry_run, known, {}};
  for (const std::string& out : OutputsInside(policy, e))
    c.outputs_inside.push_back(Abs(root, out));
  for (Step s : due) {
    std::string name = StepName(s);
    nlohmann::ordered_json options = policy.Options(s);
    auto done = rec.steps.find(name);
    if (done != rec.steps.end() && SameOptions(done->second.options, options)) continue;
    if (Stopping()) {
      result.stopped = true;
      break;
    }
    policy::StepRecord running{options, policy::UtcNow(), 0, 0, ""};
    if (!o.dry_run) {
      rec.running = running;
      rec.running_step = name;
      Save();
    }
    StepOutcome out;
    std::string error;
    try {
      out = WithContext(e.name, [&] { return RunStep(s, c); });
    } catch (const std::exception& ex) {
      error = ex.what();
    }
    ++result.steps_run;
    if (o.dry_run) {
      if (!error.empty()) {
        Log({"failed", e.name, name, error});
        ++result.failures;
        break;
      }
      ApplyEvent ev{"step", e.name, name, out.message};
      ev.before = out.before;
      ev.after = out.after;
      result.bytes_freed += out.before - std::min(out.before, out.after);
      Log(ev);
      continue;
    }
    if (error.empty() && !out.became.empty()) {
      // The checkpoint is its archive now: the record moves to the new name, with the outputs
      // that retention deletes with it.
      auto node = records.extract(e.name);
      records.erase(out.became);
      node.key() = out.became;
      records.insert(std::move(node));
    }
    // The checkpoint as the step left it.
    const std::string& now_name = out.became.empty() ? e.name : out.became;
    Fingerprint after = policy::StatCheckpoint(root, now_name, [&] {
      std::vector<std::string> rel = OutputsInside(policy, e);
      return rel;
    }());
    policy::HashFiles(root, after, &rec.files);
    rec.files = after;
    rec.running.reset();
    rec.running_step.clear();
    for (const std::string& w : out.warnings) Log({"note", e.name, name, "warning: " + w});
    if (!error.empty()) {
      rec.failed = policy::FailedRecord{name, options, policy::UtcNow(), error};
      failure_logged.insert(e.name);
      Save();
      ++result.failures;
      Log({"failed", e.name, name, error});
      return;
    }
    for (const std::string& x : out.outputs) {
      if (std::find(rec.outputs.begin(), rec.outputs.end(), x) == rec.outputs.end())
        rec.outputs.push_back(x);
    }
    policy::StepRecord done_rec{options, policy::UtcNow(), out.before, out.after, out.message};
    rec.steps[name] = done_rec;
    Save();
    result.bytes_freed += out.before - std::min(out.before, out.after);
    ApplyEvent ev{"step", e.name, name, out.message};
    ev.before = out.before;
    ev.after = out.after;
    if (out.written) ev.details["written"] = out.written;
    if (!out.outputs.empty()) ev.details["outputs"] = out.outputs;
    if (!out.became.empty()) ev.details["became"] = out.became;
    Log(ev);
    if (!out.became.empty()) return;  // the entry e names is gone
  }
  if (dirty) Save();
}

PassResult Applier::RunPass() {
  State& s = *s_;
  PassResult result;
  if (!s.o.dry_run) {
    // Temp files and folders of a run that was killed outright (they would make a checkpoint
    // look incomplete), and the trash of a deletion that was killed: finish them.
    std::error_code ec;
    RemoveStaleTempsIn(s.root);
    for (fs::recursive_directory_iterator it(s.root, ec), end; !ec && it != end; it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (!it->is_directory(ec) || it->is_symlink(ec)) continue;
      if (it.depth() == 0 && (name == ".ckptool" || IsTrashName(name))) {
        if (IsTrashName(name)) fs::remove_all(it->path(), ec);
        it.disable_recursion_pending();
        ec.clear();
        continue;
      }
      RemoveStaleTempsIn(it->path().string());
    }
  }
  s.completeness.BeginPass();
  PruneOptions po;
  po.keep_last = s.policy.retention ? s.policy.retention->keep_last : UINT64_MAX;
  if (s.policy.retention) {
    po.keep_every = s.policy.retention->keep_every;
    po.keep = s.policy.retention->keep;
  }
  // Held checkpoints are kept, by their exact names (glob characters escaped).
  for (const std::string& name : s.o.hold) {
    std::string exact;
    for (char ch : name) {
      if (ch == '*' || ch == '?' || ch == '[' || ch == ']' || ch == '\\') exact += '\\';
      exact += ch;
    }
    po.keep.push_back(exact);
  }
  PruneResult plan = PlanPrune(
      s.root, po,
      [&](const std::string& path, std::string* why) { return s.completeness.Complete(path, why); },
      [&](const std::string& path, std::string* why) {
        policy::IntegrityRecord r = s.Integrity(fs::path(path).filename().string());
        *why = r.damage;
        return r.damage.empty();
      });
  // Ledger entries whose checkpoint is gone (the trainer rotated it away).
  std::set<std::string> present;
  for (const PruneEntry& pe : plan.entries) present.insert(pe.name);
  std::vector<std::string> recorded;
  for (const auto& [name, rec] : s.ledger.checkpoints()) recorded.push_back(name);
  for (const std::string& name : recorded) {
    std::error_code ec;
    if (present.count(name) || fs::exists(fs::symlink_status(fs::path(s.root) / name, ec)))
      continue;
    auto it = s.ledger.checkpoints().find(name);
    if (it == s.ledger.checkpoints().end()) continue;
    if (s.CompressFinished(name, it->second)) continue;
    const policy::CheckpointRecord& gone = it->second;
    if (gone.steps.empty() && gone.outputs.empty() && !gone.failed) {
      s.ledger.checkpoints().erase(it);  // only its check was remembered: nothing to say
      s.dirty = true;
      continue;
    }
    ApplyEvent ev{"gone", name, "", "deleted by someone else: forgotten"};
    if (!it->second.outputs.empty()) {
      ev.details["outputs"] = it->second.outputs;
      ev.message += "; its outputs are left where they are";
    }
    s.Log(ev);
    s.ledger.checkpoints().erase(it);
    s.dirty = true;
  }
  if (s.dirty) s.Save();
  if (s.policy.retention) s.Retention(plan, result);
  // Ranks: 1 = the newest complete checkpoint kept.
  uint64_t rank = 0;
  std::vector<Entry> entries;
  for (size_t i = plan.entries.size(); i-- > 0;) {
    const PruneEntry& pe = plan.entries[i];
    if (!pe.complete) {
      ++result.waiting;
      std::string why = pe.reason;
      auto& logged = s.waiting_logged[pe.name];
      if (logged != why) {
        logged = why;
        s.Log({"wait", pe.name, "", why});
      }
      continue;
    }
    if (pe.damaged) {
      // The ledger's words for it when it recorded this damage; its record of an earlier,
      // clean check (of files since changed) says nothing.
      auto rec = s.ledger.checkpoints().find(pe.name);
      const bool described = rec != s.ledger.checkpoints().end() && rec->second.checked &&
                             !rec->second.checked->damage.empty();
      s.LogDamaged(pe.name, described ? rec->second.checked->damage : pe.reason, result);
      continue;
    }
    s.waiting_logged.erase(pe.name);
    if (!pe.keep) continue;
    Entry e;
    e.name = pe.name;
    e.path = (fs::path(s.root) / pe.name).string();
    e.step = pe.latest_copy ? -1 : static_cast<int64_t>(pe.step);
    std::error_code ec;
    e.folder = fs::is_directory(fs::symlink_status(e.path, ec));
    e.archive = pe.archive;
    // Lightning's last.ckpt copy ranks with the newest checkpoint, without pushing it back.
    e.rank = pe.latest_copy ? 1 : ++rank;
    entries.push_back(e);
  }
  std::reverse(entries.begin(), entries.end());  // oldest first
  for (const Entry& e : entries) {
    if (s.Stopping() || result.stopped) {
      result.stopped = true;
      break;
    }
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(e.path, ec))) continue;  // deleted under us
    s.Process(e, result);
  }
  result.next_settle = s.completeness.NextSettle();
  return result;
}

}  // namespace ckpt
