// `ckptool strip <torch.distributed.checkpoint folder>`: the folder without its optimizer state
// (fqns whose top key strip drops by default: optim, optimizer...; or --drop/--keep globs
// matched against every dotted prefix of an fqn, keep winning). A new folder is built beside
// the old one: only the kept items copied (inside the kernel where it can), each .distcp
// keeping its name, a new .metadata without the dropped entries and with the items' new
// offsets, other files (Megatron's common.pt, metadata.json) copied as they are. It is read
// back and checked (every kept item's bytes by CRC, the chunks tiling every kept tensor) before
// it replaces anything: with -o it is renamed to OUT; in place it is swapped with the old
// folder in one atomic rename (RENAME_EXCHANGE) and the old one removed after.
#pragma once

#include "engines/strip.h"

namespace ckpt {

StripResult StripDcp(const std::string& folder, const StripOptions& options);

}  // namespace ckpt
