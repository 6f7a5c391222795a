#include "base/interrupt.h"

namespace ckpt::interrupt_detail {
thread_local const InterruptFlag* t_flag = nullptr;
}  // namespace ckpt::interrupt_detail
