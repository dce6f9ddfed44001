// First-use self-checks of CUDA kernels. Kernels written on machines without a GPU check
// themselves where they first run: the first time an op uses its kernel for a configuration (a
// key such as "gated_delta_rule f32 dk=128 dv=128") in a process, it runs the kernel on a small
// random problem, compares with the CPU reference, and caches the decision for that key. After a
// mismatch the op runs its CPU kernel through host copies (slow but correct) for the rest of the
// process, and says so in one line on stderr.
//
// VLM_GPU_SELF_CHECK selects what happens: unset or "on": check, fall back on a mismatch;
// "strict": check, throw on a mismatch (tests, CI on GPU machines); "off": trust the kernels
// without checking; "fallback": never use them (tests of the host path, ruling a kernel out).
// Read at each key's first use.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace vlm::ops_detail {

enum class SelfCheckMode { on, strict, off, fallback };

// VLM_GPU_SELF_CHECK parsed; any other value is an error naming the variable.
SelfCheckMode self_check_mode();

// Measures the kernel: the max-norm relative error of its results against the CPU reference
// (NaN or Inf: a mismatch).
using SelfCheckMeasure = std::function<double()>;

// True when the CUDA kernel of `key` may be used. The first call per key decides, later calls
// return the cached decision without measuring: mode off → true; fallback → false (logged);
// else measure() (an exception
// it throws counts as a mismatch and is quoted), error <= tolerance → true; else, in strict mode,
// throws vlm::Error naming key, error and tolerance (on this and every later call), otherwise
// logs one warning line and returns false. Thread-safe; measure() runs under a lock.
// `fallback` names what runs instead, for those lines.
bool gpu_kernel_passes(const std::string& key, double tolerance, const SelfCheckMeasure& measure,
                       const char* fallback = "the CPU kernel through host copies (slow)");

// max |got - want| / max |want| (max |got - want| when want is all zeros); Inf when a value is
// not finite and differs from the other, or the sizes differ.
double max_rel_error(const std::vector<double>& got, const std::vector<double>& want);

} // namespace vlm::ops_detail
