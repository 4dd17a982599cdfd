// CPU emulator of MSL compute kernels (test infrastructure). Runs each threadgroup with one
// ucontext fiber per thread; a fiber runs until it reaches threadgroup_barrier or a simd_*
// function (the scheduling points), in forward or reverse thread order. Reports as errors (exit
// status 3): a barrier that not every thread of the threadgroup reaches (or different barriers),
// and a simd_* call that the live lanes of a SIMD group do not all make at the same place
// (stricter than MSL, which runs such a call over the active lanes: no kernel here needs that).
// Threadgroup memory is poisoned with NaN before each threadgroup. Device buffers and the scratch
// are malloc'd at their exact sizes, so ASan sees every out-of-bounds access.
//
//   runner list                      one line per kernel: name params_type params_size scratch
//                                    buffer types (const ones prefixed "in:")
//   runner run NAME ORDER GRID TG_SIZE SCRATCH_BYTES PARAMS_FILE BUFFER_FILE...
//                                    ORDER: fwd, or rev (threads and threadgroups in reverse
//                                    order); writes the non-const buffers back
#include "msl_shim.h"
// msl_shim.h first: emu.h undoes its keyword macros before the standard headers.
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "emu.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif
#endif

namespace {

constexpr uint kSimdWidth = 32;
constexpr size_t kStackBytes = 256 * 1024;

enum class State { kReady, kBarrier, kSimd, kDone };
enum class SimdOp { kSumF, kMaxF, kXorF, kSumI, kMaxI, kSumU, kMaxU };

union Value {
  float f;
  int i;
  uint u;
};

struct Fiber {
  ucontext_t ctx;
  char* stack = nullptr;  // kStackBytes, mapped lazily (1024 fibers touch little of it)
  State state = State::kDone;
  const void* site = nullptr;  // return address of the barrier / simd call it waits at
  SimdOp op = SimdOp::kSumF;
  Value in{}, out{};
  ushort mask = 0;
  void* fake_stack = nullptr;  // ASan's fake stack while switched away
};

struct Launch {
  const EmuKernel* kernel;
  void* const* buffers;
  const void* params;
  float* scratch;
  uint tg, tg_size;
};

ucontext_t g_sched;
std::vector<Fiber> g_fibers;
uint g_current;
const Launch* g_launch;
const void* g_sched_stack_bottom;
size_t g_sched_stack_size;

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "emu: threadgroup %u: %s\n", g_launch ? g_launch->tg : 0, msg.c_str());
  std::fflush(stderr);
  std::_Exit(3);
}

// Switches from the current fiber back to the scheduler; `finished` frees ASan's fake stack.
void to_scheduler(bool finished) {
  Fiber& f = g_fibers[g_current];
#ifdef EMU_ASAN
  __sanitizer_start_switch_fiber(finished ? nullptr : &f.fake_stack, g_sched_stack_bottom,
                                 g_sched_stack_size);
#endif
  swapcontext(&f.ctx, &g_sched);
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(f.fake_stack, &g_sched_stack_bottom, &g_sched_stack_size);
#endif
}

void fiber_main() {
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g_sched_stack_bottom, &g_sched_stack_size);
#endif
  const Launch& l = *g_launch;
  const uint tid = g_current;
  l.kernel->call(l.buffers, l.params, l.scratch, l.tg, tid, l.tg_size, tid % kSimdWidth,
                 tid / kSimdWidth);
  g_fibers[tid].state = State::kDone;
  to_scheduler(true);
}

