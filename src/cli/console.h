// Where a command's words go. On the command line: stdout (reports) and stderr (errors,
// warnings, notes). For a command run by the Python package: buffers of the thread that runs
// it, with errors and warnings kept apart as messages, so that nothing of the process's own
// output (another thread's prints, the interpreter's) is taken or lost, and several commands
// may run at once, each in its own thread.
#pragma once

#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace ckpt::cli {

// What one command said while its thread was captured.
struct Captured {
  std::ostringstream out;             // the report (text or JSON)
  std::ostringstream err;             // other lines meant for stderr
  std::vector<std::string> errors;    // PrintError's messages, without "ckptool: error: "
  std::vector<std::string> warnings;  // PrintWarning's messages
};

// The calling thread's stdout and stderr: std::cout and std::cerr, or the buffers of a
// capture.
std::ostream& Out();
std::ostream& Err();
// Whether the calling thread is captured (a command run in-process: there is no terminal to
// draw progress on and no standard output to write an archive to).
bool Capturing();

// Sends the calling thread's words to `into` until destroyed.
class Capture {
 public:
  explicit Capture(Captured* into);
  ~Capture();
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

 private:
  Captured* saved_;
};

// Records an error or warning: into the capture, or on stderr as "ckptool: error: ..." (the
// caller has decided to print it; see PrintError in commands.h).
void SayError(const std::string& message);
void SayWarning(const std::string& message);

}  // namespace ckpt::cli
