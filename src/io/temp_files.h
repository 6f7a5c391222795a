// Temporary output files that must never outlive an interrupted run.
//
// Every temp file is registered here; SIGINT/SIGTERM/SIGHUP handlers unlink all registered
// files (async-signal-safe: fixed slots, unlink only) and then die of the same signal, as
// zstd's INThandler does. Temp names are "<dir>/.<name>.ckptool-tmp-<pid>-<n>", so a later run
// can recognise and remove ones left by a run that was killed outright (SIGKILL, power loss).
#pragma once

#include <string>
#include <string_view>

namespace ckpt {

// Is this file name one of ckptool's temp files (a run killed outright leaves them)?
bool IsTempFileName(std::string_view name);

// Installs the handlers once; later calls do nothing. SIGBUS (a mapped input truncated by
// another process) also removes temp files and exits with a clear message.
void InstallInterruptHandlers();
// For a process that embeds the engine (the Python package) and keeps its own signal
// handling: InstallInterruptHandlers then does nothing. An interrupt is the embedder's to
// handle; outputs are still only ever put in place whole.
void KeepCallersSignalHandlers();
// Something is about to change in place (a deletion): an interrupt no longer says "nothing was
// changed". Every temp file registered counts as such a change too.
void NoteChanging();

// Returns a slot id, or -1 when all slots are in use (the file is then not auto-removed).
int RegisterTempFile(const std::string& path);
void UnregisterTempFile(int slot);
// A folder this run created: at an interrupt it is removed (rmdir) if it is empty once the
// temp files are gone, innermost first. Unregister it as a file.
int RegisterCreatedFolder(const std::string& path);

// A fresh temp path next to `final_path`.
std::string TempPathFor(const std::string& final_path);

// Removes temp files (and temp folders) for `final_path` left by ckptool processes that no
// longer exist.
// Returns how many were removed.
int RemoveStaleTempFiles(const std::string& final_path);

// Removes every temp entry directly in `dir` (files, and folders such as a killed DCP strip's
// new folder, with what is in them) left by ckptool processes that no longer exist. Returns
// how many were removed.
int RemoveStaleTempsIn(const std::string& dir);

}  // namespace ckpt
