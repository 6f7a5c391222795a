// A torch.distributed.checkpoint folder (dcp/dcp_checkpoint.h): one checkpoint made of chunk
// items; every item, chunk and byte accounted for.
#include <fmt/format.h>

#include "base/human.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_kinds.h"
#include "dcp/dcp_checkpoint.h"
#include "reports/dcp_report.h"

namespace ckpt::kinds {

namespace {

class DcpFolder : public Checkpoint {
 public:
  explicit DcpFolder(const std::string& path) : Checkpoint(path) {}

  Container kind() const override { return Container::kDcp; }

  void DescribeText(const DescribeOptions& o,
                    const std::function<void(const std::string&)>& print) const override {
    print(RenderDcpText(Open(), o.top));
  }

  void DescribeJson(JsonStream& out, const DescribeOptions&) const override {
    WriteDcpJson(out, Open());
  }

  VerifyOutcome Verify(unsigned threads, const torch::Trust& trust, bool checksums) const override {
    dcp::Checkpoint c = dcp::OpenDcp(path(), trust, volume());
    DcpVerifyResult r = VerifyDcp(c, threads, checksums);
    return VerifyOutcome{
        std::move(r.problems),
        fmt::format("{}: OK (torch.distributed.checkpoint: {} tensors, {} files, chunks tile "
                    "every tensor, {})",
                    path(), c.tensors.size(), c.files.size(),
                    checksums ? fmt::format("{} items, {} CRC-checked", r.items_checked,
                                            HumanBytes(r.bytes_checked))
                              : "structure only: records not CRC-checked"),
        std::move(r.notes)};
  }

 private:
  dcp::Checkpoint Open() const {
    dcp::Checkpoint c = dcp::OpenDcp(path(), {}, volume());
    c.folder = name();
    return c;
  }
};

}  // namespace

std::unique_ptr<Checkpoint> OpenDcp(const std::string& path) {
  return std::make_unique<DcpFolder>(path);
}

}  // namespace ckpt::kinds
