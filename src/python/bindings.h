// The extension module ckptool._core (python/ckptool): the engine seen from Python. Each
// part registers itself on the module; the package's Python code shapes what they return.
#pragma once

#include <pybind11/pybind11.h>

namespace ckpt::python {

// Raised for every ckpt::Error; the package turns it into its ckptool.Error subclasses.
pybind11::object CoreError();

void BindCheckpoint(pybind11::module_& m);  // Checkpoint: checkpoint/opened_checkpoint.h
void BindLoad(pybind11::module_& m);        // load_graph: a torch pickle as Python objects
void BindRun(pybind11::module_& m);         // run: a ckptool command, in this process
void BindVerdict(pybind11::module_& m);     // judge_pickle: the safety verdict of a bare pickle

}  // namespace ckpt::python
