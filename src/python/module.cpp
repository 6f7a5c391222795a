// ckptool._core: the engine for the Python package (python/ckptool).
#include <filesystem>

#include "base/error.h"
#include "io/temp_files.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace ckpt::python {

namespace {
py::object* g_error = nullptr;  // lives as long as the interpreter (never freed: see below)
}  // namespace

py::object CoreError() {
  return *g_error;
}

}  // namespace ckpt::python

PYBIND11_MODULE(_core, m) {
  m.doc() = "ckptool's engine (use the ckptool package, not this module)";
  // Held for the life of the process: a py::object destroyed at exit, after the interpreter,
  // would touch freed state.
  ckpt::python::g_error = new py::object(py::exception<ckpt::Error>(m, "CoreError"));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ckpt::Error& e) {
      PyErr_SetString(ckpt::python::g_error->ptr(), e.what());
    } catch (const std::filesystem::filesystem_error& e) {
      std::string what = e.path1().string() + ": " + e.code().message();
      PyErr_SetString(ckpt::python::g_error->ptr(), what.c_str());
    }
  });
  // Python keeps its own SIGINT handling: a job runs to its end (outputs are put in place
  // whole or not at all) and KeyboardInterrupt is raised when it returns.
  ckpt::KeepCallersSignalHandlers();
  ckpt::python::BindCheckpoint(m);
  ckpt::python::BindLoad(m);
  ckpt::python::BindRun(m);
  ckpt::python::BindVerdict(m);
}
