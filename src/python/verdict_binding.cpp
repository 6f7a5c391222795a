// ckptool._core.judge_pickle: the safety verdict (torch/global_policy.h) of one bare pickle, for
// fuzz/semantic_oracle.py, which checks it against what Python's own unpickler does.
#include <pybind11/stl.h>

#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "pickle/parser.h"
#include "python/bindings.h"
#include "torch/global_lists.h"
#include "torch/global_policy.h"

namespace py = pybind11;

namespace ckpt::python {

namespace {

// Text as Python reads it from the stream: UTF-8 with lone surrogates kept (as _pickle.c does);
// anything else undecodable replaced, so that a verdict always comes back.
py::str Text(std::string_view s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogatepass");
  if (!o) {
    PyErr_Clear();
    o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  }
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::dict Judge(std::string_view data, const std::vector<std::string>& trust) {
  pickle::Limits limits;  // as fuzz/fuzz_pickle.cpp: a fuzzer's input is small
  limits.max_nodes = 1 << 20;
  limits.max_memo = 1 << 20;
  // A refused pickle is judged by what it makes before the opcode torch.load fails on.
  pickle::PartialParse p = pickle::ParsePartial(
      Bytes(reinterpret_cast<const uint8_t*>(data.data()), data.size()), 0, limits);
  const pickle::Graph& g = p.result.graph;
  torch::Trust t;
  t.patterns = trust;
  torch::PickleScan scan = torch::ScanPickle(g, t);
  py::list findings, names, raw, globals;
  for (const torch::UnsafeFinding& f : scan.findings)
    findings.append(Text(torch::ExplainFinding(f)));
  for (const torch::ImportedName& n : scan.names) {
    names.append(py::make_tuple(Text(n.name), torch::VerdictName(n.verdict)));
    raw.append(Text(n.raw));
  }
  // Every global the stream spells, with the name the verdict judged it under.
  for (pickle::NodeId id = 0; id < g.nodes.size(); ++id) {
    if (g.kind(id) != pickle::Kind::kGlobal) continue;
    globals.append(
        py::make_tuple(Text(g.global_module(id)), Text(g.global_name(id)),
                       Text(torch::DisplayGlobal(g.global_module(id), g.global_name(id)))));
  }
  py::dict out;
  out["findings"] = findings;    // ExplainFinding of each, in node order
  out["names"] = names;          // (name, verdict name), sorted by name
  out["raw"] = raw;              // each name as the stream spells it ("__builtin__.set")
  out["globals"] = globals;      // (module, name, the name judged) of every global node
  out["error"] = Text(p.error);  // why torch.load would stop reading; empty if it reads through
  out["effects"] = p.error.empty() ? py::str() : Text(torch::DescribeEffects(g));
  return out;
}

}  // namespace

void BindVerdict(py::module_& m) {
  m.def(
      "judge_pickle",
      [](py::bytes data, const std::vector<std::string>& trust) {
        return Judge(std::string_view(data), trust);
      },
      py::arg("data"), py::arg("trust") = std::vector<std::string>());
}

}  // namespace ckpt::python
