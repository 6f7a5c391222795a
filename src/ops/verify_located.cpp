#include <fmt/format.h>

#include <memory>

#include "base/error.h"
#include "base/human.h"
#include "compress/archive.h"
#include "dcp/dcp_checkpoint.h"
#include "deepspeed/zero_checkpoint.h"
#include "ops/archive_restore.h"
#include "ops/archive_view.h"
#include "ops/dcp_report.h"
#include "ops/verify.h"

namespace ckpt {

VerifyOutcome VerifyLocated(const Located& item, unsigned threads, const torch::Trust& trust,
                            bool checksums) {
  const std::string& path = item.path;
  switch (item.kind) {
    case Container::kArchive: {
      // A .ckz archive: every chunk decoded and its checksum checked, in parallel; then the
      // checkpoints it holds, verified as they would be once restored (what torch.load of
      // them would run is what matters), read in place through the archive's skeleton.
      ckz::Archive a = ckz::Archive::Open(path);
      if (!checksums) {
        // Structure: the index read and every chunk within the file (Archive::Open checks
        // both); nothing decoded.
        return VerifyOutcome{{},
                             fmt::format("{}: OK (ckz archive: {}, structure only: index and "
                                         "chunk extents, nothing decoded)",
                                         path, Count(a.index().entries.size(), "entry")),
                             {}};
      }
      ArchiveVerifyResult r = VerifyArchive(a, threads);
      VerifyOutcome out{std::move(r.problems),
                        fmt::format("{}: OK (ckz archive: {}, {} decoded, {} CRC-checked", path,
                                    Count(a.index().entries.size(), "entry"),
                                    Count(r.chunks, "chunk"), HumanBytes(r.bytes)),
                        {}};
      if (!out.problems.empty()) return out;
      std::unique_ptr<ArchiveView> view = ArchiveView::Open(path, ReadOnlyTempParent(), threads);
      std::vector<std::string> dcp_folders;
      std::vector<std::string> held = view->Checkpoints(&dcp_folders);
      // Problems and notes are named by the path inside the archive, never the temp folder.
      auto check = [&](const Located& inside) {
        std::string rel = view->Relative(inside.path);
        try {
          VerifyOutcome v = VerifyLocated(inside, threads, trust, checksums);
          for (torch::Problem& p : v.problems) {
            p.where = p.where.empty() ? rel : fmt::format("{}: {}", rel, p.where);
            out.problems.push_back(std::move(p));
          }
          for (std::string& n : v.notes) out.notes.push_back(rel + ": " + n);
        } catch (const InputChanged&) {
          throw;
        } catch (const Error& e) {
          std::string what = e.what();
          if (what.starts_with(inside.path + ": ")) what = what.substr(inside.path.size() + 2);
          // A message naming another path inside (a ZeRO tag folder): that path is its place.
          std::string renamed = view->Rename(what, "");
          size_t colon = renamed.find(": ");
          if (renamed != what && colon != std::string::npos) {
            out.problems.push_back({renamed.substr(0, colon), renamed.substr(colon + 2)});
          } else {
            out.problems.push_back({rel, renamed});
          }
        }
      };
      for (const std::string& f : held) check({Container::kFile, f});
      // A DeepSpeed ZeRO folder: its partitions must also add up, as verify of the folder says.
      bool zero = ContainerOf(view->root()) == Container::kZero;
      if (zero) check({Container::kZero, view->root()});
      for (const std::string& d : dcp_folders) check({Container::kDcp, d});
      out.ok += fmt::format("; {} inside verified as restored{})",
                            Count(held.size() + dcp_folders.size(), "checkpoint"),
                            zero ? ", the ZeRO partitions add up" : "");
      return out;
    }
    case Container::kModelFolder:  // (Locate walks folders into their files)
    case Container::kFile: {
      CheckpointFile f = OpenCheckpoint(path);
      VerifyResult r = Verify(f, threads, trust, checksums);
      std::string what = f.format != Format::kTorchZip
                             ? "structure checked; the format carries no checksums"
                         : checksums ? fmt::format("{} records, {} CRC-checked", r.records_checked,
                                                   HumanBytes(r.bytes_checked))
                                     : "structure only: records not CRC-checked";
      return VerifyOutcome{std::move(r.problems),
                           fmt::format("{}: OK ({}, {})", path, FormatName(f.format), what),
                           std::move(r.notes)};
    }
    case Container::kZero: {
      // A DeepSpeed ZeRO checkpoint: its partitions must also add up to one model.
      deepspeed::ZeroCheckpoint z = deepspeed::OpenZeroCheckpoint(path);
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
    case Container::kDcp: {
      // A torch.distributed.checkpoint folder: every item, chunk and byte accounted for.
      dcp::Checkpoint c = dcp::OpenDcp(path, trust);
      DcpVerifyResult r = VerifyDcp(c, threads, checksums);
      return VerifyOutcome{
          std::move(r.problems),
          fmt::format("{}: OK (torch.distributed.checkpoint: {} tensors, {} files, chunks tile "
                      "every tensor, {})",
                      path, c.tensors.size(), c.files.size(),
                      checksums ? fmt::format("{} items, {} CRC-checked", r.items_checked,
                                              HumanBytes(r.bytes_checked))
                                : "structure only: records not CRC-checked"),
          std::move(r.notes)};
    }
  }
  return {};
}

}  // namespace ckpt
