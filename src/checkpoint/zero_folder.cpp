// A DeepSpeed ZeRO folder (deepspeed/zero_checkpoint.h): the root holding `latest` or a tag
// folder, or a universal checkpoint; described and verified as the one model its rank files
// make. Its rank files are also checkpoint files of their own (Locate lists them): the reading
// of the folder gives their reports (ReportCache), so that inspect parses each once.
#include <fmt/format.h>

#include <optional>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_kinds.h"
#include "deepspeed/zero_checkpoint.h"
#include "reports/zero_report.h"

namespace ckpt::kinds {

namespace {

class ZeroFolder : public Checkpoint {
 public:
  explicit ZeroFolder(const std::string& path) : Checkpoint(path) {}

  Container kind() const override { return Container::kZero; }

  void Prepare(const DescribeOptions& o) override {
    try {
      deepspeed::ZeroCheckpoint z = deepspeed::OpenZeroCheckpoint(
          path(), "",
          [&](const CheckpointFile& f) {
            if (!o.cache) return;
            try {
              o.cache->Put(f.path, BuildReport(f, o.top, o.trust));
            } catch (const Error&) {
              // Described (with its error) when the file is read on its own.
            }
          },
          volume());
      text_ = RenderZeroText(z, o.top);
    } catch (const InputChanged&) {
      throw;
    } catch (const Error& e) {
      error_ = e.what();
    }
  }

  void DescribeText(const DescribeOptions& o,
                    const std::function<void(const std::string&)>& print) const override {
    if (error_) throw Error(*error_);
    print(text_ ? *text_
                : RenderZeroText(deepspeed::OpenZeroCheckpoint(path(), "", {}, volume()), o.top));
  }

  void DescribeJson(JsonStream& out, const DescribeOptions&) const override {
    WriteZeroJson(out, deepspeed::OpenZeroCheckpoint(path(), "", {}, volume()));
  }

  // Its partitions must add up to one model (each rank file is verified as a file).
  VerifyOutcome Verify(unsigned, const torch::Trust&, bool) const override {
    deepspeed::ZeroCheckpoint z = deepspeed::OpenZeroCheckpoint(path(), "", {}, volume());
    if (z.universal) {
      return VerifyOutcome{
          {},
          fmt::format("{}: OK (DeepSpeed universal checkpoint of ZeRO stage {} from {} ranks: "
                      "every parameter's fp32.pt is there in its shape, every folder holds "
                      "the same optimizer state files; {} tensors)",
                      z.folder, z.stage, z.world_size, z.tensors.size()),
          {}};
    }
    return VerifyOutcome{{},
                         fmt::format("{}: OK (DeepSpeed ZeRO stage {}, {} ranks: the "
                                     "partitions of all {} tensors are present and add up)",
                                     z.folder, z.stage, z.world_size, z.tensors.size()),
                         {}};
  }

 private:
  std::optional<std::string> text_, error_;  // Prepare's
};

}  // namespace

std::unique_ptr<Checkpoint> OpenZero(const std::string& path) {
  return std::make_unique<ZeroFolder>(path);
}

}  // namespace ckpt::kinds
