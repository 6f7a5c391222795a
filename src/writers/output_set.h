// Where a command that writes a set of files (export: model.safetensors, or shards and their
// index) puts them: never over an existing output unless asked (--force), and then as a whole.
// The new set is written into a temp folder beside the destination, the files the destination
// holds besides the previous set (config.json, a tokenizer...) are linked in, and the two
// folders are swapped with one rename: a reader sees the old set or the new one, never a mix,
// and no shard of the previous set is left behind. A whole-folder output (strip's copy of a
// folder) goes the same way, without taking anything from the folder it replaces.
#pragma once

#include <string>
#include <vector>

#include "io/folders.h"

namespace ckpt {

// Is `name` part of the model set export writes into a folder (model.safetensors,
// model-00001-of-00003.safetensors, model.safetensors.index.json)?
bool IsModelSetFile(const std::string& name);

class OutputPlace {
 public:
  enum class Kind {
    kModelSet,  // `to` is a folder or a single file (by its extension); see above
    kFolder,    // `to` is a folder, written whole
  };
  // Throws ckpt::Error when the output exists (a model-set folder: holds a model set) and
  // `force` is false.
  OutputPlace(const std::string& to, bool force, Kind kind = Kind::kModelSet);
  // The checks of the constructor alone: nothing is created (a dry run).
  static void Check(const std::string& to, bool force, Kind kind = Kind::kModelSet);

  // Where to write instead of `to`.
  const std::string& write_to() const { return write_to_; }
  // `message` naming the destination where it names the temp folder (an error while writing).
  std::string Unmasked(std::string message) const;
  // Puts the written set in place (see above); returns the final paths of `written`.
  std::vector<std::string> Commit(const std::vector<std::string>& written);

 private:
  std::string to_;     // absolute
  std::string shown_;  // as the user wrote it, for the paths Commit returns
  std::string write_to_;
  bool folder_ = false;
  Kind kind_;
  TempFolder temp_;
};

}  // namespace ckpt
