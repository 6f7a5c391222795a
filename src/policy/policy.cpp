#include "policy/policy.h"

#include <fmt/format.h>

#include <toml++/toml.h>
#include <algorithm>
#include <filesystem>
#include <set>

#include "base/names.h"
#include "base/size_parse.h"
#include "engines/prune.h"
#include "io/mapped_file.h"
#include "policy/toml_section.h"

namespace ckpt::policy {

namespace fs = std::filesystem;

const char* LayoutName(Layout l) {
  switch (l) {
    case Layout::kAuto:
      return "auto";
    case Layout::kDeepSpeed:
      return "deepspeed";
    case Layout::kHfTrainer:
      return "hf-trainer";
    case Layout::kLightning:
      return "lightning";
    case Layout::kMegatron:
      return "megatron";
    case Layout::kDcp:
      return "dcp";
    case Layout::kPlain:
      return "plain";
  }
  return "?";
}

const char* StepName(Step s) {
  switch (s) {
    case Step::kShrink:
      return "shrink";
    case Step::kConvert:
      return "convert";
    case Step::kExport:
      return "export";
    case Step::kVerify:
      return "verify";
    case Step::kManifest:
      return "manifest";
    case Step::kStrip:
      return "strip";
    case Step::kCompress:
      return "compress";
  }
  return "?";
}

std::string PolicyProblem::Text() const {
  std::string where = file.empty() ? "policy" : file;
  if (line) where += fmt::format(":{}:{}", line, column);
  return key.empty() ? fmt::format("{}: {}", where, what)
                     : fmt::format("{}: {}: {}", where, key, what);
}

namespace {

std::string JoinTexts(const std::vector<PolicyProblem>& problems) {
  std::string out;
  for (const PolicyProblem& p : problems) {
    if (!out.empty()) out += "\n";
    out += p.Text();
  }
  return out;
}

const std::vector<std::string> kTables = {"retention", "shrink",   "convert", "export",
                                          "verify",    "manifest", "strip",   "compress"};

void ReadRetention(Reader& r, const toml::table& t, const toml::source_region& at, Policy& p) {
  Section s(r, t, "retention", {"keep_last", "keep_every", "keep", "delete"});
  s.CheckKeys();
  Retention x;
  if (!t.contains("keep_last")) {
    r.Problem(at, "retention.keep_last",
              "missing: how many of the newest complete checkpoints to keep (>= 1)");
  }
  if (auto v = s.UInt("keep_last", 1)) x.keep_last = *v;
  if (auto v = s.UInt("keep_every", 0)) x.keep_every = *v;
  if (auto v = s.Globs("keep")) x.keep = *v;
  if (auto v = s.Bool("delete")) x.delete_confirmed = *v;
  p.retention = x;
}

void ReadShrink(Reader& r, const toml::table& t, Policy& p) {
  Section s(r, t, "shrink", {"patterns", "materialize", "allow_unsafe_globals"});
  s.CheckKeys();
  ShrinkStep x;
  if (auto v = s.Globs("patterns")) x.patterns = *v;
  if (auto v = s.Bool("materialize")) x.materialize = *v;
  if (auto v = s.Bool("allow_unsafe_globals")) x.allow_unsafe_globals = *v;
  p.shrink = x;
}

void ReadConvert(Reader& r, const toml::table& t, const toml::source_region& at, Policy& p) {
  Section s(r, t, "convert",
            {"dtype", "keep", "only", "keep_1d", "output", "training_files", "include_optimizer",
             "lossy", "allow_unsafe_globals"});
  s.CheckKeys();
  ConvertStep x;
  if (!t.contains("dtype")) r.Problem(at, "convert.dtype", "missing: \"bf16\" or \"fp16\"");
  if (auto v = s.String("dtype", {"bf16", "fp16"})) {
    x.dtype_name = *v;
    x.dtype = *kernels::ParseHalf(*v);
  }
  if (auto v = s.Globs("keep")) x.keep = *v;
  if (auto v = s.Globs("only")) x.only = *v;
  if (auto v = s.Bool("keep_1d")) x.keep_1d = *v;
  if (auto v = s.String("output", {"beside", "in_place"})) x.in_place = *v == "in_place";
  if (auto v = s.Bool("training_files")) x.training_files = *v;
  if (auto v = s.Bool("include_optimizer")) x.training_files = *v;
  if (auto v = s.Bool("lossy")) x.lossy = *v;
  if (auto v = s.Bool("allow_unsafe_globals")) x.allow_unsafe_globals = *v;
  p.convert = x;
}

// `to`: a path template; {name}, {stem} and {step} are the only placeholders, and one of them
// must be there (else every checkpoint would write the same place).
void CheckTemplate(Reader& r, const toml::node& n, const std::string& key,
                   const std::string& value) {
  bool per_checkpoint = false;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] == '}') {
      r.Problem(n.source(), key, "a '}' without its '{'");
      return;
    }
    if (value[i] != '{') continue;
    size_t end = value.find('}', i);
    if (end == std::string::npos) {
      r.Problem(n.source(), key, "a '{' without its '}'");
      return;
    }
    std::string name = value.substr(i + 1, end - i - 1);
    if (name != "name" && name != "stem" && name != "step") {
      r.Problem(
          n.source(), key,
          fmt::format("unknown placeholder {{{}}} (known: {{name}}, {{stem}}, {{step}})", name));
      return;
    }
    per_checkpoint = true;
    i = end;
  }
  if (value.empty()) {
    r.Problem(n.source(), key, "must not be empty");
  } else if (!per_checkpoint) {
    r.Problem(n.source(), key,
              "must contain {name}, {stem} or {step}: every checkpoint needs its own output");
  }
}

