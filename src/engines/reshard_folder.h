// What both reshard targets (reshard.cpp: universal; reshard_zero.cpp: ZeRO rank files) share:
// where the output folder may go, how an MPI team agrees on the folder being built, and how
// that folder is put into place.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "engines/reshard.h"
#include "io/folders.h"
#include "io/mapped_file.h"

namespace ckpt::reshard {

// The output folder as an absolute, normalised path (`output`, or `fallback` when empty).
std::filesystem::path Destination(const std::string& output, const std::string& fallback);

// Refuses an output that is one of `folders`, lies in one, or holds one: --force would swap
// the checkpoint itself out and delete it. `shown` names the output in the message.
void RefuseOverlap(const std::filesystem::path& dest, const std::vector<std::string>& folders,
                   const std::string& shown);

// The folder being built for `dest`, beside it; rank 0 alone prepares it.
struct OutputFolder {
  OutputFolder(std::filesystem::path dest, std::string shown);

  // Refuses an existing destination unless `force` (and one that is not a folder).
  void CheckDestination(bool force) const;
  // Refuses a damaged `checkpoint` (only verified bytes go into the new files: their CRCs would
  // vouch for them), creates the folders that hold the destination and the temp folder.
  void Create(const std::string& checkpoint, unsigned threads);

  std::filesystem::path dest;
  std::string shown;     // the destination as the user named it
  bool replace = false;  // something is at the destination
  CreatedFolders created;
  TempFolder tmp;
};

// Refuses a checkpoint whose pickles would run code when loaded (`findings`, as
// deepspeed::ZeroCheckpoint::findings lists them): its objects are carried into the output.
void RefuseFindings(const std::vector<std::string>& findings);

// Rank 0 has laid out `tmp` (or failed with `error`, empty if not): every rank of the team
// learns the folder, or stops with rank 0's error. Without a team, rethrows `error`.
void ShareFolder(const ReshardTeam& team, TempFolder& tmp, const std::string& error);

// Every rank has written its share (`error`: its own failure, empty if none). Throws the first
// error; returns false on the ranks other than 0, whose work ends here.
bool ConfirmShares(const ReshardTeam& team, const std::string& error);

struct TreeTotals {
  uint64_t files = 0;
  uint64_t bytes = 0;
};
// Syncs every folder below and at `folder`, and counts the files in it.
TreeTotals SyncTree(const std::string& folder);

// Puts the folder `tmp` into place at `dest` once no input changed since it was read: renamed
// there, or (replace) swapped with the folder there, which is then removed with `tmp`.
// Records the new folder in a manifest of a folder holding it.
void InstallFolder(TempFolder& tmp, const std::filesystem::path& dest, bool replace,
                   const std::vector<const MappedFile*>& inputs, const std::string& shown);

}  // namespace ckpt::reshard
