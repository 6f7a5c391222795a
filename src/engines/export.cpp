#include "engines/export.h"

#include <fmt/format.h>

#include <filesystem>
#include <unordered_map>

#include "base/error.h"
#include "base/human.h"
#include "base/names.h"
#include "base/perf.h"
#include "checkpoint/opened_checkpoint.h"
#include "engines/logical_export.h"
#include "io/file_copy.h"
#include "io/mapped_file.h"
#include "rewriters/rewritable.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

// What from_pretrained, pipelines and converters (llama.cpp's convert_hf_to_gguf.py) read
// beside the weights of a Hugging Face model folder.
constexpr std::string_view kModelFolderCompanions[] = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
};

// An export into a folder from checkpoint folders (a Trainer's checkpoint-N, a model folder)
// takes their config and tokenizer files along, into the folder being written (it is put in
// place whole with the weights). The first source holding a name wins.
// --config-from folders come first; a --config-from file is its own name's source.
// An archive's folder gives its files as the folder would (read from the archive's volume).
void CopyCompanions(const std::vector<std::string>& config_from,
                    const std::vector<OpenedCheckpoint::Source>& sources, const std::string& to,
                    ExportResult& r) {
  std::vector<OpenedCheckpoint::Source> from;
  for (const std::string& s : config_from) from.push_back({s, &Disk()});
  from.insert(from.end(), sources.begin(), sources.end());
  for (std::string_view name : kModelFolderCompanions) {
    fs::path dest = fs::path(to) / name;
    for (const auto& [s, volume] : from) {
      fs::path src = fs::path(s) / name;
      if (volume->IsFile(s) && fs::path(s).filename() == name) src = s;
      if (!volume->IsFile(src.string())) continue;
      CopyFileAtomically(volume->Open(src.string()), dest.string());
      r.files.push_back(dest.string());
      break;
    }
  }
}

// Checked before anything is read: every --config-from is a folder holding at least one of
// the companion files, or one such file.
void CheckConfigFrom(const std::vector<std::string>& config_from) {
  std::error_code ec;
  for (const std::string& s : config_from) {
    if (fs::is_regular_file(s, ec)) {
      std::string name = fs::path(s).filename().string();
      bool known = false;
      for (std::string_view n : kModelFolderCompanions) known = known || n == name;
      if (!known)
        Fail(
            "--config-from {}: not a config or tokenizer file (config.json, "
            "tokenizer.json, ...) nor a folder holding them",
            s);
      continue;
    }
    if (!fs::is_directory(s, ec)) Fail("--config-from {}: no such file or folder", s);
    bool any = false;
    for (std::string_view n : kModelFolderCompanions)
      any = any || fs::is_regular_file(fs::path(s) / n, ec);
    if (!any)
      Fail("--config-from {}: holds no config.json, generation_config.json or tokenizer file", s);
  }
}

// --strip-prefix: each prefix off the start of every name (tensors and aliases), as often as
// it repeats; names that would collide are an error, a prefix that matches nothing a warning.
void StripPrefixes(LogicalModel& m, const std::vector<std::string>& prefixes,
                   std::vector<std::string>& warnings) {
  if (prefixes.empty()) return;
  std::vector<uint64_t> hits(prefixes.size(), 0);
  auto strip = [&](std::string& name) {
    for (size_t k = 0; k < prefixes.size(); ++k) {
      const std::string& p = prefixes[k];
      while (!p.empty() && name.size() > p.size() && name.starts_with(p)) {
        name.erase(0, p.size());
        ++hits[k];
      }
    }
  };
  std::unordered_map<std::string, std::string> was;  // new name -> old name
  auto claim = [&](const std::string& before, const std::string& after) {
    auto [it, fresh] = was.emplace(after, before);
    if (!fresh)
      Fail("--strip-prefix: '{}' and '{}' would both be named '{}'", it->second, before, after);
  };
  for (LogicalTensor& t : m.tensors) {
    std::string before = t.name;
    strip(t.name);
    claim(before, t.name);
  }
  for (auto& [alias, owner] : m.aliases) {
    std::string before = alias;
    strip(alias);
    claim(before, alias);
    strip(owner);
  }
  for (size_t k = 0; k < prefixes.size(); ++k) {
    if (prefixes[k].empty()) throw UsageError("--strip-prefix: give a prefix, such as module.");
    if (!hits[k])
      warnings.push_back(fmt::format("--strip-prefix {}: no name starts with it", prefixes[k]));
  }
}

