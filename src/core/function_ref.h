// FunctionRef<R(Args...)>: a non-owning reference to a callable, two words, never allocates
// (std::function_ref of C++26, llvm::function_ref). For callbacks that only run during the call
// that receives them, such as ThreadPool::parallel_for's chunk function: a std::function built
// from a lambda that captures more than 16 bytes heap-allocates the capture, once per call, and
// a replayed plan must not allocate.
//
// The referenced callable must outlive the FunctionRef; as a by-value parameter bound to a
// lambda written at the call site, it does (the lambda lives until the full expression ends).
#pragma once

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace bev {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): binds like a std::function parameter
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          return std::invoke(*static_cast<std::remove_reference_t<F>*>(object), std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace bev
