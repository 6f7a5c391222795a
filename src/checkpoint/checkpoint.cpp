#include "checkpoint/checkpoint.h"

#include "base/error.h"
#include "checkpoint/checkpoint_kinds.h"
#include "checkpoint/opened_checkpoint.h"

namespace ckpt {

namespace {

// The kinds: how each opens, and where inspect --json lists it. A new container is a value of
// Container (its test in ContainerOf), a file implementing Checkpoint, and a line here.
struct Kind {
  Container kind;
  std::unique_ptr<Checkpoint> (*open)(const std::string& path);
  ReportSection section;
};
const Kind kKinds[] = {
    {Container::kFile, &kinds::OpenFile, {"files", "path", true}},
    {Container::kArchive, &kinds::OpenArchive, {"archives", "path", false}},
    {Container::kZero, &kinds::OpenZero, {"zero", "folder", false}},
    {Container::kDcp, &kinds::OpenDcp, {"dcp", "folder", false}},
    // A model folder is described and verified by its files (Locate walks into them).
    {Container::kModelFolder, &kinds::OpenFile, {"files", "path", true}},
};

const Kind& KindOf(Container c) {
  for (const Kind& k : kKinds) {
    if (k.kind == c) return k;
  }
  Fail("internal error: a kind of container without an implementation");
}

}  // namespace

void Checkpoint::Prepare(const DescribeOptions&) {}

std::unique_ptr<OpenedCheckpoint> Checkpoint::OpenModel(const OpenOptions& o) const {
  return OpenedCheckpoint::Open(path_, o);
}

std::unique_ptr<Checkpoint> CheckpointAt(const Located& l) {
  return KindOf(l.kind).open(l.path);
}

std::vector<std::unique_ptr<Checkpoint>> FindCheckpoints(const std::vector<std::string>& paths,
                                                         std::vector<std::string>* skipped) {
  std::vector<std::unique_ptr<Checkpoint>> out;
  for (const Located& l : Locate(paths, skipped)) out.push_back(CheckpointAt(l));
  return out;
}

const ReportSection& SectionOf(Container kind) {
  return KindOf(kind).section;
}

std::vector<const ReportSection*> ReportSections() {
  std::vector<const ReportSection*> out;
  for (const Kind& k : kKinds) {
    bool seen = false;
    for (const ReportSection* s : out) seen = seen || s->key == k.section.key;
    if (!seen) out.push_back(&k.section);
  }
  return out;
}

}  // namespace ckpt
