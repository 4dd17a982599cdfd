// The kernel table of the CPU emulator: mslcheck.py appends this header and one MSL_EMU_KERNEL
// line per host_name instantiation to a preprocessed .metal file; emu.cpp runs the table.
// A kernel's signature is the contract's: buffers, `constant P&`, optional
// `threadgroup float* scratch`, then tg, tid, tg_size, lane, simd (all uint).
#pragma once

#undef kernel
#undef thread
#undef device
#undef constant
#undef threadgroup

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

constexpr int kEmuMaxBuffers = 8;

struct EmuBuffer {
  const char* type;  // float, half, bfloat, int, uint
  unsigned elem_size;
  bool is_input;  // `device const T*`
};

using EmuCall = void (*)(void* const* buffers, const void* params, float* scratch, uint tg,
                         uint tid, uint tg_size, uint lane, uint simd);

struct EmuKernel {
  const char* name;
  const char* params_type;  // __PRETTY_FUNCTION__ of emu_type_of<P>: "... [P = SoftmaxParams]"
  unsigned params_size;
  bool has_scratch;
  int num_buffers;
  EmuBuffer buffers[kEmuMaxBuffers];
  EmuCall call;
};

extern const EmuKernel emu_kernels[];
extern const int emu_num_kernels;

template <typename T>
const char* emu_type_of() {
  if constexpr (std::is_same_v<T, float>)
    return "float";
  else if constexpr (std::is_same_v<T, half>)
    return "half";
#if __METAL_VERSION__ >= 310
  else if constexpr (std::is_same_v<T, bfloat>)
    return "bfloat";
#endif
  else if constexpr (std::is_same_v<T, int>)
    return "int";
  else if constexpr (std::is_same_v<T, uint>)
    return "uint";
  else
    return __PRETTY_FUNCTION__;
}

template <auto F>
struct EmuEntry;

template <typename... A, void (*F)(A...)>
struct EmuEntry<F> {
  using Args = std::tuple<A...>;
  static constexpr size_t kArgs = sizeof...(A);
  static_assert(kArgs >= 6, "a kernel takes buffers, params, scratch and 5 thread positions");
  static constexpr bool kScratch = std::is_same_v<std::tuple_element_t<kArgs - 6, Args>, float*>;
  static constexpr size_t kParams = kArgs - 6 - (kScratch ? 1 : 0);
  static constexpr size_t kBuffers = kParams;
  using ParamRef = std::tuple_element_t<kParams, Args>;
  using P = std::remove_cv_t<std::remove_reference_t<ParamRef>>;
  static_assert(std::is_reference_v<ParamRef> && std::is_const_v<std::remove_reference_t<ParamRef>>,
                "the argument after the buffers is `constant Params&`");
  static_assert(kBuffers <= kEmuMaxBuffers, "too many buffers");

  template <size_t I>
  static EmuBuffer buffer() {
    using Ptr = std::tuple_element_t<I, Args>;
    static_assert(std::is_pointer_v<Ptr>, "buffers are `device T*` pointers");
    using T = std::remove_pointer_t<Ptr>;
    return {emu_type_of<std::remove_cv_t<T>>(), sizeof(T), std::is_const_v<T>};
  }

  template <size_t... I>
  static void call_with(std::index_sequence<I...>, void* const* b, const void* p, float* s, uint tg,
                        uint tid, uint n, uint lane, uint simd) {
    if constexpr (kScratch) {
      F(static_cast<std::tuple_element_t<I, Args>>(b[I])..., *static_cast<const P*>(p), s, tg, tid,
        n, lane, simd);
    } else {
      F(static_cast<std::tuple_element_t<I, Args>>(b[I])..., *static_cast<const P*>(p), tg, tid, n,
        lane, simd);
    }
  }

  static void call(void* const* b, const void* p, float* s, uint tg, uint tid, uint n, uint lane,
                   uint simd) {
    call_with(std::make_index_sequence<kBuffers>{}, b, p, s, tg, tid, n, lane, simd);
  }

  template <size_t... I>
  static EmuKernel make(const char* name, std::index_sequence<I...>) {
    return {name, emu_type_of<P>(), sizeof(P), kScratch, int(kBuffers), {buffer<I>()...}, &call};
  }
};

#define MSL_EMU_KERNEL(name, ...) \
  EmuEntry<&__VA_ARGS__>::make(name, std::make_index_sequence<EmuEntry<&__VA_ARGS__>::kBuffers>{})
