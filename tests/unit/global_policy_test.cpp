#include "torch/global_policy.h"

#include <gtest/gtest.h>

namespace ckpt::torch {
namespace {

TEST(GlobalPolicy, FlagsCodeExecutionAndSystemAccess) {
  for (auto [m, n] : std::vector<std::pair<const char*, const char*>>{
           {"os", "system"}, {"posix", "system"}, {"nt", "system"}, {"subprocess", "Popen"},
           {"builtins", "eval"}, {"__builtin__", "exec"}, {"builtins", "getattr"},
           {"importlib", "import_module"}, {"importlib.util", "find_spec"}, {"runpy", "run_path"},
           {"ctypes", "CDLL"}, {"socket", "socket"}, {"pickle", "loads"}, {"marshal", "loads"},
           {"shutil", "rmtree"}, {"webbrowser", "open"}, {"torch.hub", "load"}}) {
    EXPECT_EQ(ClassifyGlobal(m, n), GlobalClass::kUnsafe) << m << "." << n;
  }
}

TEST(GlobalPolicy, OrdinaryClassesAreListedNotFlagged) {
  for (auto [m, n] : std::vector<std::pair<const char*, const char*>>{
           {"argparse", "Namespace"}, {"numpy.core.multiarray", "_reconstruct"},
           {"numpy", "dtype"}, {"pytorch_lightning.utilities.parsing", "AttributeDict"},
           {"deepspeed.runtime.fp16.loss_scaler", "LossScaler"}, {"ossify", "x"},
           {"builtins", "slice"}}) {
    EXPECT_EQ(ClassifyGlobal(m, n), GlobalClass::kOther) << m << "." << n;
  }
}

TEST(GlobalPolicy, TorchAllowlist) {
  for (auto [m, n] : std::vector<std::pair<const char*, const char*>>{
           {"torch._utils", "_rebuild_tensor_v2"}, {"torch", "FloatStorage"},
           {"torch", "BFloat16Storage"}, {"collections", "OrderedDict"}, {"torch", "bfloat16"},
           {"torch.nn.parameter", "Parameter"}, {"torch", "Size"}, {"__builtin__", "set"}}) {
    EXPECT_EQ(ClassifyGlobal(m, n), GlobalClass::kTorchAllowed) << m << "." << n;
  }
}

}  // namespace
}  // namespace ckpt::torch