bool UnderPrefix(std::string_view name, const std::string& prefix) {
  return prefix.empty() || IsBelowKeyPath(name, prefix);
}

std::string Relative(std::string_view name, const std::string& prefix) {
  return std::string(prefix.empty() ? name : name.substr(prefix.size() + 1));
}

// Does any tensor of `m` or of `c`'s unreadable ones have a name under `prefix`?
bool AnyUnder(const LogicalModel& m, const OpenedCheckpoint& c, const std::string& prefix) {
  for (const LogicalTensor& t : m.tensors) {
    if (UnderPrefix(t.name, prefix)) return true;
  }
  for (const auto& [alias, owner] : m.aliases) {
    if (UnderPrefix(alias, prefix)) return true;
  }
  for (const UnreadableTensor& u : c.unreadable()) {
    for (const std::string& n : u.names) {
      if (UnderPrefix(n, prefix)) return true;
    }
  }
  return false;
}

// What export writes, one rule whatever holds the checkpoint: the tensors under --select
// PREFIX; else under the model's key in a training checkpoint (state_dict, module, model...:
// OpenedCheckpoint::model_key); else the whole object less its training state (optimizer,
// schedulers, RNG: checkpoint/training_state.h); --all: everything. Names become relative to the
// prefix; a tensor's kept name is its first under the prefix in the source's order, its other
// names there are recorded as aliases. Moves the chosen tensors out of `all`.
LogicalModel Select(LogicalModel& all, const OpenedCheckpoint& c, const ExportOptions& o,
                    ExportResult& r) {
  std::string prefix = o.select;
  if (!prefix.empty() && !AnyUnder(all, c, prefix))
    Fail("--select {}: no tensors under that path", prefix);
  if (prefix.empty() && !o.all) prefix = c.model_key();
  r.selected = prefix;
  const bool drop_training = prefix.empty() && !o.all;
  // Each tensor's other names, in the source's order (by index; most models have none).
  std::unordered_map<size_t, std::vector<std::string_view>> others;
  if (!all.aliases.empty()) {
    std::unordered_map<std::string_view, size_t> index;
    index.reserve(all.tensors.size());
    for (size_t i = 0; i < all.tensors.size(); ++i) index.emplace(all.tensors[i].name, i);
    for (const auto& [alias, owner] : all.aliases) {
      auto it = index.find(owner);
      if (it != index.end()) others[it->second].push_back(alias);
    }
  }
  LogicalModel m;
  m.description = all.description;
  m.inputs = all.inputs;
  m.warnings = all.warnings;
  m.tensors.reserve(all.tensors.size());
  uint64_t left_out = 0, outside = 0;
  std::vector<std::pair<std::string, std::string>> aliases;
  for (size_t i = 0; i < all.tensors.size(); ++i) {
    LogicalTensor& t = all.tensors[i];
    if (drop_training && t.training) {
      ++left_out;
      continue;
    }
    auto more = others.find(i);
    if (more == others.end()) {  // one name: kept, made relative in place
      if (!UnderPrefix(t.name, prefix)) {
        outside += !t.training;
        continue;
      }
      if (!prefix.empty()) t.name.erase(0, prefix.size() + 1);
      m.tensors.push_back(std::move(t));
      continue;
    }
    std::vector<std::string> names;
    if (UnderPrefix(t.name, prefix)) names.push_back(Relative(t.name, prefix));
    for (std::string_view n : more->second) {
      if (UnderPrefix(n, prefix)) names.push_back(Relative(n, prefix));
    }
    if (names.empty()) {
      outside += !t.training;
      continue;
    }
    for (size_t k = 1; k < names.size(); ++k) aliases.emplace_back(names[k], names[0]);
    t.name = names[0];
    m.tensors.push_back(std::move(t));
  }
  m.aliases = std::move(aliases);
  for (const UnreadableTensor& u : c.unreadable()) {
    if (drop_training && u.training) {
      ++left_out;
      continue;
    }
    for (const std::string& n : u.names) {
      if (UnderPrefix(n, prefix)) Fail("tensor '{}' {}: export cannot write it", n, u.why);
    }
  }
  if (m.tensors.empty()) {
    if (left_out)
      Fail("no tensors to export: all {} are training state (--all exports them)",
           Count(left_out, "tensor"));
    Fail("no tensors to export");
  }
  for (const std::string& u : c.unsafe())
    r.warnings.push_back(u + " (never run; left behind by export)");
  if (outside && !prefix.empty() && o.select.empty()) {
    r.warnings.push_back(fmt::format(
        "{} outside '{}' (and not training state) left out; --select PREFIX picks another "
        "prefix, --all exports everything",
        Count(outside, "tensor"), prefix));
  }
  if (left_out) {
    r.warnings.push_back(
        fmt::format("{} left out (--all keeps them; --select PREFIX exports what is under PREFIX)",
                    Count(left_out, "training-state tensor")));
  }
  return m;
}

}  // namespace

