// ckptool._core.run: one ckptool command run in this process by the CLI's own code
// (cli/run.h), so that the package's job functions take exactly the CLI's options and
// return its --json report. What the command prints (file descriptors 1 and 2) is captured and
// returned; the GIL is released while it runs; one command runs at a time.
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "cli/command_table.h"
#include "cli/progress.h"
#include "cli/run.h"
#include "cluster/steps.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace ckpt::python {

namespace {

std::string ReadAll(std::FILE* f) {
  std::string out;
  std::rewind(f);
  char buf[1 << 14];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  return out;
}

// Points file descriptor `fd` at `to` until destroyed.
class Redirect {
 public:
  Redirect(int fd, std::FILE* to) : fd_(fd), saved_(::dup(fd)) {
    if (saved_ < 0 || ::dup2(::fileno(to), fd) < 0) Fail("cannot capture output: {}", fd);
  }
  ~Redirect() {
    ::dup2(saved_, fd_);
    ::close(saved_);
  }
  Redirect(const Redirect&) = delete;
  Redirect& operator=(const Redirect&) = delete;

 private:
  int fd_, saved_;
};

struct TempFile {
  std::FILE* f = std::tmpfile();
  ~TempFile() {
    if (f) std::fclose(f);
  }
};

// The progress observer for one command, removed whatever happens (it refers to the
// caller's callback, which outlives only this call).
class Observing {
 public:
  explicit Observing(cli::ProgressObserver o) { cli::SetProgressObserver(std::move(o)); }
  ~Observing() { cli::SetProgressObserver(nullptr); }
  Observing(const Observing&) = delete;
  Observing& operator=(const Observing&) = delete;
};

void FlushAll() {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(stdout);
  std::fflush(stderr);
}

}  // namespace

void BindRun(py::module_& m) {
  m.def(
      "commands",
      [] {
        py::list out;
        for (const cli::CommandInfo& c : cli::Commands())
          out.append(py::make_tuple(c.name, c.help));
        return out;
      },
      "Every ckptool command as (name, one-line help), from the CLI's own table.");
  m.def(
      "command_options",
      [](const std::string& name) {
        const cli::CommandInfo* info = cli::FindCommand(name);
        if (!info) throw py::value_error("no ckptool command '" + name + "'");
        CLI::App app;
        cli::Runner unused = info->add(app);
        py::list out;
        for (const CLI::Option* o : app.get_options()) {
          if (o->get_lnames().empty()) continue;  // positionals (the paths) and -h
          if (o->get_lnames().front() == "help") continue;
          py::list names;  // --output, --to: either keyword
          for (std::string key : o->get_lnames()) {
            for (char& ch : key) ch = ch == '-' ? '_' : ch;
            names.append(key);
          }
          py::dict d;
          d["name"] = names[0];
          d["names"] = names;
          d["flag"] = o->get_type_size_max() == 0 || o->get_items_expected_max() == 0;
          d["multi"] = o->get_items_expected_max() > 1 ||
                       o->get_multi_option_policy() == CLI::MultiOptionPolicy::TakeAll;
          d["type"] = o->get_type_name();
          d["required"] = o->get_required();
          d["help"] = o->get_description();
          d["default"] = o->get_default_str();
          out.append(d);
        }
        return out;
      },
      py::arg("name"),
      "The options of a ckptool command, as its command line declares them: name (the keyword "
      "argument), names (it and its aliases), flag, multi (takes several values), type, "
      "required, help, default.");
  m.def(
      "run",
      [](const std::vector<std::string>& args, py::object progress) {
        static std::mutex one_at_a_time;
        cli::ProgressObserver observer;
        if (!progress.is_none()) {
          // Called on the command's progress thread: takes the GIL for the callback; an
          // exception in it stops the reports (the job goes on). The callback is held by
          // `progress` for the whole call, so the observer (copied and destroyed without the
          // GIL) keeps a plain handle, no reference of its own.
          auto failed = std::make_shared<bool>(false);
          py::handle callback = progress;
          observer = [callback, failed](const std::string& label, uint64_t files, uint64_t done,
                                        uint64_t total) {
            if (*failed) return;
            py::gil_scoped_acquire gil;
            try {
              callback(label, files, done, total);
            } catch (py::error_already_set& e) {
              *failed = true;
              e.discard_as_unraisable("ckptool progress callback");
            }
          };
        }
        TempFile out, err;
        if (!out.f || !err.f) Fail("cannot capture output: no temp file");
        int rc = 0;
        {
          py::gil_scoped_release release;
          std::lock_guard<std::mutex> lock(one_at_a_time);
          std::vector<std::string> owned{"ckptool"};
          owned.insert(owned.end(), args.begin(), args.end());
          std::vector<char*> argv;
          for (std::string& a : owned) argv.push_back(a.data());
          argv.push_back(nullptr);
          FlushAll();
          {
            Redirect o(1, out.f), e(2, err.f);
            Observing observing(std::move(observer));
            cluster::BeginCommand();
            rc = cli::RunCommandLine(static_cast<int>(owned.size()), argv.data());
            rc = cluster::Finish(rc);
            FlushAll();
          }
        }
        return py::make_tuple(rc, py::bytes(ReadAll(out.f)), py::bytes(ReadAll(err.f)));
      },
      py::arg("args"), py::arg("progress") = py::none(),
      "Runs `ckptool ARGS...` in this process; returns (exit code, stdout, stderr).");
}

}  // namespace ckpt::python
