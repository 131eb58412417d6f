// The engine's float mode: flushing denormal floats to zero inside a scope, on the calling thread,
// and the standard rounding mode on every thread that runs engine kernels.
//
// The gated delta rule multiplies by decays e^{Γ} that reach 1e-40 and below within a chunk on
// heads with strong forgetting, and the state keeps what they leave: operations on such denormal
// values take a microcode assist (~100+ cycles each on Intel cores). On the bench model this was a
// quarter of prefill (143 → 188 tok/s with the flush). Flushing changes only values below
// 1.2e-38 (float) / 2.2e-308 (double), set against terms of order one, and it is set per call,
// not per thread: every chunk of a parallel section computes under the same mode, so results
// stay independent of which thread ran them.
#pragma once

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace kiln::engine::cpu {

// Sets the calling thread's MXCSR from its current value for a scope, and restores it after.
class MxcsrScope {
 public:
#if defined(__x86_64__)
  template <class Mode>
  explicit MxcsrScope(Mode mode) : saved_(_mm_getcsr()) { _mm_setcsr(mode(saved_)); }
  ~MxcsrScope() { _mm_setcsr(saved_); }
#else
  template <class Mode>
  explicit MxcsrScope(Mode) {}
#endif
  MxcsrScope(const MxcsrScope&) = delete;
  MxcsrScope& operator=(const MxcsrScope&) = delete;

 private:
#if defined(__x86_64__)
  unsigned saved_;
#endif
};

class FlushDenormalsScope : MxcsrScope {
 public:
  FlushDenormalsScope() : MxcsrScope([](unsigned mode) { return mode | kFlushToZero | kDenormalsAreZero; }) {}

 private:
  static constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;  // MXCSR bits
};

// Round to nearest, every exception masked, no flushing: the x86-64 default MXCSR. Kernels
// assume it (quantizers round, the definition's sums round to nearest), and a session's results
// must not depend on which thread computed them: the scheduler thread and the pool workers set
// it when they start, and work that repeats on a session thread what the scheduler computed (a
// GDN replay) runs under EngineFloatModeScope, whatever mode an embedder left on that thread.
inline constexpr unsigned kEngineMxcsr = 0x1f80;
#if defined(__x86_64__)
inline void set_engine_float_mode() { _mm_setcsr(kEngineMxcsr); }
#else
inline void set_engine_float_mode() {}
#endif

class EngineFloatModeScope : MxcsrScope {
 public:
  EngineFloatModeScope() : MxcsrScope([](unsigned) { return kEngineMxcsr; }) {}
};

}  // namespace kiln::engine::cpu