ExportResult Export(const std::vector<std::string>& sources, const std::string& to,
                    const ExportOptions& o) {
  CheckConfigFrom(o.config_from);
  if (!o.config_from.empty() && (IsTorchOutputPath(to) || to.ends_with(".safetensors")))
    Fail(
        "--config-from: {} is one file; export into a folder to take config and tokenizer "
        "files along",
        to);
  OpenOptions oo;
  oo.threads = o.threads;
  oo.tag = o.tag;
  oo.exclude_frozen = o.exclude_frozen;
  oo.all_files = o.all;
  std::unique_ptr<OpenedCheckpoint> c;
  {
    PerfTimer timer("open");
    c = OpenedCheckpoint::Open(sources, oo);
    // Nothing is written from bytes that fail their checksums (rewriters/rewritable.h).
    for (const auto& f : c->files()) CheckUndamaged(*f, o.threads);
    // From here on only the tensor tables and the mapped bytes are read: the pickle graphs
    // (most of a model's memory at 10^5 tensors) go before anything else is built.
    c->ReleaseParsed();
  }
  ExportResult r;
  LogicalModel m;
  {
    PerfTimer timer("select");
    LogicalModel all = c->TakeModel();
    m = Select(all, *c, o, r);
    StripPrefixes(m, o.strip_prefixes, r.warnings);
  }
  std::vector<std::string> warnings = std::move(r.warnings);
  std::string selected = std::move(r.selected);
  try {
    r = ExportLogical(m, to, o);
  } catch (const Error& e) {
    std::string what = e.what();
    for (size_t i = 0; i < c->archives().size(); ++i) what = c->archives()[i]->Rename(what, "");
    Rethrow(e, what);
  }
  r.selected = std::move(selected);
  // Weights written into a folder (not one .safetensors or torch file): the model folder's
  // other files come along. An MPI job's ranks share the folder; its weights alone are
  // written there.
  bool folder = !r.files.empty() && fs::path(r.files[0]).parent_path() == fs::path(to);
  if (folder && !o.dry_run && o.team == nullptr) CopyCompanions(o.config_from, c->sources(), to, r);
  // What was read, as the user named it (a ZeRO or DCP folder: its reader's description).
  if (c->kind() == "zero" || c->kind() == "dcp") {
    r.source = m.description;
  } else {
    r.source = sources.size() == 1 ? sources[0] : fmt::format("{} paths", sources.size());
  }
  r.warnings.insert(r.warnings.begin(), warnings.begin(), warnings.end());
  for (const auto& v : c->archives()) {
    r.archive_plain_bytes += v->archive_volume().plain_bytes();
    r.archive_backed_bytes += v->archive_volume().tensor_bytes();
  }
  return r;
}

}  // namespace ckpt
