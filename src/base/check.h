// Errors: VLM_CHECK(cond, msg...) throws vlm::Error carrying file:line, the failed
// condition and a message streamed from the arguments. Library code throws; main()
// catches once. VLM_LIB_CHECK is the generic form for C libraries that return status
// codes (CUDA, cuBLAS, cuDNN, NCCL, MPI, HDF5 instantiate it).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace vlm {

class Error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

namespace detail {

template <typename... Args> std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void throw_error(const char* file, int line, const char* cond, const std::string& msg);

} // namespace detail
} // namespace vlm

#define VLM_CHECK(cond, ...)                                                                       \
  do {                                                                                             \
    if (!(cond)) [[unlikely]]                                                                      \
      ::vlm::detail::throw_error(__FILE__, __LINE__, #cond, ::vlm::detail::str_cat(__VA_ARGS__));  \
  } while (0)

#define VLM_FAIL(...)                                                                              \
  ::vlm::detail::throw_error(__FILE__, __LINE__, nullptr, ::vlm::detail::str_cat(__VA_ARGS__))

// status_expr is evaluated once; ok_value is the library's success code; error_string(status)
// must turn the status into text.
#define VLM_LIB_CHECK(lib, status_expr, ok_value, error_string)                                    \
  do {                                                                                             \
    auto vlm_status_ = (status_expr);                                                              \
    if (vlm_status_ != (ok_value)) [[unlikely]]                                                    \
      ::vlm::detail::throw_error(                                                                  \
          __FILE__, __LINE__, #status_expr,                                                        \
          ::vlm::detail::str_cat(lib, " error: ", error_string(vlm_status_)));                     \
  } while (0)
