// Exceptions (e.g. the tile emulator's #GP/#UD, a bad expert id) must not cross an OpenMP region:
// each task runs under guard(), the first exception is kept and rethrown after the region.
// Included by the drivers only (ops/moe_ffn.cpp, ops/linear.cpp), never by an ISA-flagged file.
#pragma once
#include <exception>
#include <mutex>

namespace hina {

class FirstError {
 public:
  template <class F>
  void guard(F&& fn) {
    try { fn(); } catch (...) {
      std::lock_guard<std::mutex> g(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
  void rethrow() const { if (error_) std::rethrow_exception(error_); }

 private:
  std::exception_ptr error_;
  std::mutex mutex_;
};

}  // namespace hina
