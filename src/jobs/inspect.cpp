#include "jobs/inspect.h"

#include "base/error.h"

namespace ckpt::jobs {

namespace {

DescribeOptions Describing(const InspectOptions& o, const InspectOutput& out, bool* ok) {
  DescribeOptions d;
  d.top = o.top;
  d.trust = o.trust;
  d.threads = o.threads;
  d.error = [&out, ok](const std::string& what) {
    *ok = false;
    if (out.error) out.error(what);
  };
  return d;
}

}  // namespace

bool InspectText(const std::vector<std::unique_ptr<Checkpoint>>& checkpoints,
                 const InspectOptions& o, const InspectOutput& out) {
  bool ok = true;
  DescribeOptions d = Describing(o, out, &ok);
  // What one checkpoint's reading gives others (a ZeRO folder's rank files' reports) is read
  // first; each report is then printed in the order the checkpoints were found.
  ReportCache cache;
  d.cache = &cache;
  for (const auto& c : checkpoints) c->Prepare(d);
  for (const auto& c : checkpoints) {
    try {
      c->DescribeText(d, out.text);
    } catch (const InputChanged&) {
      throw;
    } catch (const Error& e) {
      d.error(e.what());
    }
  }
  return ok;
}

bool InspectJson(const std::vector<std::unique_ptr<Checkpoint>>& checkpoints,
                 const InspectOptions& o, JsonStream& json, const InspectOutput& out) {
  bool ok = true;
  DescribeOptions d = Describing(o, out, &ok);
  json.BeginObject();
  for (const ReportSection* section : ReportSections()) {
    std::vector<const Checkpoint*> listed;
    for (const auto& c : checkpoints) {
      if (SectionOf(c->kind()).key == section->key) listed.push_back(c.get());
    }
    if (listed.empty() && !section->always) continue;
    json.BeginArray(section->key);
    for (const Checkpoint* c : listed) {
      size_t depth = json.depth();
      try {
        c->DescribeJson(json, d);
      } catch (const InputChanged&) {
        throw;
      } catch (const Error& e) {
        if (json.depth() != depth) throw;  // an object half written: nothing sane to add
        d.error(e.what());
        json.Value({{std::string(section->path_key), c->path()}, {"error", e.what()}});
      }
    }
    json.End();
  }
  json.End();
  return ok;
}

}  // namespace ckpt::jobs
