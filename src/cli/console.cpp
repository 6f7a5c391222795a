#include "cli/console.h"

#include <cstdio>
#include <iostream>

#include "base/utf8.h"

namespace ckpt::cli {

namespace {
thread_local Captured* t_captured = nullptr;
}  // namespace

std::ostream& Out() {
  return t_captured ? static_cast<std::ostream&>(t_captured->out) : std::cout;
}

std::ostream& Err() {
  return t_captured ? static_cast<std::ostream&>(t_captured->err) : std::cerr;
}

bool Capturing() {
  return t_captured != nullptr;
}

Capture::Capture(Captured* into) : saved_(t_captured) {
  t_captured = into;
}

Capture::~Capture() {
  t_captured = saved_;
}

void SayError(const std::string& message) {
  if (t_captured) {
    t_captured->errors.push_back(message);
    return;
  }
  std::cout.flush();
  std::fflush(stdout);
  std::fprintf(stderr, "ckptool: error: %s\n", Printable(message).c_str());
}

void SayWarning(const std::string& message) {
  if (t_captured) {
    t_captured->warnings.push_back(message);
    return;
  }
  std::cout.flush();
  std::fflush(stdout);
  std::fprintf(stderr, "ckptool: warning: %s\n", Printable(message).c_str());
}

}  // namespace ckpt::cli
