#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "base/error.h"
#include "base/human.h"
#include "base/utf8.h"
#include "cli/commands.h"
#include "compress/archive.h"
#include "dcp/dcp_checkpoint.h"
#include "deepspeed/zero_checkpoint.h"
#include "io/parallel.h"
#include "ops/compress.h"
#include "ops/dcp_report.h"
#include "ops/verify.h"

namespace ckpt::cli {

namespace {

struct VerifyCliOptions {
  std::vector<std::string> paths;
  unsigned threads = DefaultThreads();
  bool quiet = false;
};

// What one checkpoint's verification found, printed the same way for every kind.
struct Outcome {
  std::vector<torch::Problem> problems;  // one line each: "path: where: what"
  std::string ok;                        // the OK line when there is no problem
  std::vector<std::string> notes;
};

class Tally {
 public:
  explicit Tally(bool quiet) : quiet_(quiet) {}

  template <typename Fn>
  void Check(const std::string& path, Fn&& fn) {
    try {
      Outcome r = fn();
      for (const auto& p : r.problems) {
        std::cout << Printable(fmt::format("{}: {}: {}", path, p.where, p.what)) << "\n";
      }
      problems += r.problems.size();
      if (!r.problems.empty()) {
        ++bad;
      } else if (!quiet_) {
        std::cout << Printable(r.ok) << "\n";
      }
      if (!quiet_) {
        for (const std::string& n : r.notes) std::cout << "  note: " << Printable(n) << "\n";
      }
    } catch (const Error& e) {
      std::cout << Printable(e.what()) << "\n";
      ++bad;
      ++problems;
    }
  }

  size_t bad = 0, problems = 0;

 private:
  bool quiet_;
};

int RunVerify(const VerifyCliOptions& o) {
  std::vector<std::string> archives, paths;
  for (const std::string& p : o.paths) (ckz::IsArchiveFile(p) ? archives : paths).push_back(p);
  std::vector<std::string> dcp_folders;
  std::vector<std::string> files = ExpandInputs(paths, nullptr, &dcp_folders);
  if (files.empty() && dcp_folders.empty() && archives.empty()) {
    PrintError("no checkpoint files found in the given paths");
    return 1;
  }
  Tally tally(o.quiet);
  // A .ckz archive: every chunk decoded and its checksum checked, in parallel.
  for (const std::string& path : archives) {
    tally.Check(path, [&] {
      ckz::Archive a = ckz::Archive::Open(path);
      ArchiveVerifyResult r = VerifyArchive(a, o.threads);
      return Outcome{std::move(r.problems),
                     fmt::format("{}: OK (ckz archive: {} entries, {} chunks decoded, {} "
                                 "CRC-checked)",
                                 path, a.index().entries.size(), r.chunks, HumanBytes(r.bytes)),
                     {}};
    });
  }
  for (const std::string& path : files) {
    tally.Check(path, [&] {
      CheckpointFile f = OpenCheckpoint(path);
      VerifyResult r = Verify(f, o.threads);
      std::string what = f.format == Format::kTorchZip
                             ? fmt::format("{} records, {} CRC-checked", r.records_checked,
                                           HumanBytes(r.bytes_checked))
                             : "structure checked; the format carries no checksums";
      return Outcome{std::move(r.problems),
                     fmt::format("{}: OK ({}, {})", path, FormatName(f.format), what),
                     std::move(r.notes)};
    });
  }
  // A DeepSpeed ZeRO checkpoint: its partitions must also add up to one model.
  for (const std::string& path : paths) {
    if (!deepspeed::LooksLikeZeroCheckpoint(path)) continue;
    tally.Check(path, [&] {
      deepspeed::ZeroCheckpoint z = deepspeed::OpenZeroCheckpoint(path);
      return Outcome{{},
                     fmt::format("{}: OK (DeepSpeed ZeRO stage {}, {} ranks: the partitions of "
                                 "all {} tensors are present and add up)",
                                 z.folder, z.stage, z.world_size, z.tensors.size()),
                     {}};
    });
  }
  // A torch.distributed.checkpoint folder: every item, chunk and byte accounted for.
  for (const std::string& folder : dcp_folders) {
    tally.Check(folder, [&] {
      dcp::Checkpoint c = dcp::OpenDcp(folder);
      DcpVerifyResult r = VerifyDcp(c, o.threads);
      return Outcome{std::move(r.problems),
                     fmt::format("{}: OK (torch.distributed.checkpoint: {} tensors in {} items of "
                                 "{} files, chunks tile every tensor, {} CRC-checked)",
                                 folder, c.tensors.size(), r.items_checked, c.files.size(),
                                 HumanBytes(r.bytes_checked)),
                     std::move(r.notes)};
    });
  }
  size_t bad_files = tally.bad, problems = tally.problems;
  std::cout.flush();
  if (bad_files) {
    std::cerr << fmt::format("ckptool verify: {} problem(s) in {} of {} file(s)\n", problems,
                             bad_files, files.size() + dcp_folders.size() + archives.size());
    return 1;
  }
  return 0;
}

}  // namespace

Runner AddVerify(CLI::App& app) {
  auto o = std::make_shared<VerifyCliOptions>();
  app.add_option("paths", o->paths, "Checkpoint files or folders")->required();
  app.add_option("-j,--threads", o->threads, "Threads for CRC checking")->capture_default_str();
  app.add_flag("-q,--quiet", o->quiet, "Print only problems");
  return [o] { return RunVerify(*o); };
}

}  // namespace ckpt::cli