void run_fiber(uint t) {
  g_current = t;
  Fiber& f = g_fibers[t];
#ifdef EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack, kStackBytes);
#endif
  swapcontext(&g_sched, &f.ctx);
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

std::string list_threads(const std::vector<uint>& ts) {
  std::string s;
  for (size_t i = 0; i < ts.size() && i < 8; ++i) s += (i ? "," : "") + std::to_string(ts[i]);
  if (ts.size() > 8) s += ",... (" + std::to_string(ts.size()) + " threads)";
  return s;
}

// All live lanes of SIMD group g wait at a simd_* call: computes every lane's result.
void resolve_simd(uint first, uint last) {
  std::vector<uint> live;
  for (uint t = first; t < last; ++t) {
    if (g_fibers[t].state != State::kDone) live.push_back(t);
  }
  const Fiber& f0 = g_fibers[live[0]];
  for (uint t : live) {
    const Fiber& f = g_fibers[t];
    if (f.state != State::kSimd || f.site != f0.site || f.op != f0.op) {
      fail("divergent simd_* call: lanes of SIMD group " + std::to_string(first / kSimdWidth) +
           " are not all at the same simd_* call (threads " + list_threads(live) + ")");
    }
  }
  Value acc = f0.in;
  for (size_t k = 1; k < live.size(); ++k) {
    const Value v = g_fibers[live[k]].in;
    switch (f0.op) {
      case SimdOp::kSumF:
        acc.f += v.f;
        break;
      case SimdOp::kMaxF:
        acc.f = std::fmax(acc.f, v.f);
        break;
      case SimdOp::kSumI:
        acc.i += v.i;
        break;
      case SimdOp::kMaxI:
        acc.i = std::max(acc.i, v.i);
        break;
      case SimdOp::kSumU:
        acc.u += v.u;
        break;
      case SimdOp::kMaxU:
        acc.u = std::max(acc.u, v.u);
        break;
      case SimdOp::kXorF:
        break;
    }
  }
  for (uint t : live) {
    Fiber& f = g_fibers[t];
    if (f0.op == SimdOp::kXorF) {
      const uint src = first + ((t - first) ^ f.mask);
      if (src >= last || g_fibers[src].state == State::kDone) {
        fail("simd_shuffle_xor from inactive lane " + std::to_string(src));
      }
      f.out = g_fibers[src].in;
    } else {
      f.out = acc;
    }
    f.state = State::kReady;
  }
}

void run_threadgroup(const Launch& l, bool reverse) {
  g_launch = &l;
  const uint n = l.tg_size;
  for (uint t = 0; t < n; ++t) {
    Fiber& f = g_fibers[t];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
    f.state = State::kReady;
  }
  for (;;) {
    for (uint k = 0; k < n; ++k) {
      const uint t = reverse ? n - 1 - k : k;
      if (g_fibers[t].state == State::kReady) run_fiber(t);
    }
    // Every fiber now waits at a scheduling point or is done.
    bool simd_waiting = false;
    std::vector<uint> at_barrier, done;
    for (uint t = 0; t < n; ++t) {
      const State s = g_fibers[t].state;
      if (s == State::kSimd) simd_waiting = true;
      if (s == State::kBarrier) at_barrier.push_back(t);
      if (s == State::kDone) done.push_back(t);
    }
    if (done.size() == n) return;
    if (simd_waiting) {
      for (uint g = 0; g < n; g += kSimdWidth) {
        const uint last = std::min(g + kSimdWidth, n);
        for (uint t = g; t < last; ++t) {
          if (g_fibers[t].state == State::kSimd) {
            resolve_simd(g, last);
            break;
          }
        }
      }
      continue;
    }
    if (!done.empty()) {
      fail("divergent barrier: threads " + list_threads(at_barrier) +
           " wait at a threadgroup_barrier that threads " + list_threads(done) +
           " returned without reaching");
    }
    for (uint t : at_barrier) {
      if (g_fibers[t].site != g_fibers[at_barrier[0]].site) {
        fail("divergent barrier: threads " + std::to_string(at_barrier[0]) + " and " +
             std::to_string(t) + " wait at different threadgroup_barrier calls");
      }
    }
    for (uint t : at_barrier) g_fibers[t].state = State::kReady;
  }
}

Value simd_call(SimdOp op, Value v, const void* site, ushort mask = 0) {
  Fiber& f = g_fibers[g_current];
  f.state = State::kSimd;
  f.op = op;
  f.in = v;
  f.site = site;
  f.mask = mask;
  to_scheduler(false);
  return f.out;
}

std::vector<char> read_file(const char* path) {
  FILE* fp = std::fopen(path, "rb");
  if (!fp) fail(std::string("cannot read ") + path);
  std::vector<char> data;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, fp)) > 0) data.insert(data.end(), buf, buf + got);
  std::fclose(fp);
  return data;
}

const EmuKernel* find_kernel(const char* name) {
  for (int k = 0; k < emu_num_kernels; ++k) {
    if (std::strcmp(emu_kernels[k].name, name) == 0) return &emu_kernels[k];
  }
  fail(std::string("no kernel named ") + name);
}

