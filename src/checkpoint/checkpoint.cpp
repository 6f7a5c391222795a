#include "checkpoint/checkpoint.h"

#include <filesystem>

#include "base/error.h"
#include "checkpoint/checkpoint_kinds.h"
#include "checkpoint/opened_checkpoint.h"

namespace ckpt {

namespace {

// Where inspect --json lists each kind, in this order.
constexpr ReportSection kFiles{"files", "path", true};
constexpr ReportSection kArchives{"archives", "path", false};
constexpr ReportSection kZero{"zero", "folder", false};
constexpr ReportSection kDcp{"dcp", "folder", false};

}  // namespace

void Checkpoint::Prepare(const DescribeOptions&) {}

void ReportCache::Put(const std::string& path, FileReport report) {
  reports_.insert_or_assign(std::filesystem::path(path).lexically_normal().string(),
                            std::move(report));
}

std::optional<FileReport> ReportCache::Take(const std::string& path) {
  auto node = reports_.extract(std::filesystem::path(path).lexically_normal().string());
  if (node.empty()) return std::nullopt;
  return std::move(node.mapped());
}

std::unique_ptr<OpenedCheckpoint> Checkpoint::OpenModel(const OpenOptions& o) const {
  return volume_ ? OpenedCheckpoint::Open(path_, o, *volume_) : OpenedCheckpoint::Open(path_, o);
}

// The kinds: a new container is a value of Container (its test in ContainerOf), a file
// implementing Checkpoint, and a line in each switch below (-Wswitch, an error in CI, names
// both).
std::unique_ptr<Checkpoint> CheckpointAt(const Located& l) {
  std::unique_ptr<Checkpoint> c = [&] {
    switch (l.kind) {
      case Container::kFile:
        return kinds::OpenFile(l.path);
      case Container::kArchive:
        return kinds::OpenArchive(l.path);
      case Container::kZero:
        return kinds::OpenZero(l.path);
      case Container::kDcp:
        return kinds::OpenDcp(l.path);
      case Container::kModelFolder:  // described and verified by its files (Locate walks them)
        return kinds::OpenFile(l.path);
    }
    Fail("{}: internal error: a kind of container without an implementation", l.path);
  }();
  c->set_volume(l.volume);
  return c;
}

std::vector<std::unique_ptr<Checkpoint>> FindCheckpoints(const std::vector<std::string>& paths,
                                                         std::vector<std::string>* skipped) {
  std::vector<std::unique_ptr<Checkpoint>> out;
  for (const Located& l : Locate(paths, skipped)) out.push_back(CheckpointAt(l));
  return out;
}

const ReportSection& SectionOf(Container kind) {
  switch (kind) {
    case Container::kFile:
    case Container::kModelFolder:
      return kFiles;
    case Container::kArchive:
      return kArchives;
    case Container::kZero:
      return kZero;
    case Container::kDcp:
      return kDcp;
  }
  Fail("internal error: a kind of container without a report section");
}

std::vector<const ReportSection*> ReportSections() {
  return {&kFiles, &kArchives, &kZero, &kDcp};
}

}  // namespace ckpt
