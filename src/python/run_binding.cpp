// ckptool._core.run: one ckptool command run in this process by the CLI's own code
// (cli/run.h), so that the package's job functions take exactly the CLI's options and
// return its --json report. What the command says goes to buffers of its own thread
// (cli/console.h), never through the process's file descriptors; the GIL is released while it
// runs, and commands in several Python threads run at once.
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/interrupt.h"
#include "cli/command_table.h"
#include "cli/console.h"
#include "cli/progress.h"
#include "cli/run.h"
#include "cluster/steps.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace ckpt::python {

namespace {

// The progress observer of the thread that runs one command, removed whatever happens (it
// refers to the caller's callback, which outlives only this call).
class Observing {
 public:
  explicit Observing(cli::ProgressObserver o) { cli::SetProgressObserver(std::move(o)); }
  ~Observing() { cli::SetProgressObserver(nullptr); }
  Observing(const Observing&) = delete;
  Observing& operator=(const Observing&) = delete;
};

// One command running on a thread of its own, so that the calling thread can wait with the
// GIL released and still answer Ctrl-C: Python runs signal handlers only in the main thread,
// between bytecodes, so the waiting thread wakes every 50 ms to let it (PyErr_CheckSignals).
struct Job {
  std::vector<std::string> argv;
  cli::ProgressObserver observer;
  cli::Captured said;
  InterruptFlag interrupt;
  int rc = 0;
  bool done = false;
  std::mutex mu;
  std::condition_variable cv;

  void Run() {
    {
      cli::Capture capture(&said);
      InterruptScope scope(&interrupt);
      Observing observing(std::move(observer));
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      try {
        cluster::BeginCommand();
        rc = cli::RunCommandLine(static_cast<int>(argv.size()), args.data());
        rc = cluster::Finish(rc);
      } catch (...) {
        // RunCommandLine reports what a command throws; anything else must still end the
        // wait below (and not std::terminate the process from this thread).
        said.errors.push_back("internal error: the command ended with an unknown exception");
        rc = 1;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  }
};

py::list Strings(const std::vector<std::string>& v) {
  py::list out;
  for (const std::string& s : v) out.append(py::bytes(s));
  return out;
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
        auto job = std::make_shared<Job>();
        job->argv.push_back("ckptool");
        job->argv.insert(job->argv.end(), args.begin(), args.end());
        if (!progress.is_none()) {
          // Called on the command's progress thread: takes the GIL for the callback; an
          // exception in it stops the reports (the job goes on). The callback is held by
          // `progress` for the whole call, so the observer (copied and destroyed without the
          // GIL) keeps a plain handle, no reference of its own.
          auto failed = std::make_shared<bool>(false);
          py::handle callback = progress;
          job->observer = [callback, failed](const std::string& label, uint64_t files,
                                             uint64_t done, uint64_t total) {
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
        bool interrupted = false;
        {
          py::gil_scoped_release release;
          std::thread worker([job] { job->Run(); });
          std::unique_lock<std::mutex> lock(job->mu);
          while (!job->done) {
            if (job->cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return job->done; }))
              break;
            if (interrupted) continue;
            lock.unlock();
            {
              py::gil_scoped_acquire gil;
              // A handler that raised (KeyboardInterrupt) leaves its exception set: raised
              // below, once the job has stopped and removed what it had started to write.
              interrupted = PyErr_CheckSignals() != 0;
            }
            if (interrupted) job->interrupt.Raise();
            lock.lock();
          }
          lock.unlock();
          worker.join();
        }
        if (interrupted) throw py::error_already_set();
        return py::make_tuple(job->rc, py::bytes(job->said.out.str()),
                              py::bytes(job->said.err.str()), Strings(job->said.errors),
                              Strings(job->said.warnings));
      },
      py::arg("args"), py::arg("progress") = py::none(),
      "Runs `ckptool ARGS...` in this process, on a thread of its own (several may run at "
      "once); returns (exit code, stdout, stderr, errors, warnings): what the command said, "
      "not the process's output. Ctrl-C stops the job (its temp outputs removed) and raises "
      "KeyboardInterrupt.");
}

}  // namespace ckpt::python