// An output whose first path component looks like a checkpoint (model_100.safetensors...)
// would be taken for one by retention and by the next pass.
void CheckNotLikeCheckpoint(Reader& r, const toml::node& n, const std::string& value) {
  for (const auto& [name, stem] :
       {std::pair<std::string, std::string>{"checkpoint-100", "checkpoint-100"},
        {"epoch=1-step=100.ckpt", "epoch=1-step=100"},
        {"model_100.pt", "model_100"}}) {
    std::string out;
    for (size_t i = 0; i < value.size(); ++i) {
      if (value[i] != '{') {
        out += value[i];
        continue;
      }
      size_t end = value.find('}', i);
      std::string key = value.substr(i + 1, end - i - 1);
      out += key == "name" ? name : key == "stem" ? stem : "100";
      i = end;
    }
    fs::path p = fs::path(out).lexically_normal();
    if (p.is_absolute() || p.begin() == p.end()) continue;
    std::string first = p.begin()->string();
    if (first != name && StepFromName(first) >= 0) {
      r.Problem(n.source(), "export.to",
                fmt::format("'{}' (for {}) would itself look like a checkpoint to retention and "
                            "the next pass; put outputs in a folder (\"export/{{stem}}\") or "
                            "inside the checkpoint folder (\"{{name}}/export\")",
                            out, name));
      return;
    }
  }
}

void ReadExport(Reader& r, const toml::table& t, Policy& p) {
  Section s(r, t, "export", {"to", "dtype", "max_shard_size", "select", "exclude_frozen"});
  s.CheckKeys();
  ExportStep x;
  if (auto v = s.String("to")) {
    size_t before = r.problems().size();
    CheckTemplate(r, *t.get("to"), "export.to", *v);
    if (r.problems().size() == before) CheckNotLikeCheckpoint(r, *t.get("to"), *v);
    x.to = *v;
  }
  if (auto v = s.String("dtype", {"bf16", "fp16"})) x.dtype = *v;
  if (const toml::node* n = s.Get("max_shard_size")) {
    if (n->is_integer() && *n->value<int64_t>() > 0) {
      x.max_shard_size = static_cast<uint64_t>(*n->value<int64_t>());
    } else if (n->is_string()) {
      try {
        x.max_shard_size = ParseSize(*n->value<std::string>());
        if (!x.max_shard_size) throw Error("must be more than 0 bytes");
      } catch (const Error& e) {
        r.Problem(n->source(), "export.max_shard_size", e.what());
      }
    } else {
      r.Problem(n->source(), "export.max_shard_size",
                fmt::format("must be a size (\"5GB\", \"500MiB\") or a number of bytes > 0, "
                            "not {}",
                            n->is_integer() ? "that number" : TypeName(*n)));
    }
  }
  if (auto v = s.String("select")) x.select = *v;
  if (auto v = s.Bool("exclude_frozen")) x.exclude_frozen = *v;
  p.export_ = x;
}

void ReadVerify(Reader& r, const toml::table& t, Policy& p) {
  Section s(r, t, "verify", {});
  s.CheckKeys();
  p.verify = VerifyStep{};
}