int run(int argc, char** argv) {
  if (argc < 8) fail("usage: run NAME ORDER GRID TG_SIZE SCRATCH_BYTES PARAMS_FILE BUFFER_FILE...");
  const EmuKernel* k = find_kernel(argv[2]);
  const bool reverse = std::strcmp(argv[3], "rev") == 0;
  const uint grid = uint(std::atoi(argv[4])), tg_size = uint(std::atoi(argv[5]));
  const size_t scratch_bytes = size_t(std::atoll(argv[6]));
  const std::vector<char> params = read_file(argv[7]);
  if (params.size() != k->params_size) fail("params file size != sizeof(params)");
  if (argc - 8 != k->num_buffers) fail("wrong number of buffer files");
  if (tg_size == 0 || tg_size > 1024) fail("threads_per_threadgroup must be 1..1024");
  if (k->has_scratch != (scratch_bytes > 0)) fail("scratch given iff the kernel takes one");
  // Exact-size heap copies: ASan reports any access past their ends.
  std::vector<void*> buffers(k->num_buffers);
  std::vector<size_t> sizes(k->num_buffers);
  for (int b = 0; b < k->num_buffers; ++b) {
    const std::vector<char> data = read_file(argv[8 + b]);
    sizes[b] = data.size();
    buffers[b] = std::malloc(data.size() ? data.size() : 1);
    std::memcpy(buffers[b], data.data(), data.size());
  }
  void* params_copy = std::malloc(params.size());
  std::memcpy(params_copy, params.data(), params.size());
  float* scratch = scratch_bytes ? static_cast<float*>(std::malloc(scratch_bytes)) : nullptr;
  g_fibers.resize(tg_size);
  void* stacks = mmap(nullptr, tg_size * kStackBytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (stacks == MAP_FAILED) fail("cannot map the fiber stacks");
  for (uint t = 0; t < tg_size; ++t)
    g_fibers[t].stack = static_cast<char*>(stacks) + t * kStackBytes;
  for (uint g = 0; g < grid; ++g) {
    const uint tg = reverse ? grid - 1 - g : g;  // a result that depends on it is a race
    for (size_t i = 0; i < scratch_bytes / sizeof(float); ++i) scratch[i] = NAN;
    const Launch l{k, buffers.data(), params_copy, scratch, tg, tg_size};
    run_threadgroup(l, reverse);
  }
  for (int b = 0; b < k->num_buffers; ++b) {
    if (k->buffers[b].is_input) continue;
    FILE* fp = std::fopen(argv[8 + b], "wb");
    if (!fp || std::fwrite(buffers[b], 1, sizes[b], fp) != sizes[b]) fail("cannot write output");
    std::fclose(fp);
  }
  for (void* b : buffers) std::free(b);
  std::free(params_copy);
  std::free(scratch);
  return 0;
}

}  // namespace

namespace metal {

void threadgroup_barrier(mem_flags) {
  Fiber& f = g_fibers[g_current];
  f.state = State::kBarrier;
  f.site = __builtin_return_address(0);
  to_scheduler(false);
}

#define EMU_SIMD(ret, name, field, op)                                  \
  ret name(ret x) {                                                     \
    Value v;                                                            \
    v.field = x;                                                        \
    return simd_call(SimdOp::op, v, __builtin_return_address(0)).field; \
  }
EMU_SIMD(float, simd_sum, f, kSumF)
EMU_SIMD(float, simd_max, f, kMaxF)
EMU_SIMD(int, simd_sum, i, kSumI)
EMU_SIMD(int, simd_max, i, kMaxI)
EMU_SIMD(uint, simd_sum, u, kSumU)
EMU_SIMD(uint, simd_max, u, kMaxU)
#undef EMU_SIMD

float simd_shuffle_xor(float x, ushort mask) {
  Value v;
  v.f = x;
  return simd_call(SimdOp::kXorF, v, __builtin_return_address(0), mask).f;
}

}  // namespace metal

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "list") == 0) {
    for (int k = 0; k < emu_num_kernels; ++k) {
      const EmuKernel& e = emu_kernels[k];
      std::printf("%s\t%s\t%u\t%d", e.name, e.params_type, e.params_size, int(e.has_scratch));
      for (int b = 0; b < e.num_buffers; ++b) {
        std::printf("\t%s%s", e.buffers[b].is_input ? "in:" : "", e.buffers[b].type);
      }
      std::printf("\n");
    }
    return 0;
  }
  if (argc >= 2 && std::strcmp(argv[1], "run") == 0) return run(argc, argv);
  fail("usage: runner list | runner run ...");
}
