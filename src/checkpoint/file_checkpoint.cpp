// A torch file (zip or legacy) or a safetensors file (file/checkpoint_file.h).
#include <fmt/format.h>

#include <optional>

#include "base/human.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_kinds.h"
#include "file/checkpoint_file.h"
#include "reports/inspect_output.h"

namespace ckpt::kinds {

namespace {

class FileCheckpoint : public Checkpoint {
 public:
  explicit FileCheckpoint(const std::string& path) : Checkpoint(path) {}

  Container kind() const override { return Container::kFile; }

  void DescribeText(const DescribeOptions& o,
                    const std::function<void(const std::string&)>& print) const override {
    print(RenderText(Report(o, o.top), o.top));
  }

  void DescribeJson(JsonStream& out, const DescribeOptions& o) const override {
    WriteJson(out, Report(o, SIZE_MAX));  // every row
  }

  VerifyOutcome Verify(unsigned threads, const torch::Trust& trust, bool checksums) const override {
    CheckpointFile f = OpenCheckpoint(volume(), path());
    VerifyResult r = ckpt::Verify(f, threads, trust, checksums);
    std::string what = f.format != Format::kTorchZip
                           ? "structure checked; the format carries no checksums"
                       : checksums ? fmt::format("{} records, {} CRC-checked", r.records_checked,
                                                 HumanBytes(r.bytes_checked))
                                   : "structure only: records not CRC-checked";
    return VerifyOutcome{std::move(r.problems),
                         fmt::format("{}: OK ({}, {})", path(), FormatName(f.format), what),
                         std::move(r.notes)};
  }

 private:
  // The report of the file (the largest `rows` tensor rows), or the one another checkpoint's
  // reading made of it.
  FileReport Report(const DescribeOptions& o, size_t rows) const {
    std::optional<FileReport> cached = o.cache ? o.cache->Take(path()) : std::nullopt;
    FileReport r =
        cached ? std::move(*cached) : BuildReport(OpenCheckpoint(volume(), path()), rows, o.trust);
    r.path = name();
    return r;
  }
};

}  // namespace

std::unique_ptr<Checkpoint> OpenFile(const std::string& path) {
  return std::make_unique<FileCheckpoint>(path);
}

}  // namespace ckpt::kinds