void ReadManifest(Reader& r, const toml::table& t, Policy& p) {
  Section s(r, t, "manifest", {"tensors"});
  s.CheckKeys();
  ManifestStep x;
  if (auto v = s.Bool("tensors")) x.tensors = *v;
  p.manifest = x;
}

void ReadStrip(Reader& r, const toml::table& t, Policy& p) {
  Section s(r, t, "strip",
            {"older_than_newest", "drop", "keep", "delete_files", "allow_unsafe_globals"});
  s.CheckKeys();
  StripStep x;
  if (auto v = s.UInt("older_than_newest", 0)) x.older_than_newest = *v;
  if (auto v = s.Globs("drop")) x.drop = *v;
  if (auto v = s.Globs("keep")) x.keep = *v;
  if (auto v = s.Bool("delete_files")) x.delete_files = *v;
  if (auto v = s.Bool("allow_unsafe_globals")) x.allow_unsafe_globals = *v;
  p.strip = x;
}

void ReadCompress(Reader& r, const toml::table& t, Policy& p) {
  Section s(r, t, "compress", {"older_than_newest", "level", "keep_original"});
  s.CheckKeys();
  CompressStep x;
  if (auto v = s.UInt("older_than_newest", 0)) x.older_than_newest = *v;
  if (auto v = s.String("level", {"fast", "max"})) x.level = *v;
  if (auto v = s.Bool("keep_original")) x.keep_original = *v;
  p.compress = x;
}

nlohmann::ordered_json Json(const std::vector<std::string>& v) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const std::string& s : v) a.push_back(s);
  return a;
}

}  // namespace

PolicyError::PolicyError(std::vector<PolicyProblem> problems)
    : Error(JoinTexts(problems)), problems_(std::move(problems)) {}

bool Policy::Has(Step s) const {
  switch (s) {
    case Step::kShrink:
      return shrink.has_value();
    case Step::kConvert:
      return convert.has_value();
    case Step::kExport:
      return export_.has_value();
    case Step::kVerify:
      return verify.has_value();
    case Step::kManifest:
      return manifest.has_value();
    case Step::kStrip:
      return strip.has_value();
    case Step::kCompress:
      return compress.has_value();
  }
  return false;
}

nlohmann::ordered_json Policy::Options(Step s) const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  switch (s) {
    case Step::kShrink:
      if (!shrink) break;
      j["patterns"] = Json(shrink->patterns);
      j["materialize"] = shrink->materialize;
      j["allow_unsafe_globals"] = shrink->allow_unsafe_globals;
      if (!trust.empty()) j["trust"] = Json(trust);
      break;
    case Step::kConvert:
      if (!convert) break;
      j["dtype"] = convert->dtype_name;
      j["keep"] = Json(convert->keep);
      j["only"] = Json(convert->only);
      j["keep_1d"] = convert->keep_1d;
      j["output"] = convert->in_place ? "in_place" : "beside";
      j["training_files"] = convert->training_files;
      j["allow_unsafe_globals"] = convert->allow_unsafe_globals;
      // Keys added later only when set: a ledger written before them still matches.
      if (convert->lossy) j["lossy"] = true;
      if (!trust.empty()) j["trust"] = Json(trust);
      break;
    case Step::kExport:
      if (!export_) break;
      j["to"] = export_->to;
      j["dtype"] = export_->dtype;
      j["max_shard_size"] = export_->max_shard_size;
      j["select"] = export_->select;
      j["exclude_frozen"] = export_->exclude_frozen;
      break;
    case Step::kVerify:
      if (!trust.empty()) j["trust"] = Json(trust);
      break;
    case Step::kManifest:
      if (!manifest) break;
      j["tensors"] = manifest->tensors;
      break;
    case Step::kStrip:
      if (!strip) break;
      j["drop"] = Json(strip->drop);
      j["keep"] = Json(strip->keep);
      j["delete_files"] = strip->delete_files;
      j["allow_unsafe_globals"] = strip->allow_unsafe_globals;
      if (!trust.empty()) j["trust"] = Json(trust);
      break;
    case Step::kCompress:
      if (!compress) break;
      j["level"] = compress->level;
      j["keep_original"] = compress->keep_original;
      break;
  }
  return j;
}

