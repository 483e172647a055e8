// Exceptions inside the driver's OpenMP region (ops/moe_ffn.cpp, ops/numa_partition.cpp).
#pragma once
#include <exception>
#include <mutex>

namespace hina {

// An exception must not cross an OpenMP region: every task runs under guard(), the first exception
// is kept (later ones dropped) and rethrown once the region has ended.
class FirstError {
 public:
  template <class F>
  void guard(F&& fn) noexcept {
    try {
      fn();
    } catch (...) {
      std::lock_guard<std::mutex> g(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
  std::mutex mutex_;
};

}  // namespace hina