nlohmann::ordered_json Policy::Describe() const {
  nlohmann::ordered_json j;
  j["file"] = file;
  j["layout"] = LayoutName(layout);
  if (settle_seconds) j["settle_seconds"] = *settle_seconds;
  j["trust"] = Json(trust);
  if (retention) {
    j["retention"] = {{"keep_last", retention->keep_last},
                      {"keep_every", retention->keep_every},
                      {"keep", Json(retention->keep)}};
  }
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (Step s : kAllSteps) {
    if (!Has(s)) continue;
    nlohmann::ordered_json o = Options(s);
    if (s == Step::kStrip) o["older_than_newest"] = strip->older_than_newest;
    if (s == Step::kCompress) o["older_than_newest"] = compress->older_than_newest;
    steps.push_back({{"step", StepName(s)}, {"options", o}});
  }
  j["steps"] = steps;
  return j;
}

Policy ParsePolicy(std::string_view text, const std::string& file) {
  Reader r(file);
  toml::table doc;
  try {
    doc = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    r.Problem(e.source(), "", std::string(e.description()));
    throw PolicyError(r.problems());
  }
  Policy p;
  p.file = file;
  std::vector<std::string> top = {"version", "layout", "settle_seconds", "trust"};
  std::vector<std::string> known = top;
  known.insert(known.end(), kTables.begin(), kTables.end());
  for (auto&& [k, v] : doc) {
    std::string name(k.str());
    bool is_table = std::find(kTables.begin(), kTables.end(), name) != kTables.end();
    if (is_table) {
      const toml::table* t = v.as_table();
      if (!t) {
        r.Problem(v.source(), name,
                  fmt::format("must be a table ([{}]), not {}", name, TypeName(v)));
        continue;
      }
      if (name == "retention") ReadRetention(r, *t, k.source(), p);
      if (name == "shrink") ReadShrink(r, *t, p);
      if (name == "convert") ReadConvert(r, *t, k.source(), p);
      if (name == "export") ReadExport(r, *t, p);
      if (name == "verify") ReadVerify(r, *t, p);
      if (name == "manifest") ReadManifest(r, *t, p);
      if (name == "strip") ReadStrip(r, *t, p);
      if (name == "compress") ReadCompress(r, *t, p);
    } else if (std::find(top.begin(), top.end(), name) == top.end()) {
      r.Problem(k.source(), name,
                v.is_table() ? "unknown table " + Known(kTables, name)
                             : "unknown key " + Known(known, name));
    }
  }
  Section s(r, doc, "", top);
  if (auto v = s.UInt("version", 1)) {
    if (*v != 1) {
      r.Problem(doc.get("version")->source(), "version",
                fmt::format("this ckptool reads policy version 1 (got {})", *v));
    }
  }
  if (auto v = s.String(
          "layout", {"auto", "deepspeed", "hf-trainer", "lightning", "megatron", "dcp", "plain"})) {
    for (Layout l : {Layout::kAuto, Layout::kDeepSpeed, Layout::kHfTrainer, Layout::kLightning,
                     Layout::kMegatron, Layout::kDcp, Layout::kPlain}) {
      if (*v == LayoutName(l)) p.layout = l;
    }
  }
  p.settle_seconds = s.Seconds("settle_seconds");
  if (auto v = s.Globs("trust")) p.trust = *v;
  // Outputs placed where retention or the other steps would take them for checkpoints.
  if (p.export_ && !p.export_->to.empty()) {
    fs::path to(p.export_->to);
    std::string first = to.begin() == to.end() ? "" : to.begin()->string();
    if (first == ".ckptool") {
      r.Problem(doc["export"]["to"].node()->source(), "export.to",
                "must not write into .ckptool (the ledger's folder)");
    }
  }
  std::sort(r.problems().begin(), r.problems().end(),
            [](const PolicyProblem& a, const PolicyProblem& b) {
              return std::tie(a.line, a.column) < std::tie(b.line, b.column);
            });
  if (!r.problems().empty()) throw PolicyError(r.problems());
  return p;
}

Policy LoadPolicy(const std::string& path) {
  MappedFile m = MappedFile::Open(path);
  if (m.size() > (1 << 20)) Fail("{}: a policy file of {} bytes? (at most 1 MiB)", path, m.size());
  return ParsePolicy(AsText(m.bytes()), path);
}

std::string FindPolicy(const std::string& root, const std::string& given) {
  if (!given.empty()) return given;
  fs::path p = fs::path(root) / "ckptool.toml";
  std::error_code ec;
  return fs::is_regular_file(p, ec) ? p.string() : "";
}

}  // namespace ckpt::policy
